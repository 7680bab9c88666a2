package gateway

import (
	"context"
	"encoding/json"
	"github.com/airlock-sandbox/airlock/k8s/internal/apiservertest"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// The gateway against a real apiserver: real service-account tokens
// through TokenReview, real RBAC through SubjectAccessReview, the Sandbox
// and AirlockNode from informers, the master from its Secret; the node is
// a fake daemon that answers only the namespace's tenant key.
func TestGatewayOnAnAPIServer(t *testing.T) {
	env := apiservertest.Start(t)
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(env.Config)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"a", "b", "airlock-system"} {
		must(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	}
	must(kube.CoreV1().Secrets("airlock-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: MasterSecret}, Data: map[string][]byte{"master": master}}, metav1.CreateOptions{}))
	for _, sa := range []string{"agent", "nobody"} {
		must(kube.CoreV1().ServiceAccounts("a").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	}
	for _, ns := range []string{"a", "b"} {
		must(kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "exec"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"agents.x-k8s.io"}, Resources: []string{"sandboxes/exec"}, Verbs: []string{"create"}}}}, metav1.CreateOptions{}))
		must(kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "agent-exec"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "exec"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "agent", Namespace: "a"}}}, metav1.CreateOptions{}))
	}

	d := startDaemon(t, "n1")
	must(dyn.Resource(nodesGVR).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "airlock.dev/v1alpha1", "kind": "AirlockNode", "metadata": map[string]any{"name": "n1"},
		"spec": map[string]any{"endpoint": d.node().Endpoint,
			"adminKeySecretRef": map[string]any{"namespace": "airlock-system", "name": "airlock-node-n1", "key": "admin-key"}},
	}}, metav1.CreateOptions{}))
	sandbox := func(ns, id string) string {
		sb, err := dyn.Resource(sandboxesGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": "box", "annotations": map[string]any{annotationNode: "n1", annotationSandboxID: id}},
			"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{
				"runtimeClassName": "airlock", "containers": []any{map[string]any{"name": "c", "image": "host"}}}}},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(sb.GetUID())
	}
	d.sandboxes["sb-1"] = [2]string{wantKey("n1", "a"), sandbox("a", "sb-1")}
	d.sandboxes["sb-2"] = [2]string{wantKey("n1", "b"), sandbox("b", "sb-2")}
	close(d.release)

	dir, err := NewInformerDirectory(ctx, env.Config)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Config{Kube: kube, Directory: dir, Master: SecretMaster(kube, "airlock-system")}))
	defer srv.Close()
	token := func(sa string) string {
		tr, err := kube.CoreV1().ServiceAccounts("a").CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	call := func(method, path, tok string) (int, api.Error, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"cmd":["true"]}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var e api.Error
		json.Unmarshal(b, &e)
		return res.StatusCode, e, string(b)
	}
	agent, nobody := token("agent"), token("nobody")

	// The informers have caught up once both Sandboxes are seen.
	for deadline := time.Now().Add(time.Minute); ; {
		_, okA := dir.Sandbox("a", "box")
		_, okB := dir.Sandbox("b", "box")
		if _, okN := dir.Node("n1"); okA && okB && okN {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the informers never saw the Sandboxes and the node")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _, body := call("POST", "/v1/namespaces/a/sandboxes/box/exec", agent); code != 200 || !strings.Contains(body, `"end"`) {
		t.Fatalf("agent's exec: HTTP %d %s", code, body)
	}
	for _, c := range []struct {
		name, method, path, tok string
		code                    api.Code
	}{
		{"no RBAC", "POST", "/v1/namespaces/a/sandboxes/box/exec", nobody, api.CodePermissionDenied},
		{"another subresource", "GET", "/v1/namespaces/a/sandboxes/box/files", agent, api.CodePermissionDenied},
		{"not a token", "POST", "/v1/namespaces/a/sandboxes/box/exec", "not-a-token", api.CodeUnauthenticated},
		{"no such Sandbox", "POST", "/v1/namespaces/a/sandboxes/nope/exec", agent, api.CodeNotFound},
	} {
		if code, e, body := call(c.method, c.path, c.tok); e.Code != c.code || code != c.code.Status() {
			t.Errorf("%s: HTTP %d %s, want %s", c.name, code, body, c.code)
		}
	}
	// b's Sandbox is reached as b's tenant (the daemon answers sb-2 to b's key only).
	if code, _, body := call("POST", "/v1/namespaces/b/sandboxes/box/exec", agent); code != 200 {
		t.Fatalf("b/box: HTTP %d %s", code, body)
	}
}
