package secret

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Secrets are sealed in the store, bound to their tenant, name and
// version; rotation moves the version and the old sealed value is gone.
func TestSecretsSealedAndRotated(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := New(Config{Store: db, Keys: keys.Ephemeral()})
	p := &tenant.Principal{ID: "acme", Tenant: "acme"}
	ctx := context.Background()
	if _, err := s.Add(ctx, p, &api.AddSecret{Name: "k", Value: "v1-value"}); err != nil {
		t.Fatal(err)
	}
	sec, _ := db.GetSecret(ctx, "acme", "k")
	if strings.Contains(string(sec.Sealed), "v1-value") {
		t.Fatal("stored in the clear")
	}
	if _, err := s.Rotate(ctx, p, "k", &api.RotateSecret{Value: "v2-value"}); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Value("acme", "k"); err != nil || string(v) != "v2-value" {
		t.Fatalf("after rotation: %q %v", v, err)
	}
	if _, err := s.Value("other", "k"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's: %v", err)
	}
	// A sealed value copied to another tenant's row does not open there.
	_ = db.AddSecret(ctx, store.Secret{Tenant: "other", Name: "k", Version: 2, Sealed: sec.Sealed})
	if _, err := s.Value("other", "k"); err == nil {
		t.Error("a sealed value opened under another tenant")
	}
	if err := s.Remove(ctx, p, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Value("acme", "k"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after removal: %v", err)
	}
}

// A tenant's secrets are bounded in number (each is a row of the
// daemon's database and a record).
func TestSecretsPerTenantAreCapped(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := New(Config{Store: db, Keys: keys.Ephemeral()})
	p := &tenant.Principal{ID: "t-acme", Tenant: "acme"}
	ctx := context.Background()
	for i := 0; i < MaxSecrets; i++ {
		if _, err := s.Add(ctx, p, &api.AddSecret{Name: fmt.Sprintf("s%d", i), Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = s.Add(ctx, p, &api.AddSecret{Name: "one-more", Value: "v"})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("past the cap: %v", err)
	}
	if _, err := s.Add(ctx, &tenant.Principal{ID: "t-other", Tenant: "other"}, &api.AddSecret{Name: "one-more", Value: "v"}); err != nil {
		t.Errorf("another tenant: %v", err)
	}
}
