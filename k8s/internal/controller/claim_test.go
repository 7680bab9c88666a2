package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// claimFixture is a namespace with template "t" (FOO=template), warm pool
// "p" of it, the claims given, and three fake nodes a, b, c.
type claimFixture struct {
	c      client.Client
	w      *writeCounter
	nodes  *fakeNodeView
	r      *ClaimReconciler
	pool   string // the daemon pool's name
	policy extv1.EnvVarsInjectionPolicy
}

func newClaimFixture(t *testing.T, policy extv1.EnvVarsInjectionPolicy, objs ...client.Object) *claimFixture {
	tmpl := airlockTemplate("t", policy)
	bp, err := blueprint.ForTemplate(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	c, w := countingClient(t, append([]client.Object{tmpl, testWarmPool("p", "t", 3)}, objs...)...)
	f := &claimFixture{c: c, w: w, nodes: newFakeNodeView(t, "a", "b", "c"), pool: daemonPoolName("p", bp.Hash)}
	f.r = &ClaimReconciler{Client: c, Scheme: controllerScheme(t), Nodes: f.nodes, Classes: Classes{"airlock": true}}
	return f
}

func (f *claimFixture) reconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: tns, Name: name}})
	if err != nil {
		t.Fatalf("reconcile %s: %v", name, err)
	}
	return res
}

func (f *claimFixture) claim(t *testing.T, name string) *extv1.SandboxClaim {
	t.Helper()
	var c extv1.SandboxClaim
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: name}, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

func (f *claimFixture) sandbox(t *testing.T, name string) *sandboxv1.Sandbox {
	t.Helper()
	var s sandboxv1.Sandbox
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func readyCond(conds []metav1.Condition) *metav1.Condition {
	return meta.FindStatusCondition(conds, string(sandboxv1.SandboxConditionReady))
}

func TestWarmClaimIsThreeWrites(t *testing.T) {
	f := newClaimFixture(t, extv1.EnvVarsInjectionPolicyAllowed, claimOf("c1", "p", extv1.EnvVar{Name: "TASK", Value: "42"}))
	f.nodes.setPool("a", tns, f.pool, 1, 1)
	f.nodes.setPool("b", tns, f.pool, 2, 2) // the most ready entries
	f.reconcile(t, "c1")

	if got := f.w.n; f.w.total() != 3 || got["create Sandbox"] != 1 || got["status Sandbox"] != 1 || got["status SandboxClaim"] != 1 {
		t.Fatalf("writeCounter = %v, want exactly a Sandbox create, its status and the claim's status", got)
	}
	d := f.nodes.daemons["b"]
	if len(d.creates) != 1 {
		t.Fatalf("node b had %d creates, want 1", len(d.creates))
	}
	cr := d.creates[0]
	if cr.Pool != f.pool || !cr.PoolOnly || cr.ExternalID != "claim-uid-c1" {
		t.Fatalf("bind = pool %q pool_only %v external_id %q", cr.Pool, cr.PoolOnly, cr.ExternalID)
	}
	if cr.Env["TASK"] != "42" || cr.Env["FOO"] != "template" {
		t.Fatalf("bind env = %v, want the template's and the claim's", cr.Env)
	}
	if cr.Metadata[nodes.MetaClaim] != "c1" || cr.Metadata[nodes.MetaNamespace] != tns || cr.Metadata[nodes.MetaUID] != "claim-uid-c1" {
		t.Fatalf("bind metadata = %v", cr.Metadata)
	}
	sb := f.sandbox(t, "c1")
	claim := f.claim(t, "c1")
	if !metav1.IsControlledBy(sb, claim) || sb.Labels[sandboxv1.SandboxLaunchTypeLabel] != "warm" || sb.Labels[nodes.LabelClaimUID] != "claim-uid-c1" {
		t.Fatalf("Sandbox owner %v labels %v", sb.OwnerReferences, sb.Labels)
	}
	if sb.Annotations[nodes.AnnotationNode] != "b" || sb.Annotations[nodes.AnnotationSandboxID] != d.made[0].ID || len(sb.Finalizers) != 1 || sb.Finalizers[0] != FinalizerSandbox {
		t.Fatalf("Sandbox annotations %v finalizers %v", sb.Annotations, sb.Finalizers)
	}
	if c := readyCond(sb.Status.Conditions); sb.Status.NodeName != "b" || c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Sandbox status %+v", sb.Status)
	}
	if c := readyCond(claim.Status.Conditions); claim.Status.SandboxStatus.Name != "c1" || c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("claim status %+v", claim.Status)
	}
	// The claim's env is in the Sandbox's spec as well.
	if env := sb.Spec.PodTemplate.Spec.Containers[0].Env; len(env) != 2 || env[1].Name != "TASK" {
		t.Fatalf("Sandbox env %v", env)
	}

	// Bound and unchanged: another pass writeCounter nothing and calls no node.
	f.w.reset()
	f.reconcile(t, "c1")
	if f.w.total() != 0 || len(d.creates) != 1 {
		t.Fatalf("a second pass wrote %v and made %d creates", f.w.n, len(d.creates))
	}
}

func TestClaimGoesToTheNextNodeThenCold(t *testing.T) {
	f := newClaimFixture(t, "", claimOf("c1", "p"), claimOf("c2", "p"))
	// a's snapshot says 1 ready, but its daemon has none left (taken
	// since): failed_precondition, and b has the pool's last one.
	f.nodes.setPool("a", tns, f.pool, 2, 1)
	f.nodes.daemons["a"].pools[tns+"/"+f.pool].ready = 0
	f.nodes.setPool("b", tns, f.pool, 1, 1)
	f.reconcile(t, "c1")
	if sb := f.sandbox(t, "c1"); sb.Annotations[nodes.AnnotationNode] != "b" || sb.Labels[sandboxv1.SandboxLaunchTypeLabel] != "warm" {
		t.Fatalf("c1 on %q launch %q, want warm on b", sb.Annotations[nodes.AnnotationNode], sb.Labels[sandboxv1.SandboxLaunchTypeLabel])
	}
	// No ready entry left anywhere: a cold create from the template.
	f.nodes.setPool("b", tns, f.pool, 1, 0)
	f.reconcile(t, "c2")
	sb := f.sandbox(t, "c2")
	if sb.Labels[sandboxv1.SandboxLaunchTypeLabel] != "cold" || len(f.nodes.placed) != 1 || sb.Annotations[nodes.AnnotationNode] != f.nodes.placed[0] {
		t.Fatalf("c2 launch %q on %q, placed %v", sb.Labels[sandboxv1.SandboxLaunchTypeLabel], sb.Annotations[nodes.AnnotationNode], f.nodes.placed)
	}
	d := f.nodes.daemons[f.nodes.placed[0]]
	last := d.creates[len(d.creates)-1]
	if last.Pool != "" || last.ExternalID != "claim-uid-c2" || last.Limits.CPUs != 0.5 || last.Limits.MemoryBytes != 512<<20 {
		t.Fatalf("cold create = %+v, want the template's body with the claim's external id", last)
	}
}

func TestClaimWithNoNodeIsUnschedulable(t *testing.T) {
	f := newClaimFixture(t, "", claimOf("c1", "p"))
	for _, n := range []string{"a", "b", "c"} {
		f.nodes.setState(n, nodes.StateUnreachable)
	}
	f.reconcile(t, "c1")
	c := readyCond(f.claim(t, "c1").Status.Conditions)
	if c == nil || c.Reason != ReasonUnschedulable || !strings.Contains(c.Message, "0/3 airlock nodes") {
		t.Fatalf("Ready = %+v", c)
	}
}

// A controller that dies between the bind and the Sandbox's create binds
// the same daemon sandbox when it comes back, even where another node now
// has more ready entries.
func TestReplayedBindYieldsTheSameSandbox(t *testing.T) {
	f := newClaimFixture(t, "", claimOf("c1", "p"))
	f.nodes.setPool("a", tns, f.pool, 2, 2)
	type exit struct{ code int }
	f.r.Fault = "exit-after-bind"
	f.r.Exit = func(code int) { panic(exit{code}) }
	func() {
		defer func() {
			if e, ok := recover().(exit); !ok || e.code != 3 {
				t.Fatalf("the fault hook did not exit(3): %v", e)
			}
		}()
		f.reconcile(t, "c1")
	}()
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "c1"}, &sandboxv1.Sandbox{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a Sandbox was made before the crash: %v", err)
	}
	f.r.Fault = ""
	f.nodes.setPool("b", tns, f.pool, 5, 5)
	f.reconcile(t, "c1")
	sb := f.sandbox(t, "c1")
	made := len(f.nodes.daemons["a"].made) + len(f.nodes.daemons["b"].made) + len(f.nodes.daemons["c"].made)
	if made != 1 || sb.Annotations[nodes.AnnotationNode] != "a" || sb.Annotations[nodes.AnnotationSandboxID] != f.nodes.daemons["a"].made[0].ID {
		t.Fatalf("after the replay: %d daemon sandboxes, Sandbox on %q id %q", made, sb.Annotations[nodes.AnnotationNode], sb.Annotations[nodes.AnnotationSandboxID])
	}
	if sb.Labels[sandboxv1.SandboxLaunchTypeLabel] != "warm" {
		t.Fatalf("replayed launch type %q, want warm", sb.Labels[sandboxv1.SandboxLaunchTypeLabel])
	}
}

func TestDisallowedEnvIsRefusedBeforeAnyBind(t *testing.T) {
	f := newClaimFixture(t, "", claimOf("c1", "p", extv1.EnvVar{Name: "X", Value: "1"}))
	f.nodes.setPool("a", tns, f.pool, 1, 1)
	f.reconcile(t, "c1")
	c := readyCond(f.claim(t, "c1").Status.Conditions)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonEnvNotAllowed {
		t.Fatalf("Ready = %+v, want False EnvNotAllowed", c)
	}
	if n := len(f.nodes.daemons["a"].creates); n != 0 {
		t.Fatalf("%d creates on a node", n)
	}
}

func TestClaimCannotWidenTheTemplatesNetwork(t *testing.T) {
	cl := claimOf("c1", "p")
	cl.Spec.AdditionalPodMetadata.Annotations = map[string]string{blueprint.AnnotationNetworkAllow: "evil.example"}
	f := newClaimFixture(t, "", cl)
	f.nodes.setPool("a", tns, f.pool, 1, 1)
	f.reconcile(t, "c1")
	c := readyCond(f.claim(t, "c1").Status.Conditions)
	if c == nil || c.Reason != ReasonInvalidMetadata {
		t.Fatalf("Ready = %+v, want InvalidMetadata", c)
	}
	if n := len(f.nodes.daemons["a"].creates); n != 0 {
		t.Fatalf("%d creates on a node", n)
	}
}

func TestDeletedClaimsSandboxIsDeleted(t *testing.T) {
	f := newClaimFixture(t, "", claimOf("c1", "p"))
	f.nodes.setPool("a", tns, f.pool, 1, 1)
	f.reconcile(t, "c1")
	if err := f.c.Delete(context.Background(), f.claim(t, "c1")); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "c1")
	// The Sandbox finalizer holds it, marked for deletion.
	if sb := f.sandbox(t, "c1"); sb.DeletionTimestamp.IsZero() {
		t.Fatal("the gone claim's Sandbox was not deleted")
	}
}

func TestExpiredClaimRetainKeepsTheClaim(t *testing.T) {
	now := time.Now().Truncate(time.Second) // as the apiserver keeps times
	cl := claimOf("c1", "p")
	cl.Spec.Lifecycle = &extv1.Lifecycle{ShutdownTime: &metav1.Time{Time: now.Add(time.Hour)}}
	f := newClaimFixture(t, "", cl)
	f.nodes.setPool("a", tns, f.pool, 1, 1)
	f.r.Now = func() time.Time { return now }
	res := f.reconcile(t, "c1")
	if res.RequeueAfter != time.Hour {
		t.Fatalf("requeue after %v, want the hour to shutdown", res.RequeueAfter)
	}
	if ttl := f.nodes.daemons["a"].creates[0].TTL; ttl != "1h0m0s" {
		t.Fatalf("daemon ttl %q, want 1h0m0s", ttl)
	}
	now = now.Add(time.Hour)
	f.reconcile(t, "c1")
	if sb := f.sandbox(t, "c1"); sb.DeletionTimestamp.IsZero() {
		t.Fatal("the expired claim's Sandbox was not deleted")
	}
	c := f.claim(t, "c1")
	if r := readyCond(c.Status.Conditions); r == nil || r.Reason != extv1.ClaimExpiredReason || c.Status.SandboxStatus.Name != "" {
		t.Fatalf("claim status %+v", c.Status)
	}
}

func TestExpiredClaimDeletePolicyDeletesIt(t *testing.T) {
	for _, policy := range []extv1.ShutdownPolicy{extv1.ShutdownPolicyDelete, extv1.ShutdownPolicyDeleteForeground} {
		t.Run(string(policy), func(t *testing.T) {
			now := time.Now().Truncate(time.Second)
			cl := claimOf("c1", "p")
			cl.Spec.Lifecycle = &extv1.Lifecycle{ShutdownTime: &metav1.Time{Time: now.Add(time.Minute)}, ShutdownPolicy: policy}
			f := newClaimFixture(t, "", cl)
			f.nodes.setPool("a", tns, f.pool, 1, 1)
			f.r.Now = func() time.Time { return now }
			f.reconcile(t, "c1")
			now = now.Add(time.Minute)
			f.reconcile(t, "c1")
			if sb := f.sandbox(t, "c1"); sb.DeletionTimestamp.IsZero() {
				t.Fatal("the Sandbox was not deleted")
			}
			if policy == extv1.ShutdownPolicyDeleteForeground {
				// The claim goes once its Sandbox has.
				f.claim(t, "c1")
				sb := f.sandbox(t, "c1")
				sb.Finalizers = nil
				if err := f.c.Update(context.Background(), sb); err != nil {
					t.Fatal(err)
				}
				f.reconcile(t, "c1")
			}
			if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "c1"}, &extv1.SandboxClaim{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the claim is still there: %v", err)
			}
		})
	}
}

func TestTTLAfterFinishedExpiresTheClaim(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	ttl := int32(30)
	cl := claimOf("c1", "p")
	cl.Spec.Lifecycle = &extv1.Lifecycle{TTLSecondsAfterFinished: &ttl}
	f := newClaimFixture(t, "", cl)
	f.nodes.setPool("a", tns, f.pool, 1, 1)
	f.r.Now = func() time.Time { return now }
	f.reconcile(t, "c1")
	// The Sandbox finishes (the Sandbox reconciler's write).
	sb := f.sandbox(t, "c1")
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: string(sandboxv1.SandboxConditionFinished), Status: metav1.ConditionTrue, Reason: "Ended", LastTransitionTime: metav1.NewTime(now)})
	if err := f.c.Status().Update(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if res := f.reconcile(t, "c1"); res.RequeueAfter != 30*time.Second {
		t.Fatalf("requeue after %v, want 30s", res.RequeueAfter)
	}
	now = now.Add(30 * time.Second)
	f.reconcile(t, "c1")
	if r := readyCond(f.claim(t, "c1").Status.Conditions); r == nil || r.Reason != extv1.ClaimExpiredReason {
		t.Fatalf("Ready = %+v, want ClaimExpired", r)
	}
}

func TestClaimOfAnotherClassIsUntouched(t *testing.T) {
	other := airlockTemplate("o", extv1.EnvVarsInjectionPolicyAllowed)
	cls := "runc"
	other.Spec.PodTemplate.Spec.RuntimeClassName = &cls
	f := newClaimFixture(t, "", other, testWarmPool("op", "o", 1), claimOf("c1", "op"))
	f.reconcile(t, "c1")
	if f.w.total() != 0 {
		t.Fatalf("writeCounter %v on another class's claim", f.w.n)
	}
}

func TestApplyEnvFollowsThePolicy(t *testing.T) {
	for _, tc := range []struct {
		policy extv1.EnvVarsInjectionPolicy
		env    []extv1.EnvVar
		want   string // FOO's value after, or "error"
	}{
		{"", []extv1.EnvVar{{Name: "BAR", Value: "x"}}, "error"},
		{extv1.EnvVarsInjectionPolicyDisallowed, []extv1.EnvVar{{Name: "BAR", Value: "x"}}, "error"},
		{extv1.EnvVarsInjectionPolicyAllowed, []extv1.EnvVar{{Name: "BAR", Value: "x"}}, "template"},
		{extv1.EnvVarsInjectionPolicyAllowed, []extv1.EnvVar{{Name: "FOO", Value: "claim"}}, "error"},
		{extv1.EnvVarsInjectionPolicyOverrides, []extv1.EnvVar{{Name: "FOO", Value: "claim"}}, "claim"},
		{extv1.EnvVarsInjectionPolicyOverrides, []extv1.EnvVar{{Name: "A=B", Value: "x"}}, "error"},
		{extv1.EnvVarsInjectionPolicyOverrides, []extv1.EnvVar{{Name: "A", Value: "x\x00y"}}, "error"},
		{extv1.EnvVarsInjectionPolicyOverrides, []extv1.EnvVar{{Name: "A", Value: "1"}, {Name: "A", Value: "2"}}, "error"},
		{extv1.EnvVarsInjectionPolicyOverrides, []extv1.EnvVar{{Name: "A", Value: "1", ContainerName: "sidecar"}}, "error"},
		{extv1.EnvVarsInjectionPolicyOverrides, []extv1.EnvVar{{Name: "A", Value: "1", ContainerName: "main"}}, "template"},
		{extv1.EnvVarsInjectionPolicyDisallowed, nil, "template"},
	} {
		spec := airlockTemplate("t", tc.policy).Spec.PodTemplate.Spec
		err := applyEnv(&spec, tc.env, tc.policy)
		got := "error"
		if err == nil {
			got = spec.Containers[0].Env[0].Value
		} else if claimReason(err) != ReasonEnvNotAllowed {
			t.Errorf("%s %v: reason %s", tc.policy, tc.env, claimReason(err))
		}
		if got != tc.want {
			t.Errorf("policy %q env %v: FOO = %s (%v), want %s", tc.policy, tc.env, got, err, tc.want)
		}
	}
}

func TestMergePodMetadataRefusesSystemKeys(t *testing.T) {
	for _, tc := range []struct {
		add sandboxv1.PodMetadata
		ok  bool
	}{
		{sandboxv1.PodMetadata{Labels: map[string]string{"sandbox.users.io/team": "x"}}, true},
		{sandboxv1.PodMetadata{Annotations: map[string]string{"example.com/note": "x"}}, true},
		{sandboxv1.PodMetadata{Labels: map[string]string{"team": "x"}}, false},
		{sandboxv1.PodMetadata{Labels: map[string]string{"agents.x-k8s.io/launch-type": "warm"}}, false},
		{sandboxv1.PodMetadata{Annotations: map[string]string{"airlock.dev/network-allow": "x"}}, false},
		{sandboxv1.PodMetadata{Annotations: map[string]string{"AIRLOCK.DEV/network-allow": "x"}}, false},
		{sandboxv1.PodMetadata{Annotations: map[string]string{"sub.airlock.dev/x": "x"}}, false},
		{sandboxv1.PodMetadata{Annotations: map[string]string{"node.kubernetes.io/x": "x"}}, false},
		{sandboxv1.PodMetadata{Annotations: map[string]string{"kept": "other"}}, false}, // the template's
	} {
		into := sandboxv1.PodMetadata{Annotations: map[string]string{"kept": "template"}}
		err := mergePodMetadata(&into, &tc.add)
		if (err == nil) != tc.ok {
			t.Errorf("%v: err %v, want ok=%v", tc.add, err, tc.ok)
		}
	}
}

// A pass that sees the claim's new Sandbox before its status (the cache
// shows the create before the status write) leaves the claim as the bind
// wrote it: it made a Ready claim SandboxNotReady, a write, and Ready
// again, another.
func TestBoundClaimIsNotRegressedByASandboxWithoutStatus(t *testing.T) {
	f := newClaimFixture(t, "", claimOf("c1", "p"))
	f.nodes.setPool("a", tns, f.pool, 1, 1)
	f.reconcile(t, "c1")
	sb := f.sandbox(t, "c1")
	sb.Status = sandboxv1.SandboxStatus{}
	if err := f.c.Status().Update(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	f.w.reset()
	f.reconcile(t, "c1")
	if f.w.total() != 0 {
		t.Fatalf("writes %v", f.w.n)
	}
	if r := readyCond(f.claim(t, "c1").Status.Conditions); r == nil || r.Status != metav1.ConditionTrue {
		t.Fatalf("claim Ready %+v", r)
	}
}

// A claim's later shutdown time is its Sandbox's, which the Sandbox
// reconciler gives the daemon sandbox (its expiry extended).
func TestClaimShutdownTimeMovesItsSandboxs(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	cl := claimOf("c1", "p")
	cl.Spec.Lifecycle = &extv1.Lifecycle{ShutdownTime: &metav1.Time{Time: now.Add(time.Hour)}}
	f := newClaimFixture(t, "", cl)
	f.nodes.setPool("a", tns, f.pool, 1, 1)
	f.r.Now = func() time.Time { return now }
	f.reconcile(t, "c1")
	if sb := f.sandbox(t, "c1"); sb.Spec.ShutdownTime == nil || !sb.Spec.ShutdownTime.Time.Equal(now.Add(time.Hour)) {
		t.Fatalf("Sandbox shutdownTime %v, want the claim's", sb.Spec.ShutdownTime)
	}
	c := f.claim(t, "c1")
	c.Spec.Lifecycle.ShutdownTime = &metav1.Time{Time: now.Add(2 * time.Hour)}
	if err := f.c.Update(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	f.w.reset()
	f.reconcile(t, "c1")
	if sb := f.sandbox(t, "c1"); sb.Spec.ShutdownTime == nil || !sb.Spec.ShutdownTime.Time.Equal(now.Add(2*time.Hour)) {
		t.Fatalf("Sandbox shutdownTime %v after the claim's moved", sb.Spec.ShutdownTime)
	}
	if f.w.n["update Sandbox"] != 1 {
		t.Fatalf("writes %v", f.w.n)
	}
}
