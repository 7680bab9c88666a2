package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

var admin = &tenant.Principal{Admin: true}

// node is the node as the admin key reads it.
func (r *lifeRig) node(t *testing.T) *api.Node {
	t.Helper()
	n, err := r.svc.Node(admin)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Creates racing for the node's last places are admitted under one lock:
// of eight creates of two tenants at once, with a node that holds three
// sandboxes, three are made and five refused, whatever their order.
func TestNodeCapacityHoldsConcurrentCreates(t *testing.T) {
	r := newLifeRig(t)
	r.svc.Cfg.Node.Held = api.Resources{Sandboxes: 3}
	r.be.gate = make(chan struct{})
	a, b := r.tenant(t, "a", api.Quotas{}, false), r.tenant(t, "b", api.Quotas{}, false)
	res := make(chan createAnswer, 8)
	for i := range 8 {
		p := a
		if i%2 == 1 {
			p = b
		}
		go func() {
			sb, err := r.svc.Create(context.Background(), p, &api.CreateSandbox{})
			res <- createAnswer{sb, err}
		}()
	}
	// The three admitted are held in the backend: the five others answer.
	for range 5 {
		ans := <-res
		if !errors.Is(ans.err, errdefs.ErrResourceExhausted) || !strings.HasPrefix(ans.err.Error(), "node capacity: sandboxes:") {
			t.Fatalf("a create past the node's capacity: %v, want quota_exceeded starting node capacity: sandboxes:", ans.err)
		}
	}
	if got := r.node(t).Allocated.Sandboxes; got != 3 {
		t.Errorf("allocated while three creates are in flight: %d sandboxes, want 3", got)
	}
	close(r.be.gate)
	for range 3 {
		if ans := <-res; ans.err != nil {
			t.Fatalf("an admitted create: %v", ans.err)
		}
	}
	if len(r.be.started) != 3 {
		t.Errorf("%d creates reached the host, want 3", len(r.be.started))
	}
	if got := r.node(t).Allocated; got.Sandboxes != 3 || got.CPUs != 3 || got.MemoryBytes != 3*2<<30 {
		t.Errorf("allocated %+v, want 3 sandboxes of the defaults (1 CPU, 2 GiB)", got)
	}
}

// The node's memory and CPUs hold every tenant's creates and the pools'
// refills; what pooled sandboxes hold is allocated; a resource the node
// is not held to refuses nothing.
func TestNodeCapacityHoldsMemoryCPUsAndRefills(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	r.svc.Cfg.Node.Held = api.Resources{CPUs: 2, MemoryBytes: 1 << 30}
	r.svc.Cfg.Node.Capacity = api.Resources{CPUs: 2, MemoryBytes: 1 << 30, Sandboxes: 0}
	r.create(t, p, &api.CreateSandbox{Limits: api.Limits{CPUs: 1.5, MemoryBytes: 256 << 20}})
	_, err := r.svc.Create(ctx, p, &api.CreateSandbox{Limits: api.Limits{CPUs: 1, MemoryBytes: 256 << 20}})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.HasPrefix(err.Error(), "node capacity: cpus:") {
		t.Errorf("a create past the node's CPUs: %v", err)
	}
	_, err = r.svc.Create(ctx, p, &api.CreateSandbox{Limits: api.Limits{CPUs: 0.25, MemoryBytes: 1 << 30}})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.HasPrefix(err.Error(), "node capacity: memory:") {
		t.Errorf("a create past the node's memory: %v", err)
	}
	// A pool of three quarter-CPU sandboxes: two fit beside the live one.
	if _, err := r.svc.SetPool(ctx, p, "warm", &api.SetPool{Size: 3, Limits: api.Limits{CPUs: 0.25, MemoryBytes: 128 << 20}}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	pl := r.pool(t, p, "warm")
	if pl.Ready != 2 || !strings.HasPrefix(pl.Error, "node capacity: cpus:") {
		t.Errorf("pool past the node's CPUs: %d ready, error %q; want 2 and the node's refusal", pl.Ready, pl.Error)
	}
	n := r.node(t)
	if want := (api.Resources{CPUs: 2, MemoryBytes: 512 << 20, Sandboxes: 3}); n.Allocated != want {
		t.Errorf("allocated %+v, want %+v (the live sandbox and the pooled ones)", n.Allocated, want)
	}
	if len(n.Pools) != 1 || n.Pools[0] != (api.NodePool{Tenant: "acme", Name: "warm", Size: 3, Ready: 2}) {
		t.Errorf("the node's pools: %+v", n.Pools)
	}
	if n.Capacity != r.svc.Cfg.Node.Capacity {
		t.Errorf("capacity %+v, want %+v", n.Capacity, r.svc.Cfg.Node.Capacity)
	}
}

// next is w's next event; its bound guards against a hang.
func next(t *testing.T, w *NodeWatch) api.NodeEvent {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			_, err := w.Cut()
			t.Fatalf("the watcher was cut off: %v", err)
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no node event")
		return api.NodeEvent{}
	}
}

// until reads w's events until one satisfies ok, checking that each
// revision is above the one before.
func until(t *testing.T, w *NodeWatch, rev *uint64, ok func(api.NodeEvent) bool) api.NodeEvent {
	t.Helper()
	for {
		ev := next(t, w)
		if ev.Rev <= *rev {
			t.Fatalf("event %s has rev %d after rev %d", ev.Type, ev.Rev, *rev)
		}
		*rev = ev.Rev
		if ok(ev) {
			return ev
		}
	}
}

// A watcher hears hello (the node), then each sandbox made and ended
// (with its tenant, metadata and end), its pools' changes and what the
// sandboxes hold, and its heartbeats, revisions rising throughout; a
// tenant's key may neither read nor watch the node.
func TestNodeEventsTellWhatChanges(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	r.svc.Cfg.Node = nodeForTest()
	done := make(chan struct{})
	published := make(chan struct{})
	go func() { r.svc.publishNodeChanges(done); close(published) }()
	t.Cleanup(func() { close(done); <-published })

	if _, _, err := r.svc.WatchNode(p); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant watching the node: %v", err)
	}
	if _, err := r.svc.Node(p); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant reading the node: %v", err)
	}
	hello, w, err := r.svc.WatchNode(admin)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if hello.Type != api.NodeEventHello || hello.Node == nil || hello.Node.Rev != hello.Rev || hello.Node.Name != "node-1" || len(hello.Node.BootID) != 32 {
		t.Fatalf("hello %+v", hello)
	}
	rev := hello.Rev
	sb := r.create(t, p, &api.CreateSandbox{Metadata: map[string]string{"k8s.name": "x"}})
	// Its capacity event may come before or after it (the create holds
	// its place from its admission).
	var created *api.Sandbox
	held := false
	until(t, w, &rev, func(ev api.NodeEvent) bool {
		switch ev.Type {
		case api.NodeEventSandboxCreated:
			created = ev.Sandbox
		case api.NodeEventCapacity:
			held = ev.Node.Allocated.Sandboxes == 1 && ev.Node.Name == "node-1"
		}
		return created != nil && held
	})
	if created.ID != sb.ID || created.Tenant != "acme" || created.Metadata["k8s.name"] != "x" || created.State != api.StateRunning {
		t.Errorf("sandbox.created %+v", created)
	}
	if _, err := r.svc.SetPool(ctx, p, "warm", &api.SetPool{Size: 1, Limits: api.Limits{Pids: 100}}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	until(t, w, &rev, func(ev api.NodeEvent) bool {
		return ev.Type == api.NodeEventPool && *ev.Pool == api.NodePool{Tenant: "acme", Name: "warm", Size: 1, Ready: 1}
	})
	if err := r.svc.Destroy(ctx, p, sb.ID); err != nil {
		t.Fatal(err)
	}
	ev := until(t, w, &rev, func(ev api.NodeEvent) bool { return ev.Type == api.NodeEventSandboxEnded })
	if ev.Sandbox.ID != sb.ID || ev.Sandbox.State != api.StateEnded || ev.Sandbox.EndReason != "destroyed by request" {
		t.Errorf("sandbox.ended %+v", ev.Sandbox)
	}
	if err := r.svc.DeletePool(ctx, p, "warm"); err != nil {
		t.Fatal(err)
	}
	until(t, w, &rev, func(ev api.NodeEvent) bool {
		return ev.Type == api.NodeEventPool && *ev.Pool == api.NodePool{Tenant: "acme", Name: "warm"}
	})
	w.Heartbeat()
	until(t, w, &rev, func(ev api.NodeEvent) bool { return ev.Type == api.NodeEventHeartbeat })
}

// nodeForTest is a node of a name, an audit head and both walls.
func nodeForTest() NodeConfig {
	return NodeConfig{Name: "node-1", Version: "test", Isolations: []string{"container", "gvisor"},
		Capacity: api.Resources{CPUs: 4, MemoryBytes: 8 << 30}, AuditHead: func() *api.AuditHead { return &api.AuditHead{Seq: 7, Hash: "ab"} }}
}

// The daemon never waits for a watcher: one that leaves its buffer full
// is cut off, after what it was sent, with the reason; a stopping daemon
// cuts every watcher off and takes no more.
func TestNodeWatcherThatFallsBehindIsCutOff(t *testing.T) {
	r := newLifeRig(t)
	_, slow, err := r.svc.WatchNode(admin)
	if err != nil {
		t.Fatal(err)
	}
	for i := range nodeEventBuffer + 1 {
		r.svc.publishSandbox(api.NodeEventSandboxCreated, &api.Sandbox{ID: "s" + string(rune('a'+i%26))})
	}
	n, last := 0, uint64(0)
	for ev := range slow.Events() {
		n++
		last = ev.Rev
	}
	rev, err := slow.Cut()
	if n != nodeEventBuffer || !errors.Is(err, errdefs.ErrResourceExhausted) || rev <= last {
		t.Errorf("a watcher that fell behind got %d events and %v at rev %d after %d; want %d and quota_exceeded after them", n, err, rev, last, nodeEventBuffer)
	}
	_, w, err := r.svc.WatchNode(admin)
	if err != nil {
		t.Fatal(err)
	}
	r.svc.EndNodeWatches("the daemon is stopping")
	if _, ok := <-w.Events(); ok {
		t.Error("a watcher of a stopping daemon was not cut off")
	}
	if _, err := w.Cut(); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a watcher of a stopping daemon: %v", err)
	}
	if _, _, err := r.svc.WatchNode(admin); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a watch of a stopping daemon: %v", err)
	}
}

// queued is what w has been sent and not read yet.
func queued(w *NodeWatch) []api.NodeEvent {
	var out []api.NodeEvent
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return out
			}
			out = append(out, ev)
		default:
			return out
		}
	}
}

// A watcher joining tells the watchers there what changed since they were
// last told, before its hello (so that a later change back is told too);
// a pooled sandbox is no sandbox of anyone's: its making and its end are
// pool events, never sandbox events.
func TestNodeWatchersMissNoChange(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	if _, err := r.svc.SetPool(ctx, p, "warm", &api.SetPool{Size: 1, Limits: api.Limits{Pids: 100}}); err != nil {
		t.Fatal(err)
	}
	helloA, a, err := r.svc.WatchNode(admin)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if ps := helloA.Node.Pools; len(ps) != 1 || ps[0].Ready != 0 {
		t.Fatalf("first hello's pools %+v", ps)
	}
	r.fillPools() // no publisher runs: only a join tells a
	helloB, b, err := r.svc.WatchNode(admin)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ps := helloB.Node.Pools; len(ps) != 1 || ps[0].Ready != 1 || helloB.Node.Allocated.Sandboxes != 1 {
		t.Fatalf("second hello %+v", helloB.Node)
	}
	evs := queued(a)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
		if ev.Rev >= helloB.Rev {
			t.Errorf("%s at rev %d, not before the hello at %d", ev.Type, ev.Rev, helloB.Rev)
		}
	}
	if len(evs) != 2 || evs[0].Type != api.NodeEventPool || evs[0].Pool.Ready != 1 || evs[1].Type != api.NodeEventCapacity || evs[1].Node.Allocated.Sandboxes != 1 {
		t.Errorf("the first watcher was told %v, want the pool's ready sandbox and what it holds", types)
	}
	if err := r.svc.DeletePool(ctx, p, "warm"); err != nil {
		t.Fatal(err)
	}
	_, c, err := r.svc.WatchNode(admin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	types = nil
	for _, ev := range queued(b) {
		types = append(types, ev.Type)
	}
	if strings.Join(types, " ") != "pool capacity" {
		t.Errorf("a pool removed with its ready sandbox told %v, want its pool and capacity events alone", types)
	}
}
