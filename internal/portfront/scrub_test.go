package portfront

import (
	"net/http/httptest"
	"testing"
)

// A request signed in by a port token that also carries an airlock or
// E2B key (client.PortClient sends the tenant's key with every request,
// a token URL's included) reaches the sandbox without the key; an
// Authorization of the sandbox's own application is kept.
func TestScrubRemovesAKeyBesideAToken(t *testing.T) {
	for _, v := range []string{
		"Bearer airlock_tenant_c2VjcmV0c2VjcmV0c2VjcmV0",
		"Bearer e2b_0123456789abcdef0123456789abcdef01234567",
		"Bearer airlock_envd_c2VjcmV0",
		// A key a cluster's controller gives a tenant: airlock_ and 64 hex.
		"Bearer airlock_3f1c9a7be2d04c6a8f5e1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a",
	} {
		r := httptest.NewRequest("GET", "/x?airlock_token=pt1.t.1.m", nil)
		r.Header.Set("Authorization", v)
		scrub(r)
		if got := r.Header.Get("Authorization"); got != "" {
			t.Errorf("%q reached the sandbox as %q", v, got)
		}
	}
	r := httptest.NewRequest("GET", "/x", nil)
	r.Header.Set("Authorization", "Basic YXBwOnB3")
	scrub(r)
	if r.Header.Get("Authorization") != "Basic YXBwOnB3" {
		t.Error("the application's own Authorization was removed")
	}
}

// The E2B front's credentials (its X-API-Key, and the envd access token
// that also opens a sandbox's ports) do not reach the sandbox either,
// whichever door the request came through.
func TestScrubRemovesE2BCredentials(t *testing.T) {
	r := httptest.NewRequest("GET", "/x", nil)
	r.Header.Set("X-API-Key", "e2b_0123456789abcdef0123456789abcdef01234567")
	r.Header.Add("X-API-Key", "airlock_tenant_c2VjcmV0")
	r.Header.Add("X-API-Key", "airlock_3f1c9a7be2d04c6a8f5e1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a")
	r.Header.Set("X-Access-Token", "airlock_envd_c2VjcmV0")
	scrub(r)
	if got := r.Header.Values("X-API-Key"); len(got) != 0 {
		t.Errorf("X-API-Key %q reached the sandbox", got)
	}
	if got := r.Header.Get("X-Access-Token"); got != "" {
		t.Errorf("X-Access-Token %q reached the sandbox", got)
	}
}
