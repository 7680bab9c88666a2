package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/airlock-sandbox/airlock/api"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

type poolFixture struct {
	c      client.Client
	nodes  *fakeNodeView
	r      *WarmPoolReconciler
	events *events.FakeRecorder
	name   string    // pool "p"'s daemon pool name
	now    time.Time // the reconciler's clock
}

func newPoolFixture(t *testing.T, replicas int32, nodeNames ...string) *poolFixture {
	tmpl := airlockTemplate("t", "")
	bp, err := blueprint.ForTemplate(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := countingClient(t, tmpl, testWarmPool("p", "t", replicas))
	f := &poolFixture{c: c, nodes: newFakeNodeView(t, nodeNames...), events: events.NewFakeRecorder(100), name: daemonPoolName("p", bp.Hash)}
	f.now = time.Now()
	f.r = &WarmPoolReconciler{Client: c, Nodes: f.nodes, Classes: Classes{"airlock": true}, Events: f.events, Now: func() time.Time { return f.now }}
	return f
}

func (f *poolFixture) reconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: tns, Name: name}})
	if err != nil {
		t.Fatalf("reconcile %q: %v", name, err)
	}
	return res
}

func (f *poolFixture) pool(t *testing.T) *extv1.SandboxWarmPool {
	t.Helper()
	var p extv1.SandboxWarmPool
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "p"}, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// sizes is each node's daemon pool size of f.name (0: none).
func (f *poolFixture) sizes() map[string]int {
	out := map[string]int{}
	for n, d := range f.nodes.daemons {
		d.mu.Lock()
		if p := d.pools[tns+"/"+f.name]; p != nil {
			out[n] = p.def.Size
		} else {
			out[n] = 0
		}
		d.mu.Unlock()
	}
	return out
}

func (f *poolFixture) scale(t *testing.T, replicas int32) {
	t.Helper()
	p := f.pool(t)
	p.Spec.Replicas = &replicas
	p.Generation++
	if err := f.c.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

func TestWarmPoolSpreadsScalesAndReportsStatus(t *testing.T) {
	f := newPoolFixture(t, 6, "a", "b", "c")
	f.reconcile(t, "p")
	if got := f.sizes(); got["a"] != 2 || got["b"] != 2 || got["c"] != 2 {
		t.Fatalf("daemon pools %v, want 2 on each node", got)
	}
	p := f.pool(t)
	if !controllerutil.ContainsFinalizer(p, WarmPoolFinalizer) {
		t.Fatal("no finalizer")
	}
	if p.Status.Replicas != 6 || p.Status.ReadyReplicas != 0 || p.Status.Selector != sandboxv1.SandboxWarmPoolLabel+"=p" || p.Status.ObservedGeneration != p.Generation {
		t.Fatalf("status %+v", p.Status)
	}
	// The pool as each daemon set it: the template's body.
	d := f.nodes.daemons["a"].pools[tns+"/"+f.name].def
	if d.Isolation != "container" || d.Image != "host" || d.Limits.CPUs != 0.5 || d.Limits.MemoryBytes != 512<<20 {
		t.Fatalf("daemon pool spec %+v", d)
	}

	// The nodes fill (their pool events); readyReplicas follows, written
	// at most every readyEvery.
	f.nodes.syncPools()
	if res := f.reconcile(t, "p"); res.RequeueAfter <= 0 || res.RequeueAfter > readyEvery || f.pool(t).Status.ReadyReplicas != 0 {
		t.Fatalf("readyReplicas written at once after the last status write (requeue %v)", res.RequeueAfter)
	}
	f.now = f.now.Add(readyEvery)
	f.reconcile(t, "p")
	if p := f.pool(t); p.Status.ReadyReplicas != 6 {
		t.Fatalf("readyReplicas %d, want 6", p.Status.ReadyReplicas)
	}

	// The scale subresource sets spec.replicas: 9 is 3 a node.
	f.scale(t, 9)
	f.reconcile(t, "p")
	if got := f.sizes(); got["a"] != 3 || got["b"] != 3 || got["c"] != 3 {
		t.Fatalf("after scaling to 9: %v", got)
	}
	if p := f.pool(t); p.Status.Replicas != 9 || p.Status.ObservedGeneration != p.Generation {
		t.Fatalf("status after scaling %+v", p.Status)
	}
}

func TestWarmPoolShareOfALostNodeMoves(t *testing.T) {
	f := newPoolFixture(t, 6, "a", "b", "c")
	f.reconcile(t, "p")
	f.nodes.syncPools()
	f.nodes.setState("b", nodes.StateUnreachable)
	f.reconcile(t, "p")
	if got := f.sizes(); got["a"] != 3 || got["c"] != 3 {
		t.Fatalf("with b unreachable: %v, want 3 on a and c", got)
	}
	if p := f.pool(t); p.Status.Replicas != 6 {
		t.Fatalf("replicas %d", p.Status.Replicas)
	}
	// b comes back with its old pool of 2: the sum comes back to 6.
	f.nodes.setState("b", nodes.StateReady)
	f.nodes.syncPools()
	f.reconcile(t, "p")
	got := f.sizes()
	if got["a"]+got["b"]+got["c"] != 6 {
		t.Fatalf("with b back: %v, want 6 in all", got)
	}
}

func TestWarmPoolPastWhatNodesHoldIsCapped(t *testing.T) {
	f := newPoolFixture(t, 200, "a", "b")
	f.nodes.snaps[0].Capacity = api.Resources{CPUs: 100, MemoryBytes: 100 << 30}
	f.nodes.snaps[1].Capacity = api.Resources{CPUs: 100, MemoryBytes: 100 << 30}
	f.reconcile(t, "p")
	if got := f.sizes(); got["a"] != 64 || got["b"] != 64 {
		t.Fatalf("daemon pools %v, want 64 each", got)
	}
	if p := f.pool(t); p.Status.Replicas != 128 {
		t.Fatalf("status.replicas %d, want 128 (what the nodes hold)", p.Status.Replicas)
	}
	select {
	case e := <-f.events.Events:
		if !strings.Contains(e, "ReplicasCapped") || !strings.Contains(e, "128 of 200") {
			t.Fatalf("event %q", e)
		}
	default:
		t.Fatal("no ReplicasCapped event")
	}
}

func TestWarmPoolDeletionRemovesDaemonPools(t *testing.T) {
	f := newPoolFixture(t, 3, "a", "b", "c")
	f.reconcile(t, "p")
	f.nodes.syncPools()
	// Another tenant's pool and a pool of this tenant's own making are
	// not the controller's to remove.
	f.nodes.setPool("a", "other", f.name, 1, 1)
	f.nodes.setPool("a", tns, "mine", 1, 1)
	if err := f.c.Delete(context.Background(), f.pool(t)); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "p")
	f.nodes.syncPools()
	if got := f.sizes(); got["a"]+got["b"]+got["c"] != 0 {
		t.Fatalf("daemon pools left %v", got)
	}
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "p"}, &extv1.SandboxWarmPool{}); err == nil {
		t.Fatal("the pool is still there (finalizer kept)")
	}
	a := f.nodes.daemons["a"]
	if a.pools["other/"+f.name] == nil || a.pools[tns+"/mine"] == nil {
		t.Fatalf("removed what is not the controller's: %v", a.poolOps)
	}
}

func TestWarmPoolDeletionWaitsForAnUnreachableNode(t *testing.T) {
	f := newPoolFixture(t, 3, "a", "b")
	f.reconcile(t, "p")
	f.nodes.syncPools()
	f.nodes.setState("b", nodes.StateUnreachable)
	if err := f.c.Delete(context.Background(), f.pool(t)); err != nil {
		t.Fatal(err)
	}
	if res := f.reconcile(t, "p"); res.RequeueAfter == 0 {
		t.Fatal("finished with a daemon pool on an unreachable node")
	}
	if !controllerutil.ContainsFinalizer(f.pool(t), WarmPoolFinalizer) {
		t.Fatal("finalizer dropped")
	}
	// Lost: given up (swept when it returns).
	f.nodes.setState("b", nodes.StateLost)
	f.reconcile(t, "p")
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "p"}, &extv1.SandboxWarmPool{}); err == nil {
		t.Fatal("the pool is still there")
	}
}

func TestNewTemplateReplacesTheDaemonPools(t *testing.T) {
	f := newPoolFixture(t, 2, "a")
	f.reconcile(t, "p")
	f.nodes.syncPools()
	old := f.name
	var tmpl extv1.SandboxTemplate
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "t"}, &tmpl); err != nil {
		t.Fatal(err)
	}
	tmpl.Spec.PodTemplate.Spec.Containers[0].Image = "docker.io/library/python:3"
	if err := f.c.Update(context.Background(), &tmpl); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "p")
	ops := f.nodes.daemons["a"].poolOps
	bp, _ := blueprint.ForTemplate(&tmpl)
	f.name = daemonPoolName("p", bp.Hash)
	if f.name == old || !slices.Contains(ops, fmt.Sprintf("PUT %s/%s 2", tns, f.name)) || !slices.Contains(ops, fmt.Sprintf("DELETE %s/%s", tns, old)) {
		t.Fatalf("ops %v, want the new pool set and the old one removed", ops)
	}
}

func TestWarmPoolOfAnotherClassIsUntouched(t *testing.T) {
	f := newPoolFixture(t, 2, "a")
	other := airlockTemplate("o", "")
	cls := "runc"
	other.Spec.PodTemplate.Spec.RuntimeClassName = &cls
	other.ResourceVersion = ""
	if err := f.c.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Create(context.Background(), testWarmPool("q", "o", 2)); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "q")
	var q extv1.SandboxWarmPool
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "q"}, &q); err != nil {
		t.Fatal(err)
	}
	if len(q.Finalizers) != 0 || q.Status.Selector != "" || len(f.nodes.daemons["a"].poolOps) != 0 {
		t.Fatalf("touched: finalizers %v status %+v ops %v", q.Finalizers, q.Status, f.nodes.daemons["a"].poolOps)
	}
}

func TestSweepRemovesOrphanedDaemonPools(t *testing.T) {
	f := newPoolFixture(t, 1, "a")
	f.reconcile(t, "p")
	f.nodes.setPool("a", tns, "swp-0123456789abcdef", 1, 1) // a deleted pool's
	f.nodes.syncPools()
	f.reconcile(t, "") // the namespace's sweep
	ops := f.nodes.daemons["a"].poolOps
	if !slices.Contains(ops, fmt.Sprintf("DELETE %s/swp-0123456789abcdef", tns)) || slices.Contains(ops, fmt.Sprintf("DELETE %s/%s", tns, f.name)) {
		t.Fatalf("ops %v", ops)
	}
}

func TestCordonedNodeLosesItsShare(t *testing.T) {
	f := newPoolFixture(t, 4, "a", "b")
	f.reconcile(t, "p")
	f.nodes.syncPools()
	f.nodes.snaps[1].Unschedulable = true
	f.reconcile(t, "p")
	if got := f.sizes(); got["a"] != 4 || got["b"] != 0 {
		t.Fatalf("with b cordoned: %v, want all 4 on a", got)
	}
}
