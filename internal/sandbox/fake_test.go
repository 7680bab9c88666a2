package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"github.com/airlock-sandbox/airlock/internal/workspace"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil/memlog"
)

// The fakes of the long-lived lifecycle's tests (lifecycle_test.go): a
// clock the test moves, a host that makes sandboxes in memory, each with a
// minimal agent on a unix socket, and a rig that wires them into a
// Service with a real store and an audit log in memory.

// memAudit is an audit log in memory.
type memAudit = memlog.Log

// fakeClock is the service's clock; only the test moves it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// newFakeClock starts on a whole second: the store keeps milliseconds.
func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fakeAgent is the agent of a fake sandbox: it answers hello with its
// protocol, and reads every file as its path; while its sandbox is
// frozen it answers nothing (the real one hangs; this one says so at
// once).
type fakeAgent struct {
	agentpbconnect.UnimplementedAgentHandler
	protocol uint32
	in       *fakeHost
}

func (a fakeAgent) frozen() error {
	if a.in.isPaused() {
		return connect.NewError(connect.CodeUnavailable, errors.New("frozen: no answer"))
	}
	return nil
}

func (a fakeAgent) Hello(context.Context, *connect.Request[agentpb.HelloRequest]) (*connect.Response[agentpb.HelloResponse], error) {
	if err := a.frozen(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&agentpb.HelloResponse{Protocol: a.protocol}), nil
}

func (a fakeAgent) ReadFile(_ context.Context, req *connect.Request[agentpb.ReadFileRequest], st *connect.ServerStream[agentpb.ReadFileResponse]) error {
	a.in.mu.Lock()
	seen := a.in.onRead
	a.in.mu.Unlock()
	if seen != nil {
		seen()
	}
	if err := a.frozen(); err != nil {
		return err
	}
	return st.Send(&agentpb.ReadFileResponse{Data: []byte(req.Msg.GetPath())})
}

// fakeBackend is a host that makes and adopts sandboxes in memory.
type fakeBackend struct {
	t *testing.T
	// gate, when set, holds every Create until it is closed or the
	// create's context ends, after saying so on started.
	gate    chan struct{}
	started chan string

	mu   sync.Mutex
	made map[string]*fakeHost // created or adopted, by sandbox id
	// left is what an earlier daemon left running, by sandbox id: Adopt
	// takes it, anything else is not adoptable.
	left      map[string]*fakeHost
	longLived []string
	discarded []string
	// snap, when set, is what every sandbox's Snapshot saves (its
	// SnapshotPaths are under /snap); failCreate, when set, fails the
	// creates it says yes to (by their order, from 1). removed lists the
	// snapshot files removed.
	snap       *lifecycle.SnapshotFiles
	failCreate func(n int) bool
	creates    int
	removed    []string
	// ends is what the sandboxes it made were told, in order: "kill",
	// "destroy".
	ends []string
}

func newFakeBackend(t *testing.T) *fakeBackend {
	return &fakeBackend{t: t, started: make(chan string, 16), made: map[string]*fakeHost{}, left: map[string]*fakeHost{}}
}

func (f *fakeBackend) Create(ctx context.Context, id string, _ *spec.Spec, _ func(eventlog.Event)) (Host, error) {
	if f.gate != nil {
		f.started <- id
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	f.mu.Lock()
	f.creates++
	fail := f.failCreate != nil && f.failCreate(f.creates)
	f.mu.Unlock()
	if fail {
		return nil, errors.New("the fake host fails this create")
	}
	in := newFakeHost(f.t, AgentProtocol)
	in.snap = f.snap
	in.log = func(what string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.ends = append(f.ends, what)
	}
	f.mu.Lock()
	f.made[id] = in
	f.mu.Unlock()
	return in, nil
}

func (f *fakeBackend) Adopt(_ context.Context, id string, _ *spec.Spec, pid int, _ func(eventlog.Event)) (Host, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.left[id]
	if !ok || in.pid != pid {
		return nil, fmt.Errorf("init %d of sandbox %s is gone", pid, id)
	}
	f.made[id] = in
	return in, nil
}

// leave makes a sandbox that an earlier daemon left on the host, with an
// agent speaking protocol; frozen when paused.
func (f *fakeBackend) leave(id string, pid int, protocol uint32, paused bool) *fakeHost {
	in := newFakeHost(f.t, protocol)
	in.pid, in.paused = pid, paused
	f.mu.Lock()
	f.left[id] = in
	f.longLived = append(f.longLived, id)
	f.mu.Unlock()
	return in
}

func (f *fakeBackend) SnapshotPaths(id string) (string, string, error) {
	if f.snap == nil {
		return "", "", errors.New("the fake host keeps no snapshots")
	}
	return "/snap/" + id + "/root", "/snap/" + id + "/workspace", nil
}

func (f *fakeBackend) RemoveSnapshot(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, id)
	return nil
}

func (f *fakeBackend) SnapshotHasMemory(string) bool { return false }

func (f *fakeBackend) RemoveCheckpoint(string) error { return nil }

func (f *fakeBackend) Discard(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.discarded = append(f.discarded, id)
	return nil
}

func (f *fakeBackend) LongLived() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.longLived)
}

func (f *fakeBackend) CheckHostPaths(*spec.Spec) error { return nil }

func (f *fakeBackend) sandbox(t *testing.T, id string) *fakeHost {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	in := f.made[id]
	if in == nil {
		t.Fatalf("the host made no sandbox %s", id)
	}
	return in
}

// count is how many sandboxes the host made or adopted.
func (f *fakeBackend) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.made)
}

func (f *fakeBackend) discards() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(slices.Values(f.discarded))
}

// fakeHost is one sandbox of a fakeBackend.
type fakeHost struct {
	pid    int
	socket string
	srv    *http.Server
	done   chan struct{}
	exit   sync.Once // closes done

	mu          sync.Mutex
	usage       lifecycle.Usage
	paused      bool
	failPause   error // what Pause answers (nil: it works)
	failResume  error // what Resume answers (nil: it works)
	destroyed   bool
	released    bool
	failDestroy error // what Destroy answers (nil: it works)

	snap *lifecycle.SnapshotFiles // what Snapshot saves (nil: it fails)
	// onRead, when set, is told of every file read its agent is asked.
	onRead func()

	// hold, when set, stops Destroy, after it says so on destroying,
	// until it is closed: a sandbox held while it ends.
	hold, destroying chan struct{}
	// log is told of each Kill ("kill") and Destroy ("destroy").
	log func(what string)
	// onUsage, when set, is called as Usage starts (outside mu).
	onUsage func()
}

func newFakeHost(t *testing.T, protocol uint32) *fakeHost {
	in := &fakeHost{pid: 4242, socket: filepath.Join(t.TempDir(), "agent.sock"), done: make(chan struct{}), log: func(string) {}}
	ln, err := net.Listen("unix", in.socket)
	if err != nil {
		t.Fatal(err)
	}
	_, h := agentpbconnect.NewAgentHandler(fakeAgent{protocol: protocol, in: in})
	in.srv = &http.Server{Handler: h}
	go in.srv.Serve(ln)
	t.Cleanup(func() { in.srv.Close() })
	return in
}

func (i *fakeHost) Socket() string        { return i.socket }
func (i *fakeHost) InitPid() int          { return i.pid }
func (i *fakeHost) Done() <-chan struct{} { return i.done }

// Pause asks for the freeze even when it fails (as the kernel's freezer
// goes on with one it did not finish in time).
func (i *fakeHost) Pause() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.paused = true
	return i.failPause
}

func (i *fakeHost) Resume() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.failResume != nil {
		return i.failResume
	}
	i.paused = false
	return nil
}

func (i *fakeHost) Usage() lifecycle.Usage {
	i.mu.Lock()
	hook := i.onUsage
	i.mu.Unlock()
	if hook != nil {
		hook()
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.usage
}

func (i *fakeHost) CPU() time.Duration { return i.Usage().CPU }

func (i *fakeHost) LimitEvents() (int64, int64) {
	u := i.Usage()
	return u.OOMKills, u.PidsLimited
}

func (i *fakeHost) setUsage(u lifecycle.Usage) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.usage = u
}

func (i *fakeHost) Diff(context.Context, io.Writer) error { return nil }

// Changes: one file was added to /workspace.
func (i *fakeHost) Changes(_ context.Context, w io.Writer, _ int64) (*workspace.Report, error) {
	_, _ = io.WriteString(w, "+++ b/notes.txt\n")
	return &workspace.Report{Changes: []workspace.Reported{{Path: "notes.txt", Kind: "added", Type: "file", Size: 5}}}, nil
}

func (i *fakeHost) Degraded() []string  { return nil }
func (i *fakeHost) Wall() string        { return "container" }
func (i *fakeHost) WallVersion() string { return "" }
func (i *fakeHost) ImageDigest() string { return "" }

func (i *fakeHost) Archive(context.Context, string, int64, func([]string) io.Writer) error {
	return errors.New("the fake host keeps no archives")
}

func (i *fakeHost) Snapshot(context.Context, int64, bool) (*lifecycle.SnapshotFiles, error) {
	if i.snap == nil {
		return nil, errors.New("the fake host keeps no snapshots")
	}
	return i.snap, nil
}

// Kill ends the sandbox's init (which its watcher sees).
func (i *fakeHost) Kill() {
	i.log("kill")
	i.exit.Do(func() { close(i.done) })
}

func (i *fakeHost) Destroy() error {
	i.log("destroy")
	if i.hold != nil {
		i.destroying <- struct{}{}
		<-i.hold
	}
	i.mu.Lock()
	i.destroyed = true
	i.mu.Unlock()
	i.srv.Close()
	i.exit.Do(func() { close(i.done) })
	return i.failDestroy
}

func (i *fakeHost) Release() {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.released = true
}

// die ends the sandbox's init on its own.
func (i *fakeHost) die() {
	i.exit.Do(func() { close(i.done) })
}

// gone says whether the service destroyed and released it.
func (i *fakeHost) gone() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.destroyed && i.released
}

func (i *fakeHost) failNext(pause, resume error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.failPause, i.failResume = pause, resume
}

func (i *fakeHost) isPaused() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.paused
}

// lifeRig is a Service over a fakeBackend, a fakeClock, a store in a
// temporary directory and an audit log in memory.
type lifeRig struct {
	svc   *Service
	be    *fakeBackend
	clock *fakeClock
	db    *store.Store
	audit *memAudit
}

func newLifeRig(t *testing.T) *lifeRig {
	db, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return newLifeRigOn(t, db, newFakeBackend(t), newFakeClock())
}

// newLifeRigOn is a service (a daemon) over an existing store and host.
func newLifeRigOn(t *testing.T, db *store.Store, be *fakeBackend, clock *fakeClock) *lifeRig {
	r := &lifeRig{be: be, clock: clock, db: db, audit: &memAudit{}}
	r.svc = New(Config{Backend: be, Store: db, Audit: record.New(r.audit, nil), Now: clock.Now})
	t.Cleanup(func() {
		if _, err := r.svc.killAll(&tenant.Principal{Admin: true}, "", "test over"); err != nil {
			t.Error(err)
		}
	})
	return r
}

// tenant is a tenant's principal with quotas q; stored makes it in the
// store too (the CPU budget is kept there).
func (r *lifeRig) tenant(t *testing.T, name string, q api.Quotas, stored bool) *tenant.Principal {
	t.Helper()
	p := &tenant.Principal{ID: "id_" + name, Tenant: name, Quotas: q}
	if stored {
		qb, _ := json.Marshal(q)
		now := r.clock.Now()
		id, err := r.db.CreateTenant(context.Background(), store.Tenant{Name: name, KeyHash: "hash of " + name, Quotas: string(qb), Created: now, CPUPeriodStart: now})
		if err != nil {
			t.Fatal(err)
		}
		p.ID = id
	}
	return p
}

func (r *lifeRig) create(t *testing.T, p *tenant.Principal, req *api.CreateSandbox) *api.Sandbox {
	t.Helper()
	sb, err := r.svc.Create(context.Background(), p, req)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// createAnswer is what a create answered.
type createAnswer struct {
	sb  *api.Sandbox
	err error
}

// createHeld starts a create that the backend holds in flight, and
// returns its sandbox id and where its answer will come.
func (r *lifeRig) createHeld(t *testing.T, p *tenant.Principal, req *api.CreateSandbox) (string, chan createAnswer) {
	t.Helper()
	if r.be.gate == nil {
		t.Fatal("createHeld without a gate")
	}
	res := make(chan createAnswer, 1)
	go func() {
		sb, err := r.svc.Create(context.Background(), p, req)
		res <- createAnswer{sb, err}
	}()
	select {
	case id := <-r.be.started:
		return id, res
	case <-time.After(10 * time.Second):
		t.Fatal("the create did not start")
		return "", nil
	}
}

// tick runs one round of the service's own loop (what Run does each
// second) at the fake clock's time.
func (r *lifeRig) tick() { r.svc.tick(context.Background()) }

// live says whether sandbox id is among the live ones.
func (r *lifeRig) live(id string) bool {
	r.svc.Mu.Lock()
	defer r.svc.Mu.Unlock()
	_, ok := r.svc.Boxes[id]
	return ok
}

// onEnd takes hold of live sandboxes that are about to end on a goroutine
// of the service's (the CPU budget, a death of their own), before what
// ends them happens; the function it returns waits until they are all
// destroyed and recorded. Its bound guards against a hang; it is not part
// of any time logic.
func (r *lifeRig) onEnd(t *testing.T, ids ...string) func() {
	t.Helper()
	var ended []chan struct{}
	r.svc.Mu.Lock()
	for _, id := range ids {
		b := r.svc.Boxes[id]
		if b == nil {
			r.svc.Mu.Unlock()
			t.Fatalf("sandbox %s is not live", id)
		}
		ended = append(ended, b.Ended)
	}
	r.svc.Mu.Unlock()
	return func() {
		t.Helper()
		for i, c := range ended {
			select {
			case <-c:
			case <-time.After(10 * time.Second):
				t.Fatalf("sandbox %s never ended", ids[i])
			}
		}
	}
}

// stored is sandbox id's record in the store.
func (r *lifeRig) stored(t *testing.T, id string) store.Sandbox {
	t.Helper()
	rec, err := r.db.SandboxByID(context.Background(), id)
	if err != nil {
		t.Fatalf("record of %s: %v", id, err)
	}
	return rec
}

// wantEnded checks that sandbox id ended for reason: gone from the live
// ones and from the host, its record ended at the clock's time, and one
// sandbox.destroyed record saying why (returned).
func (r *lifeRig) wantEnded(t *testing.T, id, reason string) map[string]any {
	t.Helper()
	if r.live(id) {
		t.Errorf("%s is still live", id)
	}
	if in := r.be.sandbox(t, id); !in.gone() {
		t.Errorf("%s was not destroyed and released on the host", id)
	}
	rec := r.stored(t, id)
	if rec.State != api.StateEnded || rec.EndReason != reason || !rec.Ended.Equal(r.clock.Now()) {
		t.Errorf("%s's record: %s at %v for %q; want ended at %v for %q", id, rec.State, rec.Ended, rec.EndReason, r.clock.Now(), reason)
	}
	ds := r.records(id, "sandbox.destroyed")
	if len(ds) != 1 {
		t.Fatalf("%s has %d sandbox.destroyed records, want 1", id, len(ds))
	}
	if ds[0]["reason"] != reason {
		t.Errorf("%s's sandbox.destroyed says %q, want %q", id, ds[0]["reason"], reason)
	}
	return ds[0]
}

// records are the data of sandbox id's audit records of kind.
func (r *lifeRig) records(id, kind string) []map[string]any {
	var out []map[string]any
	for _, rec := range r.audit.Records() {
		if rec.Sandbox == id && rec.Kind == kind {
			out = append(out, recordData(rec))
		}
	}
	return out
}

func recordData(rec audit.Record) map[string]any {
	data := map[string]any{}
	_ = json.Unmarshal(rec.Data, &data)
	return data
}

// kinds lists the kinds of sandbox id's audit records, in order.
func (r *lifeRig) kinds(id string) []string {
	var out []string
	for _, rec := range r.audit.Records() {
		if rec.Sandbox == id {
			out = append(out, rec.Kind)
		}
	}
	return out
}
