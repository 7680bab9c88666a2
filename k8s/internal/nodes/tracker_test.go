package nodes

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/k8s/internal/daemontest"
)

var master = types.NamespacedName{Namespace: "airlock-system", Name: "airlock-master"}

func testScheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, sandboxv1.AddToScheme, extv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// nodeObjects are an AirlockNode for d and its admin key Secret.
func nodeObjects(d *daemontest.Daemon) []client.Object {
	return []client.Object{
		&v1alpha1.AirlockNode{
			ObjectMeta: metav1.ObjectMeta{Name: d.Name},
			Spec: v1alpha1.AirlockNodeSpec{
				Endpoint:          d.Endpoint(),
				AdminKeySecretRef: v1alpha1.SecretKeyRef{Namespace: "airlock-system", Name: d.Name + "-admin", Key: "key"},
			},
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "airlock-system", Name: d.Name + "-admin"},
			Data:       map[string][]byte{"key": []byte(d.AdminKey + "\n")},
		},
	}
}

type harness struct {
	tr  *Tracker
	c   client.Client
	ctx context.Context
}

func start(t *testing.T, objs []client.Object, daemons ...*daemontest.Daemon) *harness {
	for _, d := range daemons {
		objs = append(objs, nodeObjects(d)...)
	}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.AirlockNode{}, &sandboxv1.Sandbox{}).Build()
	tr := New(Config{
		Client: c, Reader: c, MasterSecret: master, Log: logr.Discard(),
		LostTimeout: 300 * time.Millisecond, SweepInterval: time.Hour, Heartbeat: 100 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	h := &harness{tr, c, ctx}
	for _, d := range daemons {
		h.reconcile(t, d.Name)
	}
	return h
}

func (h *harness) reconcile(t *testing.T, name string) {
	for {
		res, err := h.tr.Reconcile(h.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: name}})
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter == 0 {
			return
		}
		time.Sleep(res.RequeueAfter)
	}
}

// waitFor polls cond (state the tracker reaches on its own goroutines).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *harness) state(name string) State {
	s, _ := h.tr.Node(name)
	return s.State
}

func (h *harness) readyCondition(t *testing.T, name string) *metav1.Condition {
	var an v1alpha1.AirlockNode
	if err := h.c.Get(h.ctx, types.NamespacedName{Name: name}, &an); err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(an.Status.Conditions, v1alpha1.ConditionReady)
}

func hasExternal(d *daemontest.Daemon, ext string) bool {
	for _, s := range d.Sandboxes() {
		if s.ExternalID == ext {
			return true
		}
	}
	return false
}

// A node goes Ready, its status says so, its tenants get derived keys; it
// is Unreachable when its daemon dies, Lost after the timeout, and on its
// return it is fenced (the sandboxes the cluster gave up on are ended)
// before it is Ready again.
func TestNodeLifecycle(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	lostSandbox := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "lost", UID: "uid-lost",
		Annotations: map[string]string{AnnotationNode: "n1"}}}
	h := start(t, []client.Object{lostSandbox}, d)
	waitFor(t, "n1 Ready", func() bool { return h.state("n1") == StateReady })
	waitFor(t, "the Ready status", func() bool {
		c := h.readyCondition(t, "n1")
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonDaemonReady
	})
	var an v1alpha1.AirlockNode
	if err := h.c.Get(h.ctx, types.NamespacedName{Name: "n1"}, &an); err != nil || an.Status.Capacity.CPUs != "2" || an.Status.Daemon.BootID != "boot-1" {
		t.Fatalf("status %+v %v", an.Status, err)
	}

	cl, err := h.tr.Tenant(h.ctx, "n1", "team-a")
	if err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := h.c.Get(h.ctx, master, &sec); err != nil || len(sec.Data[MasterKey]) != 32 {
		t.Fatalf("master secret: %v", err)
	}
	if got, want := d.TenantKeySHA256("team-a"), KeySHA256(TenantKey(sec.Data[MasterKey], "n1", "team-a")); got != want {
		t.Fatalf("tenant key hash %q, want %q", got, want)
	}
	for _, ext := range []string{"uid-lost", "uid-unknown", ""} {
		if _, err := cl.CreateSandbox(h.ctx, &api.CreateSandbox{Image: "host", ExternalID: ext, Limits: api.Limits{CPUs: 0.5, MemoryBytes: 1 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the creates' events", func() bool {
		s, _ := h.tr.Node("n1")
		_, ok := h.tr.DaemonSandbox("n1", "uid-unknown")
		return ok && s.Allocated.CPUs == 1.5
	})

	d.Down()
	waitFor(t, "n1 Unreachable or Lost", func() bool { s := h.state("n1"); return s == StateUnreachable || s == StateLost })
	waitFor(t, "n1 Lost", func() bool { return h.state("n1") == StateLost })
	waitFor(t, "the NodeLost status", func() bool {
		c := h.readyCondition(t, "n1")
		return c != nil && c.Reason == v1alpha1.ReasonNodeLost
	})
	if _, err := h.tr.Place(Request{RuntimeClass: "airlock", CPUs: 0.1}); err == nil {
		t.Fatal("placed on a lost node")
	}

	// the cluster gives the Sandbox up, as the Sandbox reconciler does.
	lostSandbox.Status.Conditions = []metav1.Condition{{Type: string(sandboxv1.SandboxConditionFinished), Status: metav1.ConditionTrue,
		Reason: ReasonNodeLost, LastTransitionTime: metav1.Now()}}
	if err := h.c.Status().Update(h.ctx, lostSandbox); err != nil {
		t.Fatal(err)
	}
	d.Up()
	waitFor(t, "n1 Ready again", func() bool { return h.state("n1") == StateReady })
	left := d.Sandboxes()
	if len(left) != 1 || left[0].ExternalID != "" {
		t.Fatalf("after fencing the node holds %+v, want only the sandbox without an external id", left)
	}
}

// An orphan (no Sandbox or claim has its external id) is ended at the
// second sweep that finds it; a sandbox whose Sandbox is placed elsewhere at
// the first; a live one and a claim's being bound never.
func TestOrphanSweep(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 8, MemoryBytes: 8 << 30})
	objs := []client.Object{
		&sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "live", UID: "uid-live", Annotations: map[string]string{AnnotationNode: "n1"}}},
		&sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "moved", UID: "uid-moved", Annotations: map[string]string{AnnotationNode: "n2"}}},
		&extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "binding", UID: "uid-claim"}},
	}
	h := start(t, objs, d)
	waitFor(t, "n1 Ready", func() bool { return h.state("n1") == StateReady })
	for i, ext := range []string{"uid-live", "uid-moved", "uid-claim", "uid-orphan", ""} {
		d.Add(api.Sandbox{ID: "sb" + string(rune('0'+i)), Tenant: "a", State: "running", ExternalID: ext})
	}
	// another tenant's sandbox naming a's Sandbox's UID is not that
	// Sandbox's.
	d.Add(api.Sandbox{ID: "sbx", Tenant: "b", State: "running", ExternalID: "uid-live"})
	h.tr.sweepAll(h.ctx)
	if !hasID(d, "sbx") {
		t.Error("another tenant's sandbox was ended at the first sweep")
	}
	for ext, want := range map[string]bool{"uid-live": true, "uid-moved": false, "uid-claim": true, "uid-orphan": true} {
		if hasExternal(d, ext) != want {
			t.Errorf("after one sweep: %s there %v, want %v", ext, !want, want)
		}
	}
	h.tr.sweepAll(h.ctx)
	for ext, want := range map[string]bool{"uid-live": true, "uid-claim": true, "uid-orphan": false} {
		if hasExternal(d, ext) != want {
			t.Errorf("after two sweeps: %s there %v, want %v", ext, !want, want)
		}
	}
	if hasID(d, "sbx") {
		t.Error("another tenant's sandbox naming a's Sandbox's UID stays")
	}
	if len(d.Sandboxes()) != 3 {
		t.Fatalf("left %+v", d.Sandboxes())
	}
}

func hasID(d *daemontest.Daemon, id string) bool {
	for _, s := range d.Sandboxes() {
		if s.ID == id {
			return true
		}
	}
	return false
}

// The controller reads no admin key Secret outside its own namespace (it
// would send its value to the node's endpoint).
func TestAdminKeyOnlyFromOwnNamespace(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 1 << 30})
	objs := nodeObjects(d)
	an := objs[0].(*v1alpha1.AirlockNode)
	an.Spec.AdminKeySecretRef.Namespace = "team-a"
	sec := objs[1].(*corev1.Secret)
	sec.Namespace = "team-a"
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).WithStatusSubresource(&v1alpha1.AirlockNode{}).Build()
	tr := New(Config{Client: c, Reader: c, MasterSecret: master, Log: logr.Discard()})
	_, err := tr.connect(context.Background(), &an.Spec)
	if err == nil || !strings.Contains(err.Error(), "not in namespace airlock-system") {
		t.Fatalf("connect: %v", err)
	}
}

// A tenant that exists on the node with another key is given the derived
// one.
func TestTenantKeyReplaced(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 1 << 30})
	d.SetTenant("team-a", KeySHA256("an old key"))
	h := start(t, nil, d)
	waitFor(t, "n1 Ready", func() bool { return h.state("n1") == StateReady })
	cl, err := h.tr.Tenant(h.ctx, "n1", "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ListSandboxes(h.ctx, api.ListSandboxes{}); err != nil {
		t.Fatalf("the derived key does not authenticate: %v", err)
	}
}

// A daemon sandbox's end is sent to its Sandbox (by its metadata).
func TestSandboxEndIsSent(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 1 << 30})
	h := start(t, nil, d)
	waitFor(t, "n1 Ready", func() bool { return h.state("n1") == StateReady })
	d.Add(api.Sandbox{ID: "sb1", Tenant: "a", ExternalID: "u1", Metadata: map[string]string{MetaNamespace: "a", MetaName: "box"}})
	d.End("sb1", "ttl")
	for {
		ev := <-h.tr.SandboxEvents()
		if ev.Object.GetNamespace() == "a" && ev.Object.GetName() == "box" {
			break
		}
	}
	waitFor(t, "the end in the node's view", func() bool {
		s, ok := h.tr.DaemonSandbox("n1", "u1")
		return ok && s.Ended && s.EndReason == "ttl"
	})
}
