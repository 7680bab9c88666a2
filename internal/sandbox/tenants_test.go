package sandbox

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/workspace"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/secret"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// gateBackend is a host that makes sandboxes in memory. With gate set, a
// Start waits for it (and, unless deaf, for its context) after saying so
// on started: a create held in flight for as long as a test needs.
type gateBackend struct {
	t       *testing.T
	gate    chan struct{}
	deaf    bool // Start ignores its context (a step that cannot be cut short)
	started chan string

	mu        sync.Mutex
	made      map[string]*gateInstance
	snapshots map[string]bool // content → files on the host
	removed   []string
}

func newGateBackend(t *testing.T) *gateBackend {
	return &gateBackend{t: t, started: make(chan string, 16), made: map[string]*gateInstance{}, snapshots: map[string]bool{}}
}

func (g *gateBackend) Create(ctx context.Context, id string, s *spec.Spec, _ func(eventlog.Event)) (Host, error) {
	if g.gate != nil {
		g.started <- id
		if g.deaf {
			<-g.gate
		} else {
			select {
			case <-g.gate:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
	}
	in := &gateInstance{socket: filepath.Join(g.t.TempDir(), "agent.sock"), done: make(chan struct{}), image: s.Image, content: core.NewID()}
	ln, err := net.Listen("unix", in.socket)
	if err != nil {
		return nil, err
	}
	_, h := agentpbconnect.NewAgentHandler(helloAgent{})
	in.srv = &http.Server{Handler: h}
	go in.srv.Serve(ln)
	g.mu.Lock()
	g.made[id] = in
	g.mu.Unlock()
	return in, nil
}

func (g *gateBackend) Adopt(context.Context, string, *spec.Spec, int, func(eventlog.Event)) (Host, error) {
	return nil, errors.New("no adoption here")
}

func (g *gateBackend) SnapshotPaths(content string) (string, string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.snapshots[content] {
		return "", "", errdefs.New(errdefs.ErrNotFound, "snapshot "+content+": /var/lib/airlock/snapshots/"+content+": no such file")
	}
	return "/snap/" + content + "/root", "/snap/" + content + "/workspace", nil
}

func (g *gateBackend) SnapshotHasMemory(string) bool { return false }

func (g *gateBackend) RemoveCheckpoint(string) error { return nil }

func (g *gateBackend) RemoveSnapshot(content string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.snapshots, content)
	g.removed = append(g.removed, content)
	return nil
}

func (g *gateBackend) Discard(string) error { return nil }
func (g *gateBackend) LongLived() []string  { return nil }

// CheckHostPaths: the specs here name no host path.
func (g *gateBackend) CheckHostPaths(*spec.Spec) error { return nil }

// live lists the sandboxes made and not destroyed.
func (g *gateBackend) live() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for id, in := range g.made {
		if !in.destroyed() {
			out = append(out, id)
		}
	}
	return out
}

type helloAgent struct {
	agentpbconnect.UnimplementedAgentHandler
}

func (helloAgent) Hello(context.Context, *connect.Request[agentpb.HelloRequest]) (*connect.Response[agentpb.HelloResponse], error) {
	return connect.NewResponse(&agentpb.HelloResponse{Protocol: AgentProtocol}), nil
}

// gateInstance is one sandbox of a gateBackend: an agent that answers
// hello, and a snapshot of a fixed content.
type gateInstance struct {
	socket, image, content string
	onSnapshot             func() // called as the snapshot's files are saved
	srv                    *http.Server
	done                   chan struct{}
	once                   sync.Once
}

func (i *gateInstance) Socket() string                        { return i.socket }
func (i *gateInstance) InitPid() int                          { return 1 }
func (i *gateInstance) Done() <-chan struct{}                 { return i.done }
func (i *gateInstance) Pause() error                          { return nil }
func (i *gateInstance) Resume() error                         { return nil }
func (i *gateInstance) Usage() lifecycle.Usage                { return lifecycle.Usage{} }
func (i *gateInstance) LimitEvents() (int64, int64)           { return 0, 0 }
func (i *gateInstance) CPU() time.Duration                    { return 0 }
func (i *gateInstance) Diff(context.Context, io.Writer) error { return nil }
func (i *gateInstance) Changes(context.Context, io.Writer, int64) (*workspace.Report, error) {
	return &workspace.Report{}, nil
}
func (i *gateInstance) Degraded() []string  { return nil }
func (i *gateInstance) Wall() string        { return "container" }
func (i *gateInstance) WallVersion() string { return "" }
func (i *gateInstance) ImageDigest() string { return "" }
func (i *gateInstance) Archive(context.Context, string, int64, func([]string) io.Writer) error {
	return nil
}
func (i *gateInstance) Snapshot(context.Context, int64, bool) (*lifecycle.SnapshotFiles, error) {
	if i.onSnapshot != nil {
		i.onSnapshot()
	}
	return &lifecycle.SnapshotFiles{ID: i.content, Base: "host", Bytes: 1}, nil
}
func (i *gateInstance) Destroy() error {
	i.once.Do(func() { i.srv.Close(); close(i.done) })
	return nil
}
func (i *gateInstance) Kill()    {}
func (i *gateInstance) Release() {}
func (i *gateInstance) destroyed() bool {
	select {
	case <-i.done:
		return true
	default:
		return false
	}
}

// holdAudit is an audit log in memory whose sandbox.created commit can be
// held: a create stopped between its record and going live.
type holdAudit struct {
	memAudit
	hold chan struct{}
	held chan struct{}
}

func (h *holdAudit) Commit(ctx context.Context, r audit.Record) error {
	if r.Kind == "sandbox.created" && h.hold != nil {
		h.held <- struct{}{}
		<-h.hold
	}
	return h.Append(r)
}

// tenantRig is the sandbox service with the tenants' service and the
// secret store beside it, wired as the daemon wires them.
type tenantRig struct {
	svc     *Service
	tenants *tenant.Service
	secrets *secret.Store
	be      *gateBackend
	db      *store.Store
	admin   *tenant.Principal
	// duringDeletion, when set, runs once a tenant's deletion has
	// marked it and before it removes anything.
	duringDeletion func()
}

func newTenantRig(t *testing.T, a record.Log, auditDir string) *tenantRig {
	db, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	be := newGateBackend(t)
	k := keys.Ephemeral()
	cfg := Config{Backend: be, Store: db, Broker: broker.New(broker.Config{Keys: k}), AuditDir: auditDir}
	tcfg := tenant.Config{Store: db}
	scfg := secret.Config{Store: db, Keys: k}
	if a != nil {
		rec := record.New(a, nil)
		cfg.Audit, tcfg.Audit, scfg.Audit = rec, rec, rec
	}
	r := &tenantRig{svc: New(cfg), secrets: secret.New(scfg), be: be, db: db, admin: &tenant.Principal{Admin: true}}
	tcfg.Sandboxes = rigSandboxes{r}
	r.tenants = tenant.New(tcfg)
	return r
}

// rigSandboxes is the rig's service as the tenants' service sees it.
type rigSandboxes struct{ r *tenantRig }

func (s rigSandboxes) EndTenant(by *tenant.Principal, id, reason string) ([]string, error) {
	if s.r.duringDeletion != nil {
		s.r.duringDeletion()
	}
	return s.r.svc.EndTenant(by, id, reason)
}

func (s rigSandboxes) ForgetTenant(ctx context.Context, id string, freed []string) error {
	return s.r.svc.ForgetTenant(ctx, id, freed)
}

func (s rigSandboxes) TenantUsage(id string) tenant.Usage { return s.r.svc.TenantUsage(id) }

// tenant creates a tenant and signs in with its key.
func (r *tenantRig) tenant(t *testing.T, name string) (*tenant.Principal, string) {
	t.Helper()
	ctx := context.Background()
	tn, err := r.tenants.Create(ctx, r.admin, &api.CreateTenant{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.tenants.Authenticate(ctx, tn.Key, "")
	if err != nil || p.ID != tn.ID || p.Tenant != name {
		t.Fatalf("sign in: %+v %v", p, err)
	}
	return p, tn.Key
}

type createResult struct {
	sb  *api.Sandbox
	err error
}

// createHeld starts a create that the backend holds, and returns its
// sandbox id and where its answer will come.
func (r *tenantRig) createHeld(t *testing.T, p *tenant.Principal) (string, chan createResult) {
	t.Helper()
	res := make(chan createResult, 1)
	go func() {
		sb, err := r.svc.Create(context.Background(), p, &api.CreateSandbox{})
		res <- createResult{sb, err}
	}()
	select {
	case id := <-r.be.started:
		return id, res
	case <-time.After(10 * time.Second):
		t.Fatal("the create did not start")
		return "", nil
	}
}

// waitKilled waits until the kill switch has reached create id, held in
// flight until then (it is marked, or already answered).
func (r *tenantRig) waitKilled(t *testing.T, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		r.svc.Mu.Lock()
		pc := r.svc.pending[id]
		killed := pc == nil || pc.killed != ""
		r.svc.Mu.Unlock()
		if killed {
			return
		}
	}
	t.Fatalf("the kill switch never reached create %s", id)
}

func wantKilled(t *testing.T, what string, res createResult, id, reason string) {
	t.Helper()
	if res.err == nil || !errors.Is(res.err, errdefs.ErrFailedPrecondition) || !strings.Contains(res.err.Error(), id) || !strings.Contains(res.err.Error(), reason) {
		t.Errorf("%s: the create answered %+v, %v; want failed_precondition naming %s and %q", what, res.sb, res.err, id, reason)
	}
}

// A create in flight when the kill switch is thrown ends destroyed,
// answers a clear error and is recorded, and the kill switch answers only
// once it is gone: whether the host's step can be cut short or not, and
// also when the create had already recorded its sandbox.
func TestKillSwitchEndsCreatesInFlight(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		deaf, late bool
	}{{"cut short", false, false}, {"host step runs on", true, false}, {"after its record", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			a := &holdAudit{held: make(chan struct{}, 1)}
			r := newTenantRig(t, a, "")
			acme, _ := r.tenant(t, "acme")
			other, _ := r.tenant(t, "other")
			bystander, err := r.svc.Create(ctx, other, &api.CreateSandbox{})
			if err != nil {
				t.Fatal(err)
			}
			var id string
			var res chan createResult
			if tc.late {
				a.hold = make(chan struct{})
				res = make(chan createResult, 1)
				go func() {
					sb, err := r.svc.Create(ctx, acme, &api.CreateSandbox{})
					res <- createResult{sb, err}
				}()
				<-a.held
				r.svc.Mu.Lock()
				for pid := range r.svc.pending {
					id = pid
				}
				r.svc.Mu.Unlock()
			} else {
				r.be.gate, r.be.deaf = make(chan struct{}), tc.deaf
				id, res = r.createHeld(t, acme)
			}
			killed := make(chan []string, 1)
			go func() {
				ids, err := r.svc.KillAll(ctx, r.admin, "acme")
				if err != nil {
					t.Error(err)
				}
				killed <- ids
			}()
			r.waitKilled(t, id)
			if tc.deaf || tc.late {
				select {
				case <-killed:
					t.Fatal("the kill switch answered while a create of its tenant was still being made")
				case <-time.After(50 * time.Millisecond):
				}
				if tc.late {
					close(a.hold)
				} else {
					close(r.be.gate)
				}
			}
			ids := <-killed
			if len(ids) != 1 || ids[0] != id {
				t.Errorf("the kill switch destroyed %v, want [%s]", ids, id)
			}
			wantKilled(t, "kill switch", <-res, id, "kill switch (tenant acme)")
			if live := r.be.live(); len(live) != 1 || live[0] != bystander.ID {
				t.Errorf("live on the host: %v, want only the other tenant's %s", live, bystander.ID)
			}
			if l := r.svc.List(ctx, acme); len(l) != 0 {
				t.Errorf("acme lists %d sandboxes", len(l))
			}
			var destroyed bool
			for _, rec := range a.Recs {
				if rec.Kind == "sandbox.destroyed" && rec.Sandbox == id && rec.Tenant == acme.ID && strings.Contains(string(rec.Data), "kill switch") {
					destroyed = true
				}
			}
			if !destroyed {
				t.Errorf("no sandbox.destroyed record for %s: %+v", id, a.Recs)
			}
			// The kill switch is not a ban: the tenant's next create runs.
			r.be.gate, a.hold = nil, nil
			if _, err := r.svc.Create(ctx, acme, &api.CreateSandbox{}); err != nil {
				t.Errorf("a create after the kill switch: %v", err)
			}
		})
	}
}

// A tenant deleted while a create of its is in flight: the create ends
// destroyed, the deletion answers once it is gone, the old key and its
// cached principal do nothing more, and a tenant made again under the
// same name inherits nothing: no sandbox, snapshot, secret, MCP spec or
// audit record.
func TestDeletedTenantPassesNothingToItsName(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	log, err := audit.Open(dir, key, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	r := newTenantRig(t, log, dir)
	old, oldKey := r.tenant(t, "acme")
	sb, err := r.svc.Create(ctx, old, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := r.svc.Snapshot(ctx, old, sb.ID, &api.CreateSnapshot{Name: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	r.be.snapshots[r.be.made[sb.ID].content] = true
	if _, err := r.secrets.Add(ctx, old, &api.AddSecret{Name: "token", Value: "old-tenant-value"}); err != nil {
		t.Fatal(err)
	}
	if err := r.svc.SetMCPSpec(ctx, old, &api.CreateSandbox{Hostname: "old"}); err != nil {
		t.Fatal(err)
	}
	r.be.gate = make(chan struct{})
	id, res := r.createHeld(t, old)
	if err := r.tenants.Delete(ctx, r.admin, "acme"); err != nil {
		t.Fatal(err)
	}
	wantKilled(t, "tenant deleted", <-res, id, "tenant acme deleted")
	if live := r.be.live(); len(live) != 0 {
		t.Errorf("a deleted tenant's sandboxes live on: %v", live)
	}
	if len(r.be.removed) != 1 || r.be.removed[0] != r.be.made[sb.ID].content {
		t.Errorf("the deleted tenant's snapshot files: removed %v", r.be.removed)
	}
	// Its key, and a principal a request already holds, do nothing.
	if _, err := r.tenants.Authenticate(ctx, oldKey, ""); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("the deleted tenant's key: %v", err)
	}
	r.be.gate = nil
	if _, err := r.svc.Create(ctx, old, &api.CreateSandbox{}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a late create of the deleted tenant: %v", err)
	}

	again, _ := r.tenant(t, "acme")
	if again.ID == old.ID {
		t.Fatalf("the new acme has the old one's id %s", old.ID)
	}
	if l := r.svc.List(ctx, again); len(l) != 0 {
		t.Errorf("the new acme lists %+v", l)
	}
	if _, err := r.svc.Get(ctx, again, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the new acme reads the old one's ended sandbox: %v", err)
	}
	if l, _ := r.svc.Snapshots(ctx, again); len(l) != 0 {
		t.Errorf("the new acme lists snapshots %+v", l)
	}
	if err := r.svc.DeleteSnapshot(ctx, again, sn.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the old acme's snapshot, deleted by the new: %v", err)
	}
	if l, _ := r.secrets.List(ctx, again); len(l) != 0 {
		t.Errorf("the new acme lists secrets %+v", l)
	}
	if _, err := r.secrets.Value(again.ID, "token"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the old acme's secret, for the new one's grants: %v", err)
	}
	if m, err := r.svc.MCPSpec(ctx, again); err != nil || m.Hostname != "" {
		t.Errorf("the new acme's MCP spec: %+v %v", m, err)
	}
	if tn, _ := r.tenants.List(ctx, again); len(tn) != 1 || tn[0].ID != again.ID || tn[0].Sandboxes != 0 {
		t.Errorf("the new acme's tenant: %+v", tn)
	}
	var kinds []string
	if err := r.svc.AuditRecords(ctx, again, AuditFilter{}, func(rec *audit.Record) error {
		if rec.Tenant != again.ID {
			t.Errorf("the new acme reads a record of %q: %s", rec.Tenant, rec.Kind)
		}
		kinds = append(kinds, rec.Kind)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(kinds) != 1 || kinds[0] != "tenant.created" {
		t.Errorf("the new acme reads %v, want only its own tenant.created", kinds)
	}
	var oldRecs int
	_ = r.svc.AuditRecords(ctx, r.admin, AuditFilter{}, func(rec *audit.Record) error {
		if rec.Tenant == old.ID {
			oldRecs++
		}
		return nil
	})
	if oldRecs == 0 {
		t.Error("the admin no longer reads the deleted tenant's records")
	}
}

// A snapshot whose files are whole when its caller goes is recorded and
// audited all the same: files kept with no record could be neither found
// nor deleted.
func TestSnapshotSavedAsItsCallerWentIsRecorded(t *testing.T) {
	dir := t.TempDir()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	log, err := audit.Open(dir, key, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	r := newTenantRig(t, log, dir)
	p, _ := r.tenant(t, "acme")
	sb, err := r.svc.Create(context.Background(), p, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.be.made[sb.ID].onSnapshot = cancel
	sn, err := r.svc.Snapshot(ctx, p, sb.ID, &api.CreateSnapshot{Name: "late"})
	if err != nil {
		t.Fatalf("saved as the caller went: %v", err)
	}
	if l, _ := r.svc.Snapshots(context.Background(), p); len(l) != 1 || l[0].ID != sn.ID {
		t.Errorf("recorded: %+v", l)
	}
	audited := false
	_ = r.svc.AuditRecords(context.Background(), p, AuditFilter{}, func(rec *audit.Record) error {
		audited = audited || rec.Kind == "sandbox.snapshot"
		return nil
	})
	if !audited {
		t.Error("no sandbox.snapshot record")
	}
}

// Snapshot ids are the tenant's own: the same content saved by two
// tenants has two ids; deleting another tenant's id is not found, whether
// or not a sandbox uses it, and no answer names another tenant's sandbox;
// the files stay while any tenant records them.
func TestSnapshotDeleteIsNoOracle(t *testing.T) {
	ctx := context.Background()
	r := newTenantRig(t, nil, "")
	alice, _ := r.tenant(t, "alice")
	bob, _ := r.tenant(t, "bob")
	as, err := r.svc.Create(ctx, alice, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	bs, err := r.svc.Create(ctx, bob, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	// The same content in both.
	r.be.made[bs.ID].content = r.be.made[as.ID].content
	content := r.be.made[as.ID].content
	r.be.snapshots[content] = true
	asn, err := r.svc.Snapshot(ctx, alice, as.ID, &api.CreateSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	bsn, err := r.svc.Snapshot(ctx, bob, bs.ID, &api.CreateSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	if asn.ID == bsn.ID || asn.ID == content || bsn.ID == content {
		t.Fatalf("ids alice %s, bob %s, content %s: want two of their own", asn.ID, bsn.ID, content)
	}
	from, err := r.svc.Create(ctx, alice, &api.CreateSandbox{Image: "snapshot:" + asn.ID})
	if err != nil {
		t.Fatal(err)
	}
	for what, id := range map[string]string{"alice's id, in use": asn.ID, "the content digest": content, "a missing id": "0123456789abcdef01234567"} {
		err := r.svc.DeleteSnapshot(ctx, bob, id)
		if !errors.Is(err, errdefs.ErrNotFound) || strings.Contains(err.Error(), from.ID) || strings.Contains(err.Error(), as.ID) {
			t.Errorf("bob deletes %s: %v", what, err)
		}
	}
	if _, err := r.svc.Create(ctx, bob, &api.CreateSandbox{Image: "snapshot:" + asn.ID}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob creates from alice's snapshot: %v", err)
	}
	err = r.svc.DeleteSnapshot(ctx, alice, asn.ID)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), from.ID) {
		t.Errorf("alice deletes her snapshot in use: %v", err)
	}
	// Bob's own goes; the files stay for alice's.
	if err := r.svc.DeleteSnapshot(ctx, bob, bsn.ID); err != nil {
		t.Fatal(err)
	}
	if len(r.be.removed) != 0 {
		t.Errorf("files removed while alice records them: %v", r.be.removed)
	}
	if err := r.svc.Destroy(ctx, alice, from.ID); err != nil {
		t.Fatal(err)
	}
	if err := r.svc.DeleteSnapshot(ctx, alice, asn.ID); err != nil {
		t.Fatal(err)
	}
	if len(r.be.removed) != 1 || r.be.removed[0] != content {
		t.Errorf("files removed: %v", r.be.removed)
	}
	if err := r.svc.DeleteSnapshot(ctx, r.admin, asn.ID); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("the admin deletes a snapshot: %v", err)
	}
}

// A request of a tenant's under way when the tenant is deleted (its
// principal already held) leaves nothing bound to the dead id: a secret,
// an MCP spec or a snapshot it writes is undone and the call refused.
func TestWritesRacingDeletionAreUndone(t *testing.T) {
	ctx := context.Background()
	r := newTenantRig(t, nil, "")
	p, _ := r.tenant(t, "acme")
	sb, err := r.svc.Create(ctx, p, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	content := r.be.made[sb.ID].content
	r.be.snapshots[content] = true
	// The writes come once deletion has begun: the id is marked, what it
	// owns not yet removed.
	ran := false
	r.duringDeletion = func() { ran = true; lateWrites(t, r, p, sb.ID, content) }
	if err := r.tenants.Delete(ctx, r.admin, "acme"); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("the deletion never ended the tenant's sandboxes")
	}
}

// lateWrites are a request's writes, under way with p in hand while p's
// tenant is being deleted; each must be undone and refused.
func lateWrites(t *testing.T, r *tenantRig, p *tenant.Principal, sb, content string) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.secrets.Add(ctx, p, &api.AddSecret{Name: "late", Value: "late-value"}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a late secret: %v", err)
	}
	if secs, _ := r.db.Secrets(ctx, p.ID); len(secs) != 0 {
		t.Errorf("a late secret is kept: %+v", secs)
	}
	if err := r.svc.SetMCPSpec(ctx, p, &api.CreateSandbox{Hostname: "late"}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a late MCP spec: %v", err)
	}
	if sp, err := r.svc.MCPSpec(ctx, p); err != nil || sp.Hostname != "" {
		t.Errorf("a late MCP spec is kept: %+v, %v", sp, err)
	}
	if _, err := r.svc.Snapshot(ctx, p, sb, &api.CreateSnapshot{}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a late snapshot: %v", err)
	}
	if sns, _ := r.db.Snapshots(ctx, p.ID); len(sns) != 0 {
		t.Errorf("a late snapshot is kept: %+v", sns)
	}
	if len(r.be.removed) != 1 || r.be.removed[0] != content {
		t.Errorf("a late snapshot's files: removed %v", r.be.removed)
	}
}
