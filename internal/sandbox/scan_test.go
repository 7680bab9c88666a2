package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

const pastedKey = "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"

// Each policy does what it says with a credential in a call, and every
// finding is recorded by rule and fingerprint, never by value.
func TestScanPolicies(t *testing.T) {
	for _, policy := range []string{"block", "redact", "record"} {
		a := &memAudit{}
		s := New(Config{Audit: a, Broker: broker.New(broker.Config{Keys: broker.EphemeralKeys()})})
		argv := []string{"curl", "-H", "Authorization: token " + pastedKey, "https://api.github.com"}
		fields := []field{}
		for i := range argv {
			fields = append(fields, field{"argv", &argv[i]})
		}
		err := s.scanCall(context.Background(), &Principal{Tenant: "t", ScanPolicy: policy}, who{tenant: "t"}, "exec", fields)
		switch policy {
		case "block":
			if !errors.Is(err, errdefs.ErrSecretDetected) || !strings.Contains(err.Error(), "github-pat") || strings.Contains(err.Error(), pastedKey) {
				t.Errorf("block: %v", err)
			}
		case "redact":
			if err != nil || strings.Contains(argv[2], pastedKey) || !strings.Contains(argv[2], "[REDACTED:github-pat]") || argv[0] != "curl" {
				t.Errorf("redact: %v %q", err, argv)
			}
		case "record":
			if err != nil || !strings.Contains(argv[2], pastedKey) {
				t.Errorf("record: %v %q", err, argv)
			}
		}
		if len(a.recs) == 0 {
			t.Fatalf("%s: no finding recorded", policy)
		}
		for _, r := range a.recs {
			if r.Kind != "secret.finding" || strings.Contains(string(r.Data), pastedKey) || !strings.Contains(string(r.Data), `"fingerprint":"hmac:`) {
				t.Errorf("%s: record %s %s", policy, r.Kind, r.Data)
			}
		}
	}
}

// A clean call costs no record; placeholders are not credentials.
func TestScanLeavesCleanCallsAlone(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: a, Broker: broker.New(broker.Config{Keys: broker.EphemeralKeys()})})
	vals := []string{"go", "test", "./...", "GITHUB_TOKEN=alk_" + strings.Repeat("eyJzYngiOiJhYmMifQ", 3) + "." + strings.Repeat("A", 43)}
	fields := []field{}
	for i := range vals {
		fields = append(fields, field{"argv", &vals[i]})
	}
	if err := s.scanCall(context.Background(), &Principal{Tenant: "t"}, who{}, "exec", fields); err != nil || len(a.recs) != 0 {
		t.Errorf("%v, %d records", err, len(a.recs))
	}
}

// Secrets are sealed in the store, bound to their tenant, name and
// version; rotation moves the version and the old sealed value is gone.
func TestSecretsSealedAndRotated(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := New(Config{Store: db, Broker: broker.New(broker.Config{Keys: broker.EphemeralKeys()})})
	p := &Principal{ID: "acme", Tenant: "acme"}
	ctx := context.Background()
	if _, err := s.AddSecret(ctx, p, &api.AddSecret{Name: "k", Value: "v1-value"}); err != nil {
		t.Fatal(err)
	}
	sec, _ := db.GetSecret(ctx, "acme", "k")
	if strings.Contains(string(sec.Sealed), "v1-value") {
		t.Fatal("stored in the clear")
	}
	if _, err := s.RotateSecret(ctx, p, "k", &api.RotateSecret{Value: "v2-value"}); err != nil {
		t.Fatal(err)
	}
	if v, err := s.SecretValue("acme", "k"); err != nil || string(v) != "v2-value" {
		t.Fatalf("after rotation: %q %v", v, err)
	}
	if _, err := s.SecretValue("other", "k"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's: %v", err)
	}
	// A sealed value copied to another tenant's row does not open there.
	_ = db.AddSecret(ctx, store.Secret{Tenant: "other", Name: "k", Version: 2, Sealed: sec.Sealed})
	if _, err := s.SecretValue("other", "k"); err == nil {
		t.Error("a sealed value opened under another tenant")
	}
	if err := s.RemoveSecret(ctx, p, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SecretValue("acme", "k"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after removal: %v", err)
	}
}

// A tenant's new scan policy applies from its key's next call, though
// that key's principal was cached.
func TestUpdateTenantScanPolicy(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := New(Config{Store: db, Broker: broker.New(broker.Config{Keys: broker.EphemeralKeys()})})
	ctx := context.Background()
	admin := &Principal{Admin: true}
	tn, err := s.CreateTenant(ctx, admin, &api.CreateTenant{Name: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Authenticate(ctx, tn.Key)
	if err != nil || p.ScanPolicy != "block" {
		t.Fatalf("%+v %v", p, err)
	}
	if _, err := s.UpdateTenant(ctx, admin, "acme", &api.UpdateTenant{ScanPolicy: "record"}); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Authenticate(ctx, tn.Key); p.ScanPolicy != "record" {
		t.Errorf("after the update: %+v", p)
	}
	if _, err := s.UpdateTenant(ctx, admin, "acme", &api.UpdateTenant{ScanPolicy: "ignore"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a bad policy: %v", err)
	}
	if _, err := s.UpdateTenant(ctx, p, "acme", &api.UpdateTenant{ScanPolicy: "block"}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant changing its own policy: %v", err)
	}
	if _, err := s.UpdateTenant(ctx, admin, "nope", &api.UpdateTenant{ScanPolicy: "block"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a missing tenant: %v", err)
	}
}
