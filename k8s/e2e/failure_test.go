package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/api"
	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// sandboxesOn is the Sandboxes of ns placed on node.
func sandboxesOn(objs []client.Object, node string) []*sandboxv1beta1.Sandbox {
	var out []*sandboxv1beta1.Sandbox
	for _, o := range objs {
		if s := o.(*sandboxv1beta1.Sandbox); s.Annotations[nodes.AnnotationNode] == node {
			out = append(out, s)
		}
	}
	return out
}

// claimAll makes claims prefix0..prefix(k-1) on pool at once and waits
// until all are Ready.
func claimAll(t testing.TB, ns, pool, prefix string, k int) []*extv1beta1.SandboxClaim {
	t.Helper()
	claims := make([]*extv1beta1.SandboxClaim, k)
	var wg sync.WaitGroup
	for i := range claims {
		claims[i] = newClaim(ns, fmt.Sprintf("%s%d", prefix, i), pool)
		wg.Add(1)
		go func(c *extv1beta1.SandboxClaim) {
			defer wg.Done()
			if err := env.c.Create(context.Background(), c); err != nil {
				t.Errorf("create claim %s: %v", c.Name, err)
			}
		}(claims[i])
	}
	wg.Wait()
	for _, c := range claims {
		t.Cleanup(func() { remove(t, c) })
	}
	if t.Failed() {
		t.FailNow()
	}
	waitList(t, &extv1beta1.SandboxClaimList{}, fmt.Sprintf("claims %s* Ready", prefix), func(objs []client.Object) bool {
		ready := 0
		for _, o := range objs {
			if c := o.(*extv1beta1.SandboxClaim); len(c.Name) > len(prefix) && c.Name[:len(prefix)] == prefix && claimReady(c) {
				ready++
			}
		}
		return ready == k
	}, client.InNamespace(ns))
	return claims
}

// TestNodeKilled: a node's daemon is killed (kill -9 of its PID). Its
// Sandboxes go Ready=False NodeUnreachable, claims made then bind
// elsewhere, the warm pool is made whole on the other nodes, and once the
// node is lost its Sandboxes are Finished NodeLost. The daemon started
// again on the same state finds the sandboxes it left; the controller
// fences the node before it is Ready: none of what the cluster gave up on
// is left running. The times are logged, not asserted.
func TestNodeKilled(t *testing.T) {
	const ns = "t-kill"
	namespace(t, ns)
	t.Cleanup(func() { noResidue(t, ns) })
	create(t, newTemplate(ns, "tpl", ""))
	create(t, newPool(ns, "swp", "tpl", 6))
	waitPool(t, ns, "swp", 6)
	claimAll(t, ns, "swp", "before", 3)
	first := waitSandbox(t, ns, "before0", "Ready", sandboxReady)
	victim := nodeByName(t, first.Annotations[nodes.AnnotationNode])
	t.Cleanup(func() {
		if victim.p.exited() {
			if err := victim.start(); err != nil {
				t.Error(err)
			}
		}
	})
	objs := waitList(t, &sandboxv1beta1.SandboxList{}, "Sandboxes", func([]client.Object) bool { return true }, client.InNamespace(ns))
	lost := map[string]bool{}
	for _, s := range sandboxesOn(objs, victim.name) {
		lost[string(s.UID)] = true
	}

	t0 := time.Now()
	victim.p.kill9()
	onVictim := func(cond func(*sandboxv1beta1.Sandbox) bool) func([]client.Object) bool {
		return func(objs []client.Object) bool {
			l := sandboxesOn(objs, victim.name)
			for _, s := range l {
				if !cond(s) {
					return false
				}
			}
			return len(l) == len(lost)
		}
	}
	waitList(t, &sandboxv1beta1.SandboxList{}, "the victim's Sandboxes NodeUnreachable", onVictim(func(s *sandboxv1beta1.Sandbox) bool {
		r := condition(s.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
		return r != nil && r.Status == metav1.ConditionFalse && (r.Reason == nodes.ReasonNodeUnreachable || r.Reason == nodes.ReasonNodeLost)
	}), client.InNamespace(ns))
	detected := time.Since(t0)

	after := claimAll(t, ns, "swp", "after", 3)
	for _, c := range after {
		s := waitSandbox(t, ns, c.Name, "Ready", sandboxReady)
		if s.Annotations[nodes.AnnotationNode] == victim.name {
			t.Errorf("claim %s bound on the killed node %s", c.Name, victim.name)
		}
	}
	waitReadyEntries(t, ns, 6)
	restored := time.Since(t0)
	waitPool(t, ns, "swp", 6)

	waitList(t, &sandboxv1beta1.SandboxList{}, "the victim's Sandboxes Finished NodeLost", onVictim(func(s *sandboxv1beta1.Sandbox) bool {
		f := condition(s.Status.Conditions, string(sandboxv1beta1.SandboxConditionFinished))
		return f != nil && f.Status == metav1.ConditionTrue && f.Reason == nodes.ReasonNodeLost
	}), client.InNamespace(ns))
	lostAt := time.Since(t0)

	// The daemon comes back on its own state and adopts what it left.
	t1 := time.Now()
	if err := victim.start(); err != nil {
		t.Fatal(err)
	}
	waitObj(t, &v1alpha1.AirlockNodeList{}, "", victim.name, "the returned node Ready", func(n *v1alpha1.AirlockNode) bool {
		return n != nil && conditionIs(n.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue)
	})
	fenced := time.Since(t1)
	for _, d := range victim.sandboxesOf(t, ns) {
		if lost[d.ExternalID] && d.State != api.StateEnded {
			t.Errorf("%s is Ready again and still runs %s (external id %s) that the cluster gave up on", victim.name, d.ID, d.ExternalID)
		}
	}
	t.Logf("node kill (%s, %d Sandboxes): NodeUnreachable after %v; claims elsewhere and pool whole after %v; NodeLost after %v (timeout %s); restarted, fenced and Ready in %v",
		victim.name, len(lost), detected.Round(time.Millisecond), restored.Round(time.Millisecond), lostAt.Round(time.Millisecond), nodeLostTimeout, fenced.Round(time.Millisecond))
}

// TestControllerRestartMidBurst: the controller is killed (kill -9) while
// a burst of claims binds; the next one finishes the burst. Every claim
// ends Ready on exactly one daemon sandbox, and no daemon sandbox is left
// that no claim owns.
func TestControllerRestartMidBurst(t *testing.T) {
	const ns = "t-burst"
	const k = 16
	namespace(t, ns)
	t.Cleanup(func() { noResidue(t, ns) })
	create(t, newTemplate(ns, "tpl", ""))
	create(t, newPool(ns, "swp", "tpl", 4))
	waitPool(t, ns, "swp", 4)
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		_, _ = waitListErr(&extv1beta1.SandboxClaimList{}, func(objs []client.Object) bool {
			for _, o := range objs {
				if claimReady(o.(*extv1beta1.SandboxClaim)) {
					return true
				}
			}
			return false
		}, waitTimeout, client.InNamespace(ns))
		env.controller.kill9()
	}()
	claims := make([]*extv1beta1.SandboxClaim, k)
	for i := range claims {
		claims[i] = newClaim(ns, fmt.Sprintf("b%02d", i), "swp")
		create(t, claims[i])
	}
	<-killed
	env.ensureController(t)
	waitList(t, &extv1beta1.SandboxClaimList{}, "every claim Ready", func(objs []client.Object) bool {
		ready := 0
		for _, o := range objs {
			if claimReady(o.(*extv1beta1.SandboxClaim)) {
				ready++
			}
		}
		return ready == k
	}, client.InNamespace(ns))
	owned := map[string]bool{}
	for _, c := range claims {
		owned[string(c.UID)] = true
	}
	for _, n := range env.nodes {
		held := map[string]int{}
		for _, d := range n.sandboxesOf(t, ns) {
			if d.ExternalID != "" {
				held[d.ExternalID]++
			}
		}
		for id, count := range held {
			if count > 1 {
				t.Errorf("%s holds %d sandboxes for external id %s", n.name, count, id)
			}
		}
		// What no claim owns goes at the orphan sweeps (two, seconds
		// apart).
		n.waitDaemon(t, ns, "no orphan", func(l []*api.Sandbox) bool {
			for _, d := range l {
				if d.ExternalID != "" && !owned[d.ExternalID] && d.State != api.StateEnded {
					return false
				}
			}
			return true
		})
	}
	perClaim := map[string]int{}
	for _, l := range daemonSandboxes(t, ns) {
		for _, d := range l {
			if owned[d.ExternalID] && d.State != api.StateEnded {
				perClaim[d.ExternalID]++
			}
		}
	}
	for _, c := range claims {
		if perClaim[string(c.UID)] != 1 {
			t.Errorf("claim %s has %d live daemon sandboxes", c.Name, perClaim[string(c.UID)])
		}
	}
}

// TestDeleteEverythingLeavesNoResidue: templates, a pool, claims (warm
// and past the pool, cold) and Sandboxes, all deleted at once, in no
// order: once they are gone no node holds a sandbox or a pool of the
// namespace.
func TestDeleteEverythingLeavesNoResidue(t *testing.T) {
	const ns = "t-all"
	namespace(t, ns)
	objs := []client.Object{newTemplate(ns, "tpl", ""), newPool(ns, "swp", "tpl", 2)}
	for _, o := range objs {
		if err := env.c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	waitPool(t, ns, "swp", 2)
	for i := 0; i < 3; i++ {
		c := newClaim(ns, fmt.Sprintf("c%d", i), "swp")
		if err := env.c.Create(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, c)
		waitClaim(t, ns, c.Name, "Ready", claimReady)
	}
	for i := 0; i < 2; i++ {
		s := newSandbox(ns, fmt.Sprintf("s%d", i), "airlock", "")
		if err := env.c.Create(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, s)
		waitSandbox(t, ns, s.Name, "Ready", sandboxReady)
	}
	var wg sync.WaitGroup
	for _, o := range objs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := env.c.Delete(context.Background(), o); err != nil {
				t.Errorf("delete %s: %v", o.GetName(), err)
			}
		}()
	}
	wg.Wait()
	for _, o := range objs {
		waitGone(t, o)
	}
	// The claims' Sandboxes too.
	waitList(t, &sandboxv1beta1.SandboxList{}, "no Sandbox left", func(l []client.Object) bool { return len(l) == 0 }, client.InNamespace(ns))
	noResidue(t, ns)
}
