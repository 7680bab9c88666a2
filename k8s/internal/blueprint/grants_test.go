package blueprint

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
)

func withGrants(v string) *sandboxv1.PodTemplate {
	pt := pod("airlock", corev1.Container{Image: "host"}, nil)
	pt.ObjectMeta.Annotations = map[string]string{AnnotationGrants: v}
	return &pt
}

// The annotation's grants become the create's, each naming the daemon
// secret derived from its Secret and key; the Secret keys are listed once.
func TestGrantsMapping(t *testing.T) {
	bp, err := ForPodTemplate(withGrants(`[
		{"secret": "gh-token/token", "host": "api.github.com", "allow": ["GET /repos/**"], "env": "GH", "ttl": "30m"},
		{"secret": "gh-token/token", "host": "github.com", "port": 8443, "allow": ["GET,POST /acme/**"], "scheme": "basic", "username": "x-access-token"},
		{"secret": "api.keys/Api_Key.v1", "host": "api.example.com", "allow": ["POST /v1/*"], "scheme": "raw", "header": "X-Api-Key"}]`))
	if err != nil {
		t.Fatal(err)
	}
	gh, api1 := DaemonSecretName("gh-token", "token"), DaemonSecretName("api.keys", "Api_Key.v1")
	want := []api.Grant{
		{Secret: gh, Host: "api.github.com", Allow: []string{"GET /repos/**"}, Env: "GH", TTL: "30m"},
		{Secret: gh, Host: "github.com", Port: 8443, Allow: []string{"GET,POST /acme/**"}, Scheme: "basic", Username: "x-access-token", Env: "AIRLOCK_GRANT_GH_TOKEN_TOKEN"},
		{Secret: api1, Host: "api.example.com", Allow: []string{"POST /v1/*"}, Scheme: "raw", Header: "X-Api-Key", Env: "AIRLOCK_GRANT_API_KEYS_API_KEY_V1"},
	}
	if !reflect.DeepEqual(bp.Create.Grants, want) {
		t.Fatalf("grants:\n got %+v\nwant %+v", bp.Create.Grants, want)
	}
	wantRefs := []SecretRef{{"gh-token", "token", gh, []string{"api.github.com", "github.com"}}, {"api.keys", "Api_Key.v1", api1, []string{"api.example.com"}}}
	if !reflect.DeepEqual(bp.Secrets, wantRefs) {
		t.Fatalf("secrets: got %+v, want %+v", bp.Secrets, wantRefs)
	}
	// a body's grants are its own copy
	body := bp.Body("x", nil, "1h")
	body.Grants[0].Allow[0] = "DELETE /"
	if bp.Create.Grants[0].Allow[0] != "GET /repos/**" {
		t.Fatal("Body shares the blueprint's grants")
	}
	// the hash covers the grants
	other, err := ForPodTemplate(withGrants(`[{"secret": "gh-token/token", "host": "api.github.com", "allow": ["GET /**"]}]`))
	if err != nil {
		t.Fatal(err)
	}
	if other.Hash == bp.Hash {
		t.Fatal("grants do not change the blueprint hash")
	}
}

// Daemon secret names are valid daemon names (1-64 of a-z 0-9 . _ -,
// starting with a letter or digit), deterministic, and differ by Secret
// and key (no "a/b-c" vs "a-b/c" mix-up).
func TestDaemonSecretName(t *testing.T) {
	long := strings.Repeat("a", 253)
	names := map[string]bool{}
	for _, p := range [][2]string{{"a", "b-c"}, {"a-b", "c"}, {long, long}, {"x", "UPPER_case.key"}} {
		n := DaemonSecretName(p[0], p[1])
		if n != DaemonSecretName(p[0], p[1]) {
			t.Fatalf("%v: not deterministic", p)
		}
		if len(n) > 64 || !strings.HasPrefix(n, "k8s-") || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789._-") != "" {
			t.Fatalf("%v: %q is no daemon secret name", p, n)
		}
		if names[n] {
			t.Fatalf("%v: %q taken by another Secret key", p, n)
		}
		names[n] = true
	}
}

// Whatever the annotation holds that is not a list of well-formed grants
// is refused as Unsupported, naming the annotation.
func TestGrantsRefused(t *testing.T) {
	for _, tc := range []struct{ name, v, why string }{
		{"invalid JSON", `[{"secret": `, "not a JSON list of grants"},
		{"not a list", `{"secret": "a/b", "host": "h", "allow": ["GET /"]}`, "not a JSON list of grants"},
		{"trailing data", `[{"secret": "a/b", "host": "h", "allow": ["GET /"]}] []`, "data after the list"},
		{"unknown field", `[{"secret": "a/b", "host": "h", "allow": ["GET /"], "value": "s3cr3t"}]`, `unknown field "value"`},
		{"empty", `[]`, "names no grant"},
		{"no key", `[{"secret": "a", "host": "h", "allow": ["GET /"]}]`, "want SECRETNAME/KEY"},
		{"two slashes", `[{"secret": "a/b/c", "host": "h", "allow": ["GET /"]}]`, "want SECRETNAME/KEY"},
		{"bad name", `[{"secret": "../etc/b", "host": "h", "allow": ["GET /"]}]`, "want SECRETNAME/KEY"},
		{"upper name", `[{"secret": "Gh/token", "host": "h", "allow": ["GET /"]}]`, `secret name "Gh"`},
		{"bad key", `[{"secret": "gh/to ken", "host": "h", "allow": ["GET /"]}]`, `secret key "to ken"`},
		{"empty key", `[{"secret": "gh/", "host": "h", "allow": ["GET /"]}]`, `secret key ""`},
		{"no host", `[{"secret": "gh/t", "allow": ["GET /"]}]`, "host is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ForPodTemplate(withGrants(tc.v))
			var u *Unsupported
			if !errors.As(err, &u) {
				t.Fatalf("got %v, want Unsupported", err)
			}
			if !strings.Contains(err.Error(), "annotations["+AnnotationGrants+"]") || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("got %q, want the annotation named and %q", err, tc.why)
			}
		})
	}
}
