package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/api"
	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
)

// nodesReady waits until every node's AirlockNode is Ready.
func (c *cluster) nodesReady() error {
	_, err := waitListErr(&v1alpha1.AirlockNodeList{}, func(objs []client.Object) bool {
		ready := 0
		for _, o := range objs {
			if conditionIs(o.(*v1alpha1.AirlockNode).Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue) {
				ready++
			}
		}
		return ready == len(c.nodes)
	}, waitTimeout)
	return err
}

// namespace makes namespace ns if it is not there. Namespaces stay: this
// cluster has no namespace controller to finish deleting one.
func namespace(t testing.TB, ns string) {
	t.Helper()
	err := env.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: objMeta("", ns)})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// podTemplate is a pod template of one container on the host image, of
// runtime class class, limited to cpu (none: "").
func podTemplate(class, cpu string) sandboxv1beta1.PodTemplate {
	ctr := corev1.Container{Name: "main", Image: "host"}
	if cpu != "" {
		ctr.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
	}
	spec := corev1.PodSpec{Containers: []corev1.Container{ctr}}
	if class != "" {
		spec.RuntimeClassName = &class
	}
	return sandboxv1beta1.PodTemplate{Spec: spec}
}

func newSandbox(ns, name, class, cpu string) *sandboxv1beta1.Sandbox {
	return &sandboxv1beta1.Sandbox{ObjectMeta: objMeta(ns, name),
		Spec: sandboxv1beta1.SandboxSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: podTemplate(class, cpu)}}}
}

func newTemplate(ns, name string, policy extv1beta1.EnvVarsInjectionPolicy) *extv1beta1.SandboxTemplate {
	return &extv1beta1.SandboxTemplate{ObjectMeta: objMeta(ns, name), Spec: extv1beta1.SandboxTemplateSpec{
		SandboxBlueprint:       sandboxv1beta1.SandboxBlueprint{PodTemplate: podTemplate("airlock", "")},
		EnvVarsInjectionPolicy: policy,
	}}
}

func newPool(ns, name, template string, replicas int32) *extv1beta1.SandboxWarmPool {
	return &extv1beta1.SandboxWarmPool{ObjectMeta: objMeta(ns, name), Spec: extv1beta1.SandboxWarmPoolSpec{
		Replicas: &replicas, TemplateRef: extv1beta1.SandboxTemplateRef{Name: template}}}
}

func newClaim(ns, name, pool string, env ...extv1beta1.EnvVar) *extv1beta1.SandboxClaim {
	return &extv1beta1.SandboxClaim{ObjectMeta: objMeta(ns, name), Spec: extv1beta1.SandboxClaimSpec{
		WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: pool}, Env: env}}
}

// create makes obj and, at the test's end, deletes it and waits until it
// is gone (its finalizers done).
func create(t testing.TB, obj client.Object) {
	t.Helper()
	if err := env.c.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() { remove(t, obj) })
}

// remove deletes obj and waits until it is gone.
func remove(t testing.TB, obj client.Object) {
	t.Helper()
	env.ensureController(t)
	err := env.c.Delete(context.Background(), obj)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete %T %s: %v", obj, obj.GetName(), err)
		return
	}
	waitGone(t, obj)
}

// waitGone waits until obj no longer exists.
func waitGone(t testing.TB, obj client.Object) {
	t.Helper()
	list, err := listOf(obj)
	if err != nil {
		t.Fatal(err)
	}
	name := obj.GetName()
	waitList(t, list, fmt.Sprintf("%T %s/%s gone", obj, obj.GetNamespace(), name), func(objs []client.Object) bool {
		return len(objs) == 0
	}, client.InNamespace(obj.GetNamespace()), client.MatchingFields{"metadata.name": name})
}

// listOf is an empty list of obj's kind.
func listOf(obj client.Object) (client.ObjectList, error) {
	gvk, err := env.c.GroupVersionKindFor(obj)
	if err != nil {
		return nil, err
	}
	gvk.Kind += "List"
	o, err := env.scheme.New(gvk)
	if err != nil {
		return nil, err
	}
	return o.(client.ObjectList), nil
}

// waitSandbox waits until cond holds of Sandbox ns/name.
func waitSandbox(t testing.TB, ns, name, what string, cond func(*sandboxv1beta1.Sandbox) bool) *sandboxv1beta1.Sandbox {
	t.Helper()
	return waitObj(t, &sandboxv1beta1.SandboxList{}, ns, name, what, func(s *sandboxv1beta1.Sandbox) bool { return s != nil && cond(s) })
}

func sandboxReady(s *sandboxv1beta1.Sandbox) bool {
	return conditionIs(s.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady), metav1.ConditionTrue)
}

func claimReady(c *extv1beta1.SandboxClaim) bool {
	return conditionIs(c.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady), metav1.ConditionTrue)
}

// waitClaim waits until cond holds of SandboxClaim ns/name.
func waitClaim(t testing.TB, ns, name, what string, cond func(*extv1beta1.SandboxClaim) bool) *extv1beta1.SandboxClaim {
	t.Helper()
	return waitObj(t, &extv1beta1.SandboxClaimList{}, ns, name, what, func(c *extv1beta1.SandboxClaim) bool { return c != nil && cond(c) })
}

// nodeByName is the cluster's node of that name.
func nodeByName(t testing.TB, name string) *node {
	t.Helper()
	for _, n := range env.nodes {
		if n.name == name {
			return n
		}
	}
	t.Fatalf("no node %q", name)
	return nil
}

// daemonSandboxes lists every sandbox of tenant on every node (the admin
// listing), by node name.
func daemonSandboxes(t testing.TB, tenant string) map[string][]*api.Sandbox {
	t.Helper()
	out := map[string][]*api.Sandbox{}
	for _, n := range env.nodes {
		out[n.name] = n.sandboxesOf(t, tenant)
	}
	return out
}

// sandboxesOf lists the node's live sandboxes of tenant (not those ended
// and still on record).
func (n *node) sandboxesOf(t testing.TB, tenant string) []*api.Sandbox {
	t.Helper()
	all, err := n.admin.ListSandboxes(context.Background(), api.ListSandboxes{All: true})
	if err != nil {
		t.Fatalf("%s: list: %v", n.name, err)
	}
	var out []*api.Sandbox
	for _, s := range all {
		if s.Tenant == tenant && s.State != api.StateEnded {
			out = append(out, s)
		}
	}
	return out
}

// poolsOf is the node's daemon pools of tenant.
func (n *node) poolsOf(t testing.TB, tenant string) []api.NodePool {
	t.Helper()
	info, err := n.admin.Node(context.Background())
	if err != nil {
		t.Fatalf("%s: node: %v", n.name, err)
	}
	var out []api.NodePool
	for _, p := range info.Pools {
		if p.Tenant == tenant {
			out = append(out, p)
		}
	}
	return out
}

// noResidue fails the test for any sandbox or daemon pool of tenant left
// on any node.
func noResidue(t testing.TB, tenant string) {
	t.Helper()
	for _, n := range env.nodes {
		if n.p.exited() {
			continue
		}
		for _, s := range n.sandboxesOf(t, tenant) {
			t.Errorf("%s holds sandbox %s of tenant %s (external id %q, state %s)", n.name, s.ID, tenant, s.ExternalID, s.State)
		}
		for _, p := range n.poolsOf(t, tenant) {
			t.Errorf("%s holds pool %s of tenant %s (size %d, ready %d)", n.name, p.Name, tenant, p.Size, p.Ready)
		}
	}
}

// waitDaemon waits until cond holds of the node's sandboxes of tenant: it
// lists them at once and again at every event of the node's event stream
// (a heartbeat at least every second).
func (n *node) waitDaemon(t testing.TB, tenant, what string, cond func([]*api.Sandbox) bool) []*api.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	st, err := n.admin.NodeEvents(ctx, time.Second)
	if err != nil {
		t.Fatalf("%s: events: %v", n.name, err)
	}
	defer st.Close()
	for {
		got := n.sandboxesOf(t, tenant)
		if cond(got) {
			return got
		}
		if _, err := st.Next(); err != nil {
			t.Fatalf("%s: waiting for %s: %v; last seen %s", n.name, what, err, sandboxList(got))
		}
	}
}

func sandboxList(l []*api.Sandbox) string {
	var b strings.Builder
	for _, s := range l {
		fmt.Fprintf(&b, "[%s ext=%q %s] ", s.ID, s.ExternalID, s.State)
	}
	return b.String()
}

// gatewayDo calls the gateway as the holder of token ("": none) on
// sandbox ns/name's path rest; it returns the status and the body.
func gatewayDo(t testing.TB, token, method, ns, name, rest string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, env.gatewayURL+"/v1/namespaces/"+ns+"/sandboxes/"+name+"/"+rest, r)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("gateway %s %s: %v", method, rest, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// gatewayExec runs cmd in sandbox ns/name through the gateway as the holder
// of token: its status, and on 200 its stdout and exit code.
func gatewayExec(t testing.TB, token, ns, name string, cmd ...string) (status int, stdout string, exit int, body string) {
	t.Helper()
	status, b := gatewayDo(t, token, "POST", ns, name, "exec", &api.Exec{Cmd: cmd})
	if status != http.StatusOK {
		return status, "", -1, string(b)
	}
	var out bytes.Buffer
	exit = -1
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev api.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("exec stream line %q: %v", sc.Text(), err)
		}
		out.Write(ev.Stdout)
		if ev.End != nil {
			exit = ev.End.ExitCode
		}
	}
	return status, out.String(), exit, string(b)
}

// errorCode is the code of an airlock error body.
func errorCode(body []byte) string {
	var e api.Error
	_ = json.Unmarshal(body, &e)
	return string(e.Code)
}
