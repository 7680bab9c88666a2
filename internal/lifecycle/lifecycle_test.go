package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"golang.org/x/sys/unix"
)

// fakeWall is a wall that makes nothing: it records what it was given and
// fails where told, so that the lifecycle's own steps can be tested without
// root or a kernel.
type fakeWall struct {
	missing  []wall.Missing
	fail     error // Create's answer
	reserved map[string]bool
	created  []*wall.Options
}

type fakeReservation struct {
	w  *fakeWall
	id string
}

func (r *fakeReservation) ID() string { return r.id }
func (r *fakeReservation) Release()   { delete(r.w.reserved, r.id) }

func (w *fakeWall) Name() string            { return "container" }
func (w *fakeWall) Version() string         { return "" }
func (w *fakeWall) Missing() []wall.Missing { return w.missing }
func (w *fakeWall) Reserve(id string) (wall.Reservation, error) {
	w.reserved[id] = true
	return &fakeReservation{w, id}, nil
}
func (w *fakeWall) Create(r wall.Reservation, o *wall.Options) (wall.Sandbox, error) {
	if o.BeforeStart != nil {
		if err := o.BeforeStart(); err != nil {
			return nil, err
		}
	}
	w.created = append(w.created, o)
	if w.fail != nil {
		return nil, w.fail
	}
	return &fakeSandbox{id: r.ID(), done: make(chan struct{})}, nil
}
func (w *fakeWall) Adopt(string, int) (wall.Sandbox, error) { return nil, errors.New("no") }
func (w *fakeWall) Discard(string) error                    { return nil }
func (w *fakeWall) Live(id string) bool                     { return w.reserved[id] }
func (w *fakeWall) GC() ([]string, error)                   { return nil, nil }

type fakeSandbox struct {
	id        string
	done      chan struct{}
	destroyed bool
}

func (s *fakeSandbox) ID() string                  { return s.id }
func (s *fakeSandbox) InitPid() int                { return 1 }
func (s *fakeSandbox) Wait() wall.Exit             { return wall.Exit{} }
func (s *fakeSandbox) Signal(unix.Signal) error    { return nil }
func (s *fakeSandbox) Kill()                       {}
func (s *fakeSandbox) Done() <-chan struct{}       { return s.done }
func (s *fakeSandbox) Freeze() error               { return nil }
func (s *fakeSandbox) Thaw() error                 { return nil }
func (s *fakeSandbox) Frozen() bool                { return false }
func (s *fakeSandbox) Stats() wall.Stats           { return wall.Stats{} }
func (s *fakeSandbox) LimitEvents() (int64, int64) { return 0, 0 }
func (s *fakeSandbox) CPUTime() time.Duration      { return 0 }
func (s *fakeSandbox) MemoryCurrent() int64        { return 0 }
func (s *fakeSandbox) Layers() wall.Layers         { return wall.Layers{} }
func (s *fakeSandbox) UIDBase() (uint32, error)    { return 0, nil }
func (s *fakeSandbox) Destroy() error              { s.destroyed = true; close(s.done); return nil }
func (s *fakeSandbox) CloseFiles()                 {}

func newTestLifecycle(t *testing.T, w *fakeWall) *Lifecycle {
	t.Helper()
	w.reserved = map[string]bool{}
	dir := t.TempDir()
	l, err := New(Config{StateDir: filepath.Join(dir, "run"), DataDir: filepath.Join(dir, "lib")}, w)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func longLived() *spec.Spec {
	s := spec.Default()
	return &s
}

// A control the host lacks refuses the create unless the spec runs
// without it, and then the sandbox says it is degraded: one gate for run,
// serve and mcp.
func TestGateRefusesWhatTheHostLacksUnlessAllowed(t *testing.T) {
	w := &fakeWall{missing: []wall.Missing{{Control: "landlock", Detail: "no Landlock here"}}}
	l := newTestLifecycle(t, w)
	s := longLived()
	_, err := l.Create(context.Background(), "aaaaaaaaaaaa", s, Options{})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "landlock") {
		t.Fatalf("create without Landlock: %v, want unavailable naming landlock", err)
	}
	if len(w.created) != 0 {
		t.Fatal("the wall was asked to create a sandbox the gate refused")
	}
	s.AllowDegraded = []string{"landlock"}
	sb, err := l.Create(context.Background(), "bbbbbbbbbbbb", s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Destroy(); sb.Release() }()
	if !slices.Equal(sb.Degraded(), []string{"landlock"}) || w.created[0].Landlock {
		t.Fatalf("degraded %v, Landlock asked %v: want [landlock] and off", sb.Degraded(), w.created[0].Landlock)
	}
}

// When the wall fails, everything the lifecycle took for the sandbox is
// given back: the reservation, the agent socket's path, the image.
func TestCreateGivesBackWhatItTookWhenTheWallFails(t *testing.T) {
	w := &fakeWall{fail: errdefs.Unavailable("the wall is down")}
	l := newTestLifecycle(t, w)
	_, err := l.Create(context.Background(), "cccccccccccc", longLived(), Options{})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("create: %v", err)
	}
	if len(w.reserved) != 0 {
		t.Errorf("reservations left: %v", w.reserved)
	}
	if _, err := os.Stat(l.agentSocket("cccccccccccc")); !os.IsNotExist(err) {
		t.Errorf("the agent socket's path is left: %v", err)
	}
}

// A BeforeStart that fails (a one-shot run that cannot be recorded) stops
// the create before the wall starts anything (the wall calls it before it
// starts anything; this fake, first).
func TestBeforeStartRefusalStartsNothing(t *testing.T) {
	w := &fakeWall{}
	l := newTestLifecycle(t, w)
	s := spec.Default()
	s.Command = []string{"true"}
	_, err := l.Create(context.Background(), "dddddddddddd", &s, Options{
		Command:     &Command{},
		BeforeStart: func(*Sandbox) error { return errors.New("the audit log is full") },
	})
	if err == nil || len(w.created) != 0 || len(w.reserved) != 0 {
		t.Fatalf("err %v, created %d, reserved %v: want an error, nothing made, nothing held", err, len(w.created), w.reserved)
	}
}

// One path, two kinds: a long-lived sandbox serves the agent on a socket,
// with the pids headroom and the capabilities each command may choose; a
// one-shot sandbox runs its command with the caller's streams.
func TestOneShotAndLongLivedShareOnePath(t *testing.T) {
	w := &fakeWall{}
	l := newTestLifecycle(t, w)
	s := longLived()
	s.Limits.Pids = 512
	sb, err := l.Create(context.Background(), "eeeeeeeeeeee", s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = sb.Destroy()
	sb.Release()
	one := spec.Default()
	one.Command = []string{"echo", "hi"}
	sb, err = l.Create(context.Background(), "ffffffffffff", &one, Options{Command: &Command{TTY: true, Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	_ = sb.Destroy()
	sb.Release()
	ll, os1 := w.created[0], w.created[1]
	if ll.AgentSocket == "" || ll.NProc != 480 || len(ll.KeepCaps) == 0 || ll.TTY {
		t.Errorf("long-lived options: socket %q, nproc %d, caps %d, tty %v", ll.AgentSocket, ll.NProc, len(ll.KeepCaps), ll.TTY)
	}
	if mem, pids := s.Limits.CommandLimits(); ll.CommandMemoryBytes != mem || ll.CommandPids != pids || os1.CommandMemoryBytes != 0 || os1.CommandPids != 0 {
		t.Errorf("commands' limits: long-lived %d/%d, one-shot %d/%d", ll.CommandMemoryBytes, ll.CommandPids, os1.CommandMemoryBytes, os1.CommandPids)
	}
	if os1.AgentSocket != "" || !os1.TTY || os1.Rows != 24 || !slices.Equal(os1.Argv, []string{"echo", "hi"}) {
		t.Errorf("one-shot options: socket %q, tty %v, rows %d, argv %v", os1.AgentSocket, os1.TTY, os1.Rows, os1.Argv)
	}
	if len(w.reserved) != 0 {
		t.Errorf("reservations left after destroy: %v", w.reserved)
	}
}

// The command's environment: the proxy's variables under the image's and
// the sandbox's own; the grants' CA over the image's; what the sandbox
// sets (and the grants' placeholders) last. resolv.conf names the proxy's
// resolver instead of "no network", once.
func TestNetworkEnvironmentOrder(t *testing.T) {
	l := newTestLifecycle(t, &fakeWall{})
	s := spec.Default()
	s.Env = []string{"HTTPS_PROXY=http://mine:1", "SSL_CERT_FILE=/my/ca", "TOKEN=placeholder"}
	layout, err := l.images.Resolve(context.Background(), "host", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer layout.Done()
	n := &sandboxnet.Net{
		Env:      []string{"HTTP_PROXY=http://10.0.0.1:3128", "HTTPS_PROXY=http://10.0.0.1:3128"},
		TrustEnv: []string{"SSL_CERT_FILE=/etc/airlock/ca-bundle.pem", "CURL_CA_BUNDLE=/etc/airlock/ca-bundle.pem"},
		Files:    []wall.File{{Path: "etc/resolv.conf", Data: "nameserver 10.0.0.1\n"}, {Path: "etc/airlock/ca.pem", Data: "CA"}},
	}
	o := l.options(&s, layout, "abcdefabcdef", n)
	env := map[string]string{}
	for _, kv := range o.Env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := env[k]; dup {
			t.Errorf("%s set twice", k)
		}
		env[k] = v
	}
	want := map[string]string{"HTTP_PROXY": "http://10.0.0.1:3128", "HTTPS_PROXY": "http://mine:1", "SSL_CERT_FILE": "/my/ca",
		"CURL_CA_BUNDLE": "/etc/airlock/ca-bundle.pem", "TOKEN": "placeholder"}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	resolv := 0
	for _, f := range o.Files {
		if f.Path == "etc/resolv.conf" {
			resolv++
			if !strings.Contains(f.Data, "10.0.0.1") {
				t.Errorf("resolv.conf: %q", f.Data)
			}
		}
	}
	if resolv != 1 {
		t.Errorf("%d resolv.conf files, want 1", resolv)
	}
}

// gc removes a snapshot's stage that a daemon killed mid-snapshot left
// (its sandbox gone), and leaves alone one being written, finished
// snapshots and names of another form.
func TestGCRemovesTheStagesOfDeadSandboxesSnapshots(t *testing.T) {
	w := &fakeWall{}
	l := newTestLifecycle(t, w)
	w.reserved["a1b2c3d4e5f6"] = true
	dir := filepath.Join(l.cfg.DataDir, "snapshots")
	for _, d := range []string{".new-a1b2c3d4e5f6-1", ".new-0000000000aa-2", "0123abcd", ".new-"} {
		if err := os.MkdirAll(filepath.Join(dir, d, "x"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.GC(); err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]bool{".new-a1b2c3d4e5f6-1": true, ".new-0000000000aa-2": false, "0123abcd": true, ".new-": true} {
		if _, err := os.Stat(filepath.Join(dir, d)); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", d, err == nil, want)
		}
	}
}

// A long-lived sandbox is listed as such (LongLived) from before its wall
// starts it, not only once its agent's socket is there: a daemon killed
// in between leaves one that may live on (a gvisor sandbox's runsc run
// does), which the next daemon must find to end it. The mark goes with a
// create that ends, and gc removes one whose sandbox is gone.
func TestLongLivedListsASandboxBeingMade(t *testing.T) {
	w := &fakeWall{}
	l := newTestLifecycle(t, w)
	const id = "dddddddddddd"
	var during []string
	sb, err := l.Create(context.Background(), id, longLived(), Options{BeforeStart: func(*Sandbox) error {
		during = l.LongLived()
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Destroy(); sb.Release() }()
	if !slices.Equal(during, []string{id}) {
		t.Errorf("long-lived sandboxes while %s is made: %v", id, during)
	}
	if _, err := os.Stat(l.creatingMark(id)); !os.IsNotExist(err) {
		t.Errorf("the mark outlived the create: %v", err)
	}

	// What a killed daemon leaves: the mark, its sandbox's holder alive,
	// then gone.
	const orphan = "eeeeeeeeeeee"
	if err := os.WriteFile(l.creatingMark(orphan), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w.reserved[orphan] = true
	if got := l.LongLived(); !slices.Contains(got, orphan) {
		t.Errorf("a sandbox a killed daemon was making is not listed: %v", got)
	}
	delete(w.reserved, orphan)
	if _, err := l.GC(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.creatingMark(orphan)); !os.IsNotExist(err) {
		t.Errorf("gc left the mark of a dead sandbox: %v", err)
	}
}

// A snapshot id is a caller's value: one that is not 24 hex digits names
// no directory, and nothing outside the snapshots is read or removed.
func TestSnapshotIDsNameOnlySnapshots(t *testing.T) {
	l := newTestLifecycle(t, &fakeWall{})
	victim := filepath.Join(l.cfg.DataDir, "victim")
	if err := os.MkdirAll(filepath.Join(victim, "memory"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"../victim", "..", "", "/", "0123456789abcdef01234567/../../victim", "0123456789ABCDEF01234567", "0123456789abcdef0123456\x00", "0123456789abcdef012345678"} {
		if _, _, err := l.SnapshotPaths(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SnapshotPaths(%q): %v", id, err)
		}
		if err := l.RemoveSnapshot(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("RemoveSnapshot(%q): %v", id, err)
		}
		if l.SnapshotHasMemory(id) {
			t.Errorf("SnapshotHasMemory(%q) is true", id)
		}
	}
	if _, err := os.Stat(filepath.Join(victim, "memory")); err != nil {
		t.Errorf("the directory beside the snapshots was touched: %v", err)
	}
}
