package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
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
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

type harness struct {
	t   *testing.T
	c   client.Client
	tr  *nodes.Tracker
	r   *SandboxReconciler
	ctx context.Context
	now time.Time
}

func start(t *testing.T, daemons ...*daemontest.Daemon) *harness {
	return startTracker(t, true, daemons...)
}

// startTracker starts a tracker on the daemons' AirlockNodes; connect:
// and has it reach them.
func startTracker(t *testing.T, connect bool, daemons ...*daemontest.Daemon) *harness {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, sandboxv1.AddToScheme, extv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	var objs []client.Object
	for _, d := range daemons {
		objs = append(objs,
			&v1alpha1.AirlockNode{
				ObjectMeta: metav1.ObjectMeta{Name: d.Name},
				Spec: v1alpha1.AirlockNodeSpec{Endpoint: d.Endpoint(),
					AdminKeySecretRef: v1alpha1.SecretKeyRef{Namespace: "airlock-system", Name: d.Name, Key: "key"}},
			},
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "airlock-system", Name: d.Name}, Data: map[string][]byte{"key": []byte(d.AdminKey)}})
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.AirlockNode{}, &sandboxv1.Sandbox{}).Build()
	tr := nodes.New(nodes.Config{
		Client: c, Reader: c, MasterSecret: types.NamespacedName{Namespace: "airlock-system", Name: "airlock-master"},
		LostTimeout: 300 * time.Millisecond, SweepInterval: time.Hour, Heartbeat: 100 * time.Millisecond, Log: logr.Discard(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	h := &harness{t: t, c: c, tr: tr, ctx: ctx, now: time.Now()}
	h.r = &SandboxReconciler{Client: c, Nodes: tr, Classes: Classes{"airlock": true, "airlock-gvisor": true}, Log: logr.Discard(),
		Now: func() time.Time { return h.now }}
	if connect {
		h.connect(daemons...)
	}
	return h
}

// connect has the tracker follow the daemons' AirlockNodes, and waits for
// them Ready.
func (h *harness) connect(daemons ...*daemontest.Daemon) {
	t, tr, ctx := h.t, h.tr, h.ctx
	for _, d := range daemons {
		for {
			res, err := tr.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: d.Name}})
			if err != nil {
				t.Fatal(err)
			}
			if res.RequeueAfter == 0 {
				break
			}
			time.Sleep(res.RequeueAfter)
		}
		h.waitFor(d.Name+" Ready", func() bool { s, _ := tr.Node(d.Name); return s.State == nodes.StateReady })
	}
}

func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitEvent waits for the tracker to send Sandbox name.
func (h *harness) awaitEvent(name string) {
	h.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-h.tr.SandboxEvents():
			if ev.Object.GetName() == name {
				return
			}
		case <-timeout:
			h.t.Fatalf("no event for Sandbox %s", name)
		}
	}
}

func sandbox(name, class string, edit func(*sandboxv1.Sandbox)) *sandboxv1.Sandbox {
	s := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("uid-" + name)}}
	s.Spec.PodTemplate.Spec = corev1.PodSpec{RuntimeClassName: &class, Containers: []corev1.Container{{Name: "main", Image: "host"}}}
	if edit != nil {
		edit(s)
	}
	return s
}

func (h *harness) create(s *sandboxv1.Sandbox) {
	h.t.Helper()
	if err := h.c.Create(h.ctx, s); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) reconcile(name string) ctrl.Result {
	h.t.Helper()
	res, err := h.r.Reconcile(h.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: name}})
	if err != nil {
		h.t.Fatalf("reconcile %s: %v", name, err)
	}
	return res
}

func (h *harness) get(name string) *sandboxv1.Sandbox {
	h.t.Helper()
	var s sandboxv1.Sandbox
	if err := h.c.Get(h.ctx, types.NamespacedName{Namespace: "team-a", Name: name}, &s); err != nil {
		h.t.Fatal(err)
	}
	return &s
}

func cond(s *sandboxv1.Sandbox, typ sandboxv1.ConditionType) metav1.Condition {
	if c := meta.FindStatusCondition(s.Status.Conditions, string(typ)); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func TestOtherRuntimeClassIsLeftAlone(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("runc", "runc", nil))
	h.create(sandbox("none", "", func(s *sandboxv1.Sandbox) { s.Spec.PodTemplate.Spec.RuntimeClassName = nil }))
	for _, n := range []string{"runc", "none"} {
		h.reconcile(n)
		s := h.get(n)
		if len(s.Finalizers) != 0 || len(s.Status.Conditions) != 0 || len(s.Annotations) != 0 {
			t.Fatalf("%s was touched: %+v", n, s)
		}
	}
	if d.Creates != 0 {
		t.Fatal("a daemon sandbox was made")
	}
}

func TestSandboxIsPlacedAndReady(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("box", "airlock", func(s *sandboxv1.Sandbox) {
		s.Spec.PodTemplate.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "1"}}
	}))
	h.reconcile("box")
	s := h.get("box")
	if s.Annotations[nodes.AnnotationNode] != "n1" || s.Annotations[nodes.AnnotationSandboxID] == "" {
		t.Fatalf("annotations %v", s.Annotations)
	}
	if s.Status.NodeName != "n1" || cond(s, sandboxv1.SandboxConditionReady).Status != metav1.ConditionTrue ||
		cond(s, sandboxv1.SandboxConditionPodScheduled).Status != metav1.ConditionTrue || s.Finalizers[0] != FinalizerSandbox {
		t.Fatalf("status %+v finalizers %v", s.Status, s.Finalizers)
	}
	sbs := d.Sandboxes()
	if len(sbs) != 1 || sbs[0].ExternalID != "uid-box" || sbs[0].Tenant != "team-a" || sbs[0].ID != s.Annotations[nodes.AnnotationSandboxID] ||
		sbs[0].Metadata[nodes.MetaName] != "box" || sbs[0].Limits.CPUs != 0.25 {
		t.Fatalf("daemon sandboxes %+v", sbs)
	}
	rv := s.ResourceVersion
	h.reconcile("box")
	if s := h.get("box"); s.ResourceVersion != rv || d.Creates != 1 {
		t.Fatalf("a second reconcile wrote (rv %s → %s) or created (%d)", rv, s.ResourceVersion, d.Creates)
	}
}

// A create whose annotations were never written (a crash, a failed write)
// is found again, not made twice.
func TestLostAnnotationsMakeNoSecondSandbox(t *testing.T) {
	d1 := daemontest.Start(t, "n1", api.Resources{CPUs: 4, MemoryBytes: 4 << 30})
	d2 := daemontest.Start(t, "n2", api.Resources{CPUs: 4, MemoryBytes: 4 << 30})
	h := start(t, d1, d2)
	h.create(sandbox("box", "airlock", nil))
	h.reconcile("box")
	s := h.get("box")
	node, id := s.Annotations[nodes.AnnotationNode], s.Annotations[nodes.AnnotationSandboxID]
	h.waitFor("the create's event", func() bool { _, _, ok := h.tr.Locate("uid-box"); return ok })
	delete(s.Annotations, nodes.AnnotationNode)
	delete(s.Annotations, nodes.AnnotationSandboxID)
	if err := h.c.Update(h.ctx, s); err != nil {
		t.Fatal(err)
	}
	h.reconcile("box")
	s = h.get("box")
	if s.Annotations[nodes.AnnotationNode] != node || s.Annotations[nodes.AnnotationSandboxID] != id || d1.Creates+d2.Creates != 1 {
		t.Fatalf("after the replay: %v, creates %d", s.Annotations, d1.Creates+d2.Creates)
	}
}

func TestUnschedulableSaysWhy(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 0.5, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("big", "airlock", func(s *sandboxv1.Sandbox) {
		s.Spec.PodTemplate.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
	}))
	h.reconcile("big")
	s := h.get("big")
	c := cond(s, sandboxv1.SandboxConditionPodScheduled)
	if c.Status != metav1.ConditionFalse || c.Reason != ReasonUnschedulable || c.Message != "0/1 airlock nodes are available: 1 insufficient cpu" {
		t.Fatalf("PodScheduled %+v", c)
	}
	if s.Annotations[nodes.AnnotationNode] != "" || d.Creates != 0 {
		t.Fatal("placed anyway")
	}
}

// A sandbox waiting for capacity is sent again when capacity frees.
func TestUnschedulableIsRetriedWhenCapacityFrees(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 0.5, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("a", "airlock", nil))
	h.create(sandbox("b", "airlock", nil))
	h.create(sandbox("c", "airlock", nil))
	for _, n := range []string{"a", "b", "c"} {
		h.reconcile(n)
	}
	if cond(h.get("c"), sandboxv1.SandboxConditionPodScheduled).Reason != ReasonUnschedulable {
		t.Fatal("c was placed past capacity")
	}
	d.End(h.get("a").Annotations[nodes.AnnotationSandboxID], "ttl")
	h.awaitEvent("c")
	h.reconcile("c")
	if cond(h.get("c"), sandboxv1.SandboxConditionReady).Status != metav1.ConditionTrue {
		t.Fatalf("c after capacity freed: %+v", h.get("c").Status)
	}
}

func TestUnsupportedNamesTheField(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("vol", "airlock", func(s *sandboxv1.Sandbox) {
		s.Spec.PodTemplate.Spec.Volumes = []corev1.Volume{{Name: "data"}}
	}))
	h.reconcile("vol")
	c := cond(h.get("vol"), sandboxv1.SandboxConditionReady)
	if c.Reason != ReasonUnsupported || !strings.Contains(c.Message, "spec.podTemplate.spec.volumes") || d.Creates != 0 {
		t.Fatalf("Ready %+v, creates %d", c, d.Creates)
	}
}

func TestDeleteEndsTheDaemonSandbox(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("box", "airlock", nil))
	h.reconcile("box")
	if err := h.c.Delete(h.ctx, h.get("box")); err != nil {
		t.Fatal(err)
	}
	h.reconcile("box")
	if err := h.c.Get(h.ctx, types.NamespacedName{Namespace: "team-a", Name: "box"}, &sandboxv1.Sandbox{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Sandbox stays: %v", err)
	}
	if len(d.Sandboxes()) != 0 {
		t.Fatalf("the daemon still holds %+v", d.Sandboxes())
	}
}

func TestDaemonSandboxEndFinishes(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("box", "airlock", nil))
	h.reconcile("box")
	d.End(h.get("box").Annotations[nodes.AnnotationSandboxID], "idle_timeout")
	h.waitFor("the end event", func() bool { s, _ := h.tr.DaemonSandbox("n1", "uid-box"); return s.Ended })
	h.reconcile("box")
	s := h.get("box")
	f := cond(s, sandboxv1.SandboxConditionFinished)
	if f.Status != metav1.ConditionTrue || !strings.Contains(f.Message, "idle_timeout") || cond(s, sandboxv1.SandboxConditionReady).Status != metav1.ConditionFalse {
		t.Fatalf("status %+v", s.Status)
	}
}

func TestNodeUnreachableThenLost(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("box", "airlock", nil))
	h.reconcile("box")
	d.Down()
	h.waitFor("n1 unreachable", func() bool { s, _ := h.tr.Node("n1"); return s.State != nodes.StateReady })
	if s, _ := h.tr.Node("n1"); s.State == nodes.StateUnreachable {
		h.reconcile("box")
		if c := cond(h.get("box"), sandboxv1.SandboxConditionReady); c.Reason != nodes.ReasonNodeUnreachable || c.Status != metav1.ConditionFalse {
			t.Fatalf("Ready while unreachable: %+v", c)
		}
	}
	h.waitFor("n1 lost", func() bool { s, _ := h.tr.Node("n1"); return s.State == nodes.StateLost })
	h.reconcile("box")
	s := h.get("box")
	if f := cond(s, sandboxv1.SandboxConditionFinished); f.Status != metav1.ConditionTrue || f.Reason != nodes.ReasonNodeLost {
		t.Fatalf("Finished after the loss: %+v", f)
	}
	// deleting it does not wait for the lost node.
	if err := h.c.Delete(h.ctx, s); err != nil {
		t.Fatal(err)
	}
	h.reconcile("box")
	if err := h.c.Get(h.ctx, types.NamespacedName{Namespace: "team-a", Name: "box"}, &sandboxv1.Sandbox{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Sandbox stays: %v", err)
	}
}

func TestShutdownRetain(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	at := metav1.NewTime(h.now.Add(time.Hour))
	h.create(sandbox("box", "airlock", func(s *sandboxv1.Sandbox) { s.Spec.ShutdownTime = &at }))
	if res := h.reconcile("box"); res.RequeueAfter <= 59*time.Minute || res.RequeueAfter > time.Hour {
		t.Fatalf("requeue after %v, want the shutdown time", res.RequeueAfter)
	}
	h.now = h.now.Add(2 * time.Hour)
	h.reconcile("box")
	s := h.get("box")
	if c := cond(s, sandboxv1.SandboxConditionReady); c.Reason != sandboxv1.SandboxReasonExpired || c.Status != metav1.ConditionFalse {
		t.Fatalf("Ready after expiry: %+v", c)
	}
	if meta.FindStatusCondition(s.Status.Conditions, string(sandboxv1.SandboxConditionPodScheduled)) != nil || s.Status.NodeName != "" {
		t.Fatalf("live status kept: %+v", s.Status)
	}
	if len(d.Sandboxes()) != 0 {
		t.Fatal("the daemon sandbox outlived its shutdown time")
	}
}

func TestShutdownDelete(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	at := metav1.NewTime(h.now.Add(time.Minute))
	del := sandboxv1.ShutdownPolicyDelete
	h.create(sandbox("box", "airlock", func(s *sandboxv1.Sandbox) { s.Spec.ShutdownTime, s.Spec.ShutdownPolicy = &at, &del }))
	h.reconcile("box")
	if ttl := d.Sandboxes()[0]; ttl.ExternalID != "uid-box" {
		t.Fatalf("daemon %+v", ttl)
	}
	h.now = h.now.Add(2 * time.Minute)
	h.reconcile("box") // deletes
	h.reconcile("box") // finalizes
	if err := h.c.Get(h.ctx, types.NamespacedName{Namespace: "team-a", Name: "box"}, &sandboxv1.Sandbox{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Sandbox stays: %v", err)
	}
	if len(d.Sandboxes()) != 0 {
		t.Fatal("the daemon sandbox stays")
	}
}

// A Sandbox a claim made (annotated, Ready) is only kept: no create, no
// write while all is well.
func TestClaimMadeSandboxIsOnlyKept(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	cl, err := h.tr.Tenant(h.ctx, "n1", "team-a")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := cl.CreateSandbox(h.ctx, &api.CreateSandbox{Image: "host", ExternalID: "uid-claim", Limits: api.Limits{CPUs: 0.25, MemoryBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	s := sandbox("claimed", "airlock", func(s *sandboxv1.Sandbox) {
		s.Annotations = map[string]string{nodes.AnnotationNode: "n1", nodes.AnnotationSandboxID: sb.ID}
		s.Finalizers = []string{FinalizerSandbox}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: extv1.GroupVersion.String(), Kind: "SandboxClaim", Name: "claimed", UID: "uid-claim", Controller: &yes}}
	})
	s.CreationTimestamp = metav1.NewTime(time.Now())
	h.create(s)
	// Just made: the claim's bind writes the first status, not this
	// reconciler (one write a warm claim, not two).
	rv := h.get("claimed").ResourceVersion
	h.reconcile("claimed")
	if got := h.get("claimed"); got.ResourceVersion != rv || len(got.Status.Conditions) != 0 {
		t.Fatalf("the reconciler wrote a claim's Sandbox's first status (rv %s → %s)", rv, got.ResourceVersion)
	}
	// Left without one past the wait (its controller died before the
	// write): the reconciler writes it, or the claim would wait forever.
	h.r.Now = func() time.Time { return time.Now().Add(claimStatusWait) }
	h.reconcile("claimed")
	if c := cond(h.get("claimed"), sandboxv1.SandboxConditionReady); c.Status != metav1.ConditionTrue {
		t.Fatalf("a claim's Sandbox left without status is not made Ready: %+v", c)
	}
	h.r.Now = nil
	s = h.get("claimed")
	MarkReady(s, "n1")
	if err := h.c.Status().Update(h.ctx, s); err != nil {
		t.Fatal(err)
	}
	rv = h.get("claimed").ResourceVersion
	h.reconcile("claimed")
	if got := h.get("claimed"); got.ResourceVersion != rv || d.Creates != 1 {
		t.Fatalf("wrote (rv %s → %s) or created (%d)", rv, got.ResourceVersion, d.Creates)
	}
	d.End(sb.ID, "ttl")
	h.waitFor("the end event", func() bool { s, _ := h.tr.DaemonSandbox("n1", "uid-claim"); return s.Ended })
	h.reconcile("claimed")
	if f := cond(h.get("claimed"), sandboxv1.SandboxConditionFinished); f.Status != metav1.ConditionTrue {
		t.Fatalf("the claim's Sandbox did not finish: %+v", f)
	}
}

// A removed AirlockNode's Sandboxes are given up as on a lost node.
func TestRemovedNodeGivesItsSandboxesUp(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.create(sandbox("box", "airlock", nil))
	h.reconcile("box")
	if err := h.c.Delete(h.ctx, &v1alpha1.AirlockNode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.tr.Reconcile(h.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	h.awaitEvent("box")
	h.reconcile("box")
	if f := cond(h.get("box"), sandboxv1.SandboxConditionFinished); f.Status != metav1.ConditionTrue || f.Reason != nodes.ReasonNodeLost {
		t.Fatalf("Finished %+v", f)
	}
}

// A shutdown time moved after placement moves the daemon sandbox's expiry
// (else the daemon would end it at the first one).
func TestShutdownTimeMovedExtends(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	h.now = time.Now()
	at := metav1.NewTime(h.now.Add(time.Hour))
	h.create(sandbox("box", "airlock", func(s *sandboxv1.Sandbox) { s.Spec.ShutdownTime = &at }))
	h.reconcile("box")
	if exp := d.Sandboxes()[0].Expires; exp.Sub(h.now) > time.Hour+time.Minute {
		t.Fatalf("expiry %v, want in an hour", exp)
	}
	s := h.get("box")
	later := metav1.NewTime(h.now.Add(3 * time.Hour))
	s.Spec.ShutdownTime = &later
	s.Generation++ // the apiserver's doing; the fake client keeps it
	if err := h.c.Update(h.ctx, s); err != nil {
		t.Fatal(err)
	}
	h.reconcile("box")
	if exp := d.Sandboxes()[0].Expires; exp.Sub(h.now) < 3*time.Hour-time.Minute {
		t.Fatalf("expiry %v after the shutdown time moved to %v", exp, later)
	}
	h.reconcile("box")
	if c := cond(h.get("box"), sandboxv1.SandboxConditionReady); c.ObservedGeneration != h.get("box").Generation || c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v", c)
	}
}

// Just after a start, before the tracker has reached a node, a Sandbox on
// it is neither unreachable nor lost: it waits, unchanged.
func TestStartWaitsForTheNodes(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := startTracker(t, false, d)
	d.SetTenant("team-a", "0000000000000000000000000000000000000000000000000000000000000000")
	d.Add(api.Sandbox{ID: "sb1", Tenant: "team-a", State: "running", ExternalID: "uid-box"})
	s := sandbox("box", "airlock", func(s *sandboxv1.Sandbox) {
		s.Annotations = map[string]string{nodes.AnnotationNode: "n1", nodes.AnnotationSandboxID: "sb1"}
		s.Finalizers = []string{FinalizerSandbox}
	})
	h.create(s)
	MarkReady(s, "n1")
	if err := h.c.Status().Update(h.ctx, s); err != nil {
		t.Fatal(err)
	}
	rv := h.get("box").ResourceVersion
	if res := h.reconcile("box"); res.RequeueAfter == 0 {
		t.Fatal("no retry while the tracker has not reached the node")
	}
	if got := h.get("box"); got.ResourceVersion != rv {
		t.Fatalf("written before the node was reached: %+v", got.Status.Conditions)
	}
	h.connect(d)
	h.waitFor("the view complete", h.tr.AllSynced)
	if res := h.reconcile("box"); res.RequeueAfter != 0 {
		t.Fatalf("still waiting: %+v", res)
	}
	if c := cond(h.get("box"), sandboxv1.SandboxConditionReady); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v", c)
	}
}
