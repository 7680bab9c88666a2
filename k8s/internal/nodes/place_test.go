package nodes

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
)

// readyNode puts a Ready node of this capacity in t, as if its daemon had
// said hello.
func readyNode(tr *Tracker, name string, cpus float64, mem int64) *node {
	n := newNode(name, v1alpha1.AirlockNodeSpec{})
	n.state = StateReady
	n.capacity = api.Resources{CPUs: cpus, MemoryBytes: mem}
	n.synced = true
	tr.mu.Lock()
	tr.nodes[name] = n
	tr.mu.Unlock()
	return n
}

func TestPlaceNeverPassesCapacity(t *testing.T) {
	tr := New(Config{Log: logr.Discard()})
	for i := range 3 {
		readyNode(tr, fmt.Sprintf("n%d", i), 2, 8<<30)
	}
	// 96 quarter-CPU requests at once, 32 at a time: 24 fit (8 a node).
	var (
		mu     sync.Mutex
		placed = map[string]int{}
		failed []error
		wg     sync.WaitGroup
		sem    = make(chan struct{}, 32)
	)
	for i := range 96 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, err := tr.Place(Request{Key: fmt.Sprintf("uid-%d", i), RuntimeClass: "airlock", CPUs: 0.25, MemoryBytes: 256 << 20})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
				return
			}
			placed[r.Node]++
		}()
	}
	wg.Wait()
	total := 0
	for n, c := range placed {
		if c > 8 {
			t.Errorf("node %s got %d quarter CPUs of 2", n, c)
		}
		total += c
	}
	if total != 24 || len(failed) != 72 {
		t.Fatalf("placed %d, refused %d; want 24 and 72", total, len(failed))
	}
	var u *UnschedulableError
	if !errors.As(failed[0], &u) || u.Message != "0/3 airlock nodes are available: 3 insufficient cpu" {
		t.Fatalf("refusal: %v", failed[0])
	}
}

func TestUnschedulableSaysWhyPerNode(t *testing.T) {
	tr := New(Config{Log: logr.Discard()})
	readyNode(tr, "a", 4, 1<<30).allocated = api.Resources{CPUs: 0, MemoryBytes: 1 << 30}
	readyNode(tr, "b", 4, 8<<30).spec.Unschedulable = true
	readyNode(tr, "c", 4, 8<<30).state = StateUnreachable
	readyNode(tr, "d", 4, 8<<30).spec.RuntimeClasses = []string{"other"}
	_, err := tr.Place(Request{RuntimeClass: "airlock", CPUs: 1, MemoryBytes: 1 << 20})
	want := `0/4 airlock nodes are available: 1 insufficient memory, 1 not ready, 1 runtime class "airlock" not served, 1 unschedulable`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	if _, err := New(Config{}).Place(Request{RuntimeClass: "airlock"}); err == nil || err.Error() != "0/0 airlock nodes are available" {
		t.Fatalf("no nodes: %v", err)
	}
}

func TestPlacePrefersTheLeastAllocated(t *testing.T) {
	tr := New(Config{Log: logr.Discard()})
	readyNode(tr, "busy", 4, 8<<30).allocated = api.Resources{CPUs: 3, MemoryBytes: 1 << 30}
	readyNode(tr, "idle", 4, 8<<30)
	for i := range 4 {
		r, err := tr.Place(Request{Key: fmt.Sprint(i), RuntimeClass: "airlock", CPUs: 0.5, MemoryBytes: 1 << 20})
		if err != nil || r.Node != "idle" {
			t.Fatalf("placement %d: %v %v", i, r, err)
		}
	}
	r, err := tr.Place(Request{Key: "x", RuntimeClass: "airlock", CPUs: 0.5, MemoryBytes: 1 << 20, Exclude: []string{"idle"}})
	if err != nil || r.Node != "busy" {
		t.Fatalf("excluding idle: %v %v", r, err)
	}
}

// A reservation holds until the node reports the sandbox, is released, or
// expires; a retry of the same key replaces it.
func TestReservationLifetime(t *testing.T) {
	tr := New(Config{Log: logr.Discard()})
	n := readyNode(tr, "a", 1, 8<<30)
	req := Request{Key: "uid-1", RuntimeClass: "airlock", CPUs: 1, MemoryBytes: 1 << 20}
	r, err := tr.Place(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Place(Request{Key: "uid-2", RuntimeClass: "airlock", CPUs: 1}); err == nil {
		t.Fatal("a reserved CPU was given twice")
	}
	if _, err := tr.Place(req); err != nil {
		t.Fatalf("a retry of the same key: %v", err)
	}
	// the node reports the sandbox: allocated takes over from the assumption.
	tr.apply("a", &api.NodeEvent{Type: "capacity", Node: &api.Node{Capacity: api.Resources{CPUs: 1, MemoryBytes: 8 << 30}, Allocated: api.Resources{CPUs: 1, MemoryBytes: 1 << 20, Sandboxes: 1}}})
	if s, _ := tr.Node("a"); s.Assumed.CPUs != 1 {
		t.Fatalf("the reservation ended before the sandbox was reported: %+v", s.Assumed)
	}
	tr.apply("a", &api.NodeEvent{Type: "sandbox.created", Sandbox: &api.Sandbox{ID: "s1", ExternalID: "uid-1", Limits: api.Limits{CPUs: 1, MemoryBytes: 1 << 20}}})
	s, _ := tr.Node("a")
	if s.Assumed.CPUs != 0 || s.Allocated.CPUs != 1 {
		t.Fatalf("after the event: assumed %v allocated %v", s.Assumed, s.Allocated)
	}
	if d, ok := tr.DaemonSandbox("a", "uid-1"); !ok || d.ID != "s1" {
		t.Fatalf("DaemonSandbox: %v %v", d, ok)
	}
	tr.apply("a", &api.NodeEvent{Type: "sandbox.ended", Sandbox: &api.Sandbox{ID: "s1", ExternalID: "uid-1", EndReason: "ttl", Limits: api.Limits{CPUs: 1, MemoryBytes: 1 << 20}}})
	tr.apply("a", &api.NodeEvent{Type: "capacity", Node: &api.Node{Capacity: api.Resources{CPUs: 1, MemoryBytes: 8 << 30}}})
	if d, _ := tr.DaemonSandbox("a", "uid-1"); !d.Ended || d.EndReason != "ttl" {
		t.Fatalf("ended: %+v", d)
	}
	r, err = tr.Place(Request{Key: "uid-3", RuntimeClass: "airlock", CPUs: 1})
	if err != nil {
		t.Fatalf("after the end: %v", err)
	}
	r.Release()
	if _, err = tr.Place(Request{Key: "uid-4", RuntimeClass: "airlock", CPUs: 1}); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	tr.mu.Lock()
	n.reservations["uid-4"].expires = time.Now().Add(-time.Second)
	tr.mu.Unlock()
	if _, err := tr.Place(Request{Key: "uid-5", RuntimeClass: "airlock", CPUs: 1}); err != nil {
		t.Fatalf("after the reservation expired: %v", err)
	}
}

func TestTenantKey(t *testing.T) {
	master := []byte("0123456789abcdef0123456789abcdef")
	k := TenantKey(master, "n1", "team-a")
	// HMAC-SHA256(master, "n1/team-a"), computed apart.
	if k != "airlock_"+hmacHex(master, "n1/team-a") || len(k) != len("airlock_")+64 {
		t.Fatalf("key %s", k)
	}
	if k == TenantKey(master, "n2", "team-a") || k == TenantKey(master, "n1", "team-b") || k == TenantKey([]byte("other"), "n1", "team-a") {
		t.Fatal("keys collide across nodes, namespaces or masters")
	}
}

// A retry of the same key keeps its node (its create may be there).
func TestPlaceRetryKeepsItsNode(t *testing.T) {
	tr := New(Config{Log: logr.Discard()})
	readyNode(tr, "a", 4, 8<<30)
	readyNode(tr, "b", 4, 8<<30)
	first, err := tr.Place(Request{Key: "uid-1", RuntimeClass: "airlock", CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		r, err := tr.Place(Request{Key: "uid-1", RuntimeClass: "airlock", CPUs: 1})
		if err != nil || r.Node != first.Node {
			t.Fatalf("retry placed on %v (%v), first on %s", r, err, first.Node)
		}
	}
}

// Pool events keep a node's pools; a pool of size, ready and filling 0 is
// gone.
func TestPoolEvents(t *testing.T) {
	tr := New(Config{Log: logr.Discard()})
	readyNode(tr, "a", 4, 8<<30)
	tr.apply("a", &api.NodeEvent{Type: "pool", Pool: &api.NodePool{Tenant: "ns", Name: "swp-1", Size: 3, Ready: 2, Filling: 1}})
	s, _ := tr.Node("a")
	if p := s.Pools[PoolKey{"ns", "swp-1"}]; p.Ready != 2 || p.Size != 3 {
		t.Fatalf("pools %+v", s.Pools)
	}
	tr.apply("a", &api.NodeEvent{Type: "pool", Pool: &api.NodePool{Tenant: "ns", Name: "swp-1"}})
	if s, _ := tr.Node("a"); len(s.Pools) != 0 {
		t.Fatalf("a removed pool stays: %+v", s.Pools)
	}
}

// While a create is both reserved and in the node's reported allocation
// (admitted, not yet reported made), others are refused; when the node
// reports it made, or the reservation expires, they are sent again.
func TestWaitersWokenWhenReservationEnds(t *testing.T) {
	for _, how := range []string{"reported", "expired"} {
		t.Run(how, func(t *testing.T) {
			tr := New(Config{Log: logr.Discard()})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go tr.sandboxes.run(ctx)
			readyNode(tr, "a", 2, 8<<30)
			if _, err := tr.Place(Request{Key: "uid-a", RuntimeClass: "airlock", CPUs: 1}); err != nil {
				t.Fatal(err)
			}
			tr.apply("a", &api.NodeEvent{Type: "capacity", Node: &api.Node{Capacity: api.Resources{CPUs: 2, MemoryBytes: 8 << 30}, Allocated: api.Resources{CPUs: 1, Sandboxes: 1}}})
			waiter := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}}
			if _, err := tr.Place(Request{Key: "uid-b", RuntimeClass: "airlock", CPUs: 1, Waiter: waiter}); err == nil {
				t.Fatal("placed while counted twice")
			}
			switch how {
			case "reported":
				tr.apply("a", &api.NodeEvent{Type: "sandbox.created", Sandbox: &api.Sandbox{ID: "s1", ExternalID: "uid-a"}})
			case "expired":
				tr.mu.Lock()
				tr.nodes["a"].reservations["uid-a"].expires = time.Now().Add(-time.Second)
				tr.mu.Unlock()
				tr.expireReservations()
			}
			select {
			case ev := <-tr.SandboxEvents():
				if ev.Object.GetName() != "b" {
					t.Fatalf("sent %s", ev.Object.GetName())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter was not sent")
			}
			if _, err := tr.Place(Request{Key: "uid-b", RuntimeClass: "airlock", CPUs: 1}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
