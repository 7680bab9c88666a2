package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// tenantKey is the key the controller derives for namespace ns on node n.
func tenantKey(t testing.TB, n *node, ns string) string {
	t.Helper()
	sec := &corev1.Secret{}
	if err := env.c.Get(context.Background(), client.ObjectKey{Namespace: systemNamespace, Name: "airlock-master"}, sec); err != nil {
		t.Fatal(err)
	}
	return nodes.TenantKey(sec.Data["master"], n.name, ns)
}

// tenantClient is a daemon client of node n as namespace ns's tenant.
func tenantClient(t testing.TB, n *node, ns string) *airlock.Client {
	t.Helper()
	c, err := airlock.New(airlock.Config{Address: n.sock, Key: tenantKey(t, n, ns)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNamespacesAreTenants: a Sandbox lives in its namespace's tenant on
// its node; with another namespace's key it does not exist there, and the
// gateway does not find it under another namespace.
func TestNamespacesAreTenants(t *testing.T) {
	sa, sb := newSandbox("a", "tenant-a", "airlock", ""), newSandbox("b", "tenant-b", "airlock", "")
	create(t, sa)
	create(t, sb)
	waitSandbox(t, "a", "tenant-a", "Ready", sandboxReady)
	gotB := waitSandbox(t, "b", "tenant-b", "Ready", sandboxReady)
	nb := nodeByName(t, gotB.Status.NodeName)
	idB := gotB.Annotations[nodes.AnnotationSandboxID]
	for _, d := range nb.sandboxesOf(t, "b") {
		if d.ID == idB && d.ExternalID != string(gotB.UID) {
			t.Errorf("b's sandbox on %s has external id %q; want %s", nb.name, d.ExternalID, gotB.UID)
		}
	}
	if got, err := tenantClient(t, nb, "b").Sandbox(context.Background(), idB); err != nil || got.ID != idB {
		t.Fatalf("b's own key on %s: %v %v", nb.name, got, err)
	}
	// Tenant a on b's node, as the controller makes it there before a's
	// first sandbox (it may have already).
	aKey := tenantKey(t, nb, "a")
	sum := sha256.Sum256([]byte(aKey))
	var ae *api.Error
	if _, err := nb.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: "a", KeySHA256: hex.EncodeToString(sum[:])}); err != nil && (!errors.As(err, &ae) || ae.Code != api.CodeAlreadyExists) {
		t.Fatal(err)
	}
	if _, err := tenantClient(t, nb, "a").Sandbox(context.Background(), idB); !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
		t.Errorf("a's key on %s finds b's sandbox: %v", nb.name, err)
	}
	// The gateway: b's Sandbox asked for under namespace a is not found,
	// like a name nobody made; a's own is served.
	for _, name := range []string{"tenant-b", "nobody-made-this"} {
		if status, body := gatewayDo(t, env.tokens[userAdmin], "GET", "a", name, "files?path=/", nil); status != http.StatusNotFound {
			t.Errorf("a/%s through the gateway: %d %s", name, status, body)
		}
	}
	if status, out, _, body := gatewayExec(t, env.tokens[userAdmin], "a", "tenant-a", "hostname"); status != http.StatusOK || out == "" {
		t.Errorf("a/tenant-a through the gateway: %d %q %s", status, out, body)
	}
}

// TestGatewayRefusesTokenWithoutRBAC: the gateway serves a sandbox only to
// a token whose user RBAC lets use it: none, a forged one and a user
// without RBAC are refused before anything reaches a node; alice, who may
// use sandboxes in a, is refused b's.
func TestGatewayRefusesTokenWithoutRBAC(t *testing.T) {
	create(t, newSandbox("a", "rbac-a", "airlock", ""))
	create(t, newSandbox("b", "rbac-b", "airlock", ""))
	waitSandbox(t, "a", "rbac-a", "Ready", sandboxReady)
	waitSandbox(t, "b", "rbac-b", "Ready", sandboxReady)
	for _, c := range []struct {
		who, token, ns, name string
		want                 int
	}{
		{"no token", "", "a", "rbac-a", http.StatusUnauthorized},
		{"a forged token", "not-a-token-of-this-cluster", "a", "rbac-a", http.StatusUnauthorized},
		{"mallory (no RBAC)", env.tokens[userMallory], "a", "rbac-a", http.StatusForbidden},
		{"alice in b (RBAC in a only)", env.tokens[userAlice], "b", "rbac-b", http.StatusForbidden},
	} {
		status, _, _, body := gatewayExec(t, c.token, c.ns, c.name, "echo", "reached")
		if status != c.want {
			t.Errorf("%s: %d %s; want %d", c.who, status, body, c.want)
		}
		if status == http.StatusForbidden && errorCode([]byte(body)) != string(api.CodePermissionDenied) {
			t.Errorf("%s: refusal %s; want airlock's error JSON, code %s", c.who, body, api.CodePermissionDenied)
		}
	}
	// The same call by alice in a is served (the refusals above are hers
	// and the others' rights, not a broken route).
	if status, out, code, body := gatewayExec(t, env.tokens[userAlice], "a", "rbac-a", "echo", "reached"); status != http.StatusOK || out != "reached\n" || code != 0 {
		t.Errorf("alice in a: %d %q %d %s", status, out, code, body)
	}
}
