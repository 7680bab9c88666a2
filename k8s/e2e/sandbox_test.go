package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// TestSandboxReadyAndExecThroughGateway: a Sandbox of class airlock is
// placed on a node, made there under its namespace's tenant keyed by its
// UID, becomes Ready, runs a command through the gateway for a user whose
// RBAC allows it, and leaves nothing on the node once deleted.
func TestSandboxReadyAndExecThroughGateway(t *testing.T) {
	sb := newSandbox("a", "hello", "airlock", "")
	create(t, sb)
	got := waitSandbox(t, "a", "hello", "Ready", sandboxReady)
	n := nodeByName(t, got.Status.NodeName)
	if got.Annotations[nodes.AnnotationNode] != n.name || got.Annotations[nodes.AnnotationSandboxID] == "" {
		t.Fatalf("annotations %v, node %s", got.Annotations, got.Status.NodeName)
	}
	held := n.sandboxesOf(t, "a")
	if len(held) != 1 || held[0].ID != got.Annotations[nodes.AnnotationSandboxID] || held[0].ExternalID != string(got.UID) {
		t.Fatalf("%s holds %s for tenant a; want one, %s, external id %s", n.name, sandboxList(held), got.Annotations[nodes.AnnotationSandboxID], got.UID)
	}
	status, out, code, body := gatewayExec(t, env.tokens[userAlice], "a", "hello", "echo", "hi")
	if status != http.StatusOK || out != "hi\n" || code != 0 {
		t.Fatalf("exec through the gateway: %d %q exit %d\n%s", status, out, code, body)
	}
	remove(t, sb)
	noResidue(t, "a")
}

// TestOtherRuntimeClassUntouched: Sandboxes of another runtime class, or
// none, get no finalizer, no annotation, no status and nothing on a node,
// while one of class airlock made after them in their namespace is served.
func TestOtherRuntimeClassUntouched(t *testing.T) {
	const ns = "t-other"
	namespace(t, ns)
	foreign := []*sandboxv1beta1.Sandbox{newSandbox(ns, "gvisor", "gvisor", ""), newSandbox(ns, "none", "", "")}
	for _, s := range foreign {
		create(t, s)
	}
	ours := newSandbox(ns, "ours", "airlock", "")
	create(t, ours)
	waitSandbox(t, ns, "ours", "Ready", sandboxReady)
	for _, s := range foreign {
		got := &sandboxv1beta1.Sandbox{}
		if err := env.c.Get(context.Background(), client.ObjectKeyFromObject(s), got); err != nil {
			t.Fatal(err)
		}
		if len(got.Finalizers) != 0 || len(got.Annotations) != 0 || len(got.Status.Conditions) != 0 || got.Status.NodeName != "" {
			t.Errorf("%s was touched: finalizers %v, annotations %v, status %+v", s.Name, got.Finalizers, got.Annotations, got.Status)
		}
		for node, held := range daemonSandboxes(t, ns) {
			for _, d := range held {
				if d.ExternalID == string(got.UID) {
					t.Errorf("%s holds a sandbox for %s", node, s.Name)
				}
			}
		}
	}
}

// TestPlacementRespectsCapacity: 30 Sandboxes of 0.5 CPU on three nodes of
// 2 CPUs: 12 run, at most 4 on a node; the other 18 are unscheduled with
// the reason of every node; two deleted make room for two more.
func TestPlacementRespectsCapacity(t *testing.T) {
	const ns = "t-place"
	namespace(t, ns)
	var all []*sandboxv1beta1.Sandbox
	for i := 0; i < 30; i++ {
		s := newSandbox(ns, fmt.Sprintf("p%02d", i), "airlock", "500m")
		create(t, s)
		all = append(all, s)
	}
	const perNode = nodeCPUs * 2 // of 0.5 CPU
	state := func(objs []client.Object) (ready map[string][]string, unsched []*sandboxv1beta1.Sandbox, settled bool) {
		ready = map[string][]string{}
		total := 0
		for _, o := range objs {
			s := o.(*sandboxv1beta1.Sandbox)
			switch c := condition(s.Status.Conditions, string(sandboxv1beta1.SandboxConditionPodScheduled)); {
			case sandboxReady(s):
				ready[s.Status.NodeName] = append(ready[s.Status.NodeName], s.Name)
				total++
			case c != nil && c.Status == metav1.ConditionFalse && c.Reason == "Unschedulable":
				unsched = append(unsched, s)
			}
		}
		return ready, unsched, total == 3*perNode && len(unsched) == len(objs)-3*perNode
	}
	settled := func(objs []client.Object) bool {
		_, _, ok := state(objs)
		return ok
	}
	objs := waitList(t, &sandboxv1beta1.SandboxList{}, "12 Ready and 18 Unschedulable", settled, client.InNamespace(ns))
	ready, unsched, _ := state(objs)
	for node, l := range ready {
		if len(l) > perNode {
			t.Errorf("%s runs %d sandboxes of 0.5 CPU on %d CPUs: %v", node, len(l), nodeCPUs, l)
		}
		info, err := nodeByName(t, node).admin.Node(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.Allocated.CPUs > info.Capacity.CPUs {
			t.Errorf("%s allocated %v CPUs of %v", node, info.Allocated.CPUs, info.Capacity.CPUs)
		}
	}
	for _, s := range unsched {
		msg := condition(s.Status.Conditions, string(sandboxv1beta1.SandboxConditionPodScheduled)).Message
		if !strings.Contains(msg, "0/3 airlock nodes are available") || !strings.Contains(msg, "3 insufficient cpu") {
			t.Errorf("%s: unschedulable message %q", s.Name, msg)
		}
	}
	// Two deleted: two of the waiting take their place.
	freed := 0
	for _, l := range ready {
		for _, name := range l[:1] {
			for _, s := range all {
				if s.Name == name && freed < 2 {
					remove(t, s)
					freed++
				}
			}
		}
	}
	waitList(t, &sandboxv1beta1.SandboxList{}, "12 Ready again after 2 deleted", settled, client.InNamespace(ns))
}
