package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// waitPool waits until the pool's status has ready replicas of want
// replicas.
func waitPool(t testing.TB, ns, name string, want int32) *extv1beta1.SandboxWarmPool {
	t.Helper()
	return waitObj(t, &extv1beta1.SandboxWarmPoolList{}, ns, name, "pool ready", func(p *extv1beta1.SandboxWarmPool) bool {
		return p != nil && p.Status.Replicas == want && p.Status.ReadyReplicas == want
	})
}

// poolShares is, by node, the size and ready entries of the daemon pools
// of tenant.
func poolShares(t testing.TB, tenant string) (size, ready map[string]int) {
	t.Helper()
	size, ready = map[string]int{}, map[string]int{}
	for _, n := range env.nodes {
		if n.p.exited() {
			continue
		}
		for _, p := range n.poolsOf(t, tenant) {
			size[n.name] += p.Size
			ready[n.name] += p.Ready
		}
	}
	return size, ready
}

// waitReadyEntries waits until the running nodes hold want ready entries
// of tenant's daemon pools: it looks at once and again at every event of
// any of their event streams (a heartbeat at least every second). A pool's
// status may lag its nodes (its readyReplicas is written at most every
// few seconds).
func waitReadyEntries(t testing.TB, tenant string, want int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	kick := make(chan struct{}, 1)
	for _, n := range env.nodes {
		if n.p.exited() {
			continue
		}
		st, err := n.admin.NodeEvents(ctx, time.Second)
		if err != nil {
			t.Fatalf("%s: events: %v", n.name, err)
		}
		defer st.Close()
		go func() {
			for {
				if _, err := st.Next(); err != nil {
					return
				}
				select {
				case kick <- struct{}{}:
				default:
				}
			}
		}()
	}
	for {
		_, ready := poolShares(t, tenant)
		total := 0
		for _, k := range ready {
			total += k
		}
		if total == want {
			return ready
		}
		select {
		case <-kick:
		case <-ctx.Done():
			t.Fatalf("waiting for %d ready entries of %s's pools: %v; last %v", want, tenant, ctx.Err(), ready)
		}
	}
}

// TestWarmPoolSpreadsAndScales: a warm pool of 6 on three equal nodes is
// 2/2/2 daemon pool entries, all ready; scaled to 9 through the scale
// subresource (as kubectl scale and an HPA do) it reaches 9, at most
// ceil(9/3)+1 a node; deleted, its daemon pools go.
func TestWarmPoolSpreadsAndScales(t *testing.T) {
	const ns = "t-pool"
	namespace(t, ns)
	create(t, newTemplate(ns, "tpl", ""))
	pool := newPool(ns, "swp", "tpl", 6)
	create(t, pool)
	got := waitPool(t, ns, "swp", 6)
	if got.Status.Selector != sandboxv1beta1.SandboxWarmPoolLabel+"=swp" {
		t.Errorf("selector %q", got.Status.Selector)
	}
	size, ready := poolShares(t, ns)
	for _, n := range env.nodes {
		if size[n.name] != 2 || ready[n.name] != 2 {
			t.Errorf("%s: pool size %d ready %d; want 2 and 2 (all: %v %v)", n.name, size[n.name], ready[n.name], size, ready)
		}
	}
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 9}}
	if err := env.c.SubResource("scale").Update(context.Background(), pool, client.WithSubResourceBody(scale)); err != nil {
		t.Fatal(err)
	}
	waitPool(t, ns, "swp", 9)
	size, ready = poolShares(t, ns)
	total := 0
	for node, k := range size {
		if k > 4 {
			t.Errorf("%s holds %d of 9 (at most ceil(9/3)+1)", node, k)
		}
		total += ready[node]
	}
	if total != 9 {
		t.Errorf("%d ready entries on the nodes; want 9 (%v)", total, ready)
	}
	remove(t, pool)
	noResidue(t, ns)
}

// TestClaimsBindWarmAndRefill: a claim binds a warm entry (launch-type
// warm, its Sandbox named like it, the daemon sandbox keyed by the claim's
// UID), its env reaches the commands run in it, the pool refills; a
// template that disallows env refuses a claim carrying some.
func TestClaimsBindWarmAndRefill(t *testing.T) {
	const ns = "t-claim"
	namespace(t, ns)
	t.Cleanup(func() { noResidue(t, ns) })
	create(t, newTemplate(ns, "tpl", extv1beta1.EnvVarsInjectionPolicyAllowed))
	create(t, newPool(ns, "swp", "tpl", 3))
	waitPool(t, ns, "swp", 3)

	claim := newClaim(ns, "c1", "swp", extv1beta1.EnvVar{Name: "GREETING", Value: "from-the-claim"})
	create(t, claim)
	c := waitClaim(t, ns, "c1", "Ready", claimReady)
	if c.Status.SandboxStatus.Name != "c1" {
		t.Errorf("claim's sandbox %q", c.Status.SandboxStatus.Name)
	}
	sb := waitSandbox(t, ns, "c1", "Ready", sandboxReady)
	if sb.Labels[sandboxv1beta1.SandboxLaunchTypeLabel] != sandboxv1beta1.SandboxLaunchTypeWarm || sb.Labels[extv1beta1.SandboxIDLabel] != string(c.UID) {
		t.Errorf("Sandbox labels %v; want launch-type warm and claim-uid %s", sb.Labels, c.UID)
	}
	if !metav1.IsControlledBy(sb, c) {
		t.Errorf("Sandbox owners %v", sb.OwnerReferences)
	}
	n := nodeByName(t, sb.Annotations[nodes.AnnotationNode])
	bound, err := n.admin.ListSandboxes(context.Background(), api.ListSandboxes{All: true})
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, d := range bound {
		if d.ExternalID == string(c.UID) {
			found++
			if d.ID != sb.Annotations[nodes.AnnotationSandboxID] {
				t.Errorf("daemon sandbox %s; the Sandbox names %s", d.ID, sb.Annotations[nodes.AnnotationSandboxID])
			}
		}
	}
	if found != 1 {
		t.Errorf("%s holds %d sandboxes for the claim", n.name, found)
	}
	status, out, code, body := gatewayExec(t, env.tokens[userAdmin], ns, "c1", "sh", "-c", "echo $GREETING")
	if status != http.StatusOK || out != "from-the-claim\n" || code != 0 {
		t.Errorf("claim env through exec: %d %q exit %d\n%s", status, out, code, body)
	}
	waitPool(t, ns, "swp", 3)

	create(t, newTemplate(ns, "strict", extv1beta1.EnvVarsInjectionPolicyDisallowed))
	create(t, newPool(ns, "strict", "strict", 1))
	waitPool(t, ns, "strict", 1)
	create(t, newClaim(ns, "c2", "strict", extv1beta1.EnvVar{Name: "X", Value: "y"}))
	waitClaim(t, ns, "c2", "Ready=False EnvNotAllowed", func(c *extv1beta1.SandboxClaim) bool {
		r := condition(c.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
		return r != nil && r.Status == metav1.ConditionFalse && r.Reason == "EnvNotAllowed"
	})
}

// TestReplayedBindYieldsOneSandbox: the controller dies right after a
// daemon bind, before the Sandbox exists (the fault hook); the next
// controller replays the bind, keyed by the claim's UID, and gets the same
// daemon sandbox: one, not two.
func TestReplayedBindYieldsOneSandbox(t *testing.T) {
	const ns = "t-replay"
	namespace(t, ns)
	t.Cleanup(func() { noResidue(t, ns) })
	create(t, newTemplate(ns, "tpl", ""))
	create(t, newPool(ns, "swp", "tpl", 2))
	waitPool(t, ns, "swp", 2)
	env.restartController(t, "AIRLOCK_K8S_FAULT=exit-after-bind")
	claim := newClaim(ns, "c1", "swp")
	create(t, claim)
	if code := env.controller.exitCode(); code != 3 {
		t.Fatalf("the faulty controller exited %d; want 3 (its fault hook)", code)
	}
	if err := env.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "c1"}, &sandboxv1beta1.Sandbox{}); err == nil {
		t.Fatal("a Sandbox exists: the fault came after it")
	}
	held := func() (ids []string) {
		for _, l := range daemonSandboxes(t, ns) {
			for _, d := range l {
				if d.ExternalID == string(claim.UID) {
					ids = append(ids, d.ID)
				}
			}
		}
		return ids
	}
	before := held()
	if len(before) != 1 {
		t.Fatalf("after the bind the nodes hold %v for the claim; want one", before)
	}
	env.restartController(t)
	waitClaim(t, ns, "c1", "Ready", claimReady)
	sb := waitSandbox(t, ns, "c1", "Ready", sandboxReady)
	after := held()
	if len(after) != 1 || after[0] != before[0] || sb.Annotations[nodes.AnnotationSandboxID] != before[0] {
		t.Fatalf("after the replay: %v, the Sandbox names %s; want only %s", after, sb.Annotations[nodes.AnnotationSandboxID], before[0])
	}
}
