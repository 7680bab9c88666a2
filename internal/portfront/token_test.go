package portfront

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// A port token reaches its own tenant's sandbox and port until it
// expires; every other token — another sandbox's, another port's, an
// expired one, one with its expiry or tenant changed, one under another
// key, a deleted tenant's, a malformed one — is refused exactly as a
// missing sandbox is.
func TestTokensAreBoundToTenantSandboxPortAndTime(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	deleted := "t_gone"
	tenants := func(_ context.Context, id string) (*tenant.Principal, error) {
		if id == deleted {
			return nil, errdefs.New(errdefs.ErrUnauthenticated, "this key's tenant has been deleted")
		}
		return &tenant.Principal{ID: id}, nil
	}
	k, err := keys.New([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	p := New(Config{Keys: k, Tenant: tenants, Now: func() time.Time { return now }})
	other := New(Config{Keys: keys.Ephemeral(), Tenant: tenants, Now: func() time.Time { return now }})

	good := p.token("t_alice", "aaaaaaaaaaaa", 8000, now.Add(time.Hour))
	got, err := p.check(context.Background(), good, "aaaaaaaaaaaa", 8000)
	if err != nil || got.ID != "t_alice" {
		t.Fatalf("a good token: %v %v", got, err)
	}
	parts := strings.Split(good, ".")
	refused := map[string]struct {
		tok, id string
		port    int
	}{
		"another sandbox":           {good, "bbbbbbbbbbbb", 8000},
		"another port":              {good, "aaaaaaaaaaaa", 8001},
		"expired":                   {p.token("t_alice", "aaaaaaaaaaaa", 8000, now), "aaaaaaaaaaaa", 8000},
		"expiry moved":              {strings.Join([]string{parts[0], parts[1], "1900000000", parts[3]}, "."), "aaaaaaaaaaaa", 8000},
		"tenant changed":            {strings.Join([]string{parts[0], "t_bob", parts[2], parts[3]}, "."), "aaaaaaaaaaaa", 8000},
		"another key":               {other.token("t_alice", "aaaaaaaaaaaa", 8000, now.Add(time.Hour)), "aaaaaaaaaaaa", 8000},
		"a deleted tenant's":        {p.token(deleted, "aaaaaaaaaaaa", 8000, now.Add(time.Hour)), "aaaaaaaaaaaa", 8000},
		"truncated":                 {good[:len(good)-2], "aaaaaaaaaaaa", 8000},
		"another version":           {"pt0" + good[3:], "aaaaaaaaaaaa", 8000},
		"extra part":                {good + ".x", "aaaaaaaaaaaa", 8000},
		"empty":                     {"", "aaaaaaaaaaaa", 8000},
		"the mac's unused bits set": {strings.Join([]string{parts[0], parts[1], parts[2], parts[3][:len(parts[3])-1] + string(unusedBits(parts[3][len(parts[3])-1]))}, "."), "aaaaaaaaaaaa", 8000},
		"a mac of the right length": {strings.Join([]string{parts[0], parts[1], parts[2], strings.Repeat("A", len(parts[3]))}, "."), "aaaaaaaaaaaa", 8000},
	}
	for name, c := range refused {
		_, err := p.check(context.Background(), c.tok, c.id, c.port)
		want := NotFound(c.id)
		if !errors.Is(err, errdefs.ErrNotFound) || err.Error() != want.Error() {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
}

// The token, wherever it came, never reaches the sandbox; the sandbox's
// own query, cookies and Authorization do (a door removes the key it
// signed the caller in with).
func TestScrubRemovesTheToken(t *testing.T) {
	r := httptest.NewRequest("GET", "/x?a=1&airlock_token=T&b=2&airlock%5Ftoken=U", nil)
	r.Header.Set("Authorization", "Basic app")
	r.Header.Set(TokenHeader, "T")
	r.Header.Set("Cookie", "app=1; "+TokenCookie+"=T; other=2")
	scrub(r)
	if r.URL.RawQuery != "a=1&b=2" || r.Header.Get(TokenHeader) != "" || r.Header.Get("Cookie") != "app=1; other=2" {
		t.Errorf("left: query %q, headers %v", r.URL.RawQuery, r.Header)
	}
	if r.Header.Get("Authorization") != "Basic app" {
		t.Error("a token's caller lost its own Authorization header")
	}
}

// unusedBits is base64url character c with its two unused low bits set
// (the last character of 32 bytes encoded carries 4 bits of data).
func unusedBits(c byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return alphabet[strings.IndexByte(alphabet, c)|3]
}
