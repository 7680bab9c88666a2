package tenant

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// controllerKey is a key of the shape a cluster's controller gives its
// tenants: airlock_ and 64 hex digits; and its digest as the API takes it.
func controllerKey(t *testing.T) (key, digest string) {
	t.Helper()
	var b [32]byte
	_, _ = rand.Read(b[:])
	key = "airlock_" + hex.EncodeToString(b[:])
	h := sha256.Sum256([]byte(key))
	return key, hex.EncodeToString(h[:])
}

// A tenant made with a key its creator holds (by the key's SHA-256) signs
// in with that key, and its creation shows no key; a digest of another
// shape, or of a key the daemon already knows, is refused. A key
// replaced by an update stops working at once, though its principal was
// cached; the records say what happened and hold neither key nor digest.
func TestTenantWithCallerKey(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	log := &memAudit{}
	s := New(Config{Store: db, Audit: record.New(log, nil), Sandboxes: &fakeSandboxes{live: map[string]int{}}})
	ctx := context.Background()
	admin := &Principal{Admin: true}
	k1, d1 := controllerKey(t)
	tn, err := s.Create(ctx, admin, &api.CreateTenant{Name: "ns-a", KeySHA256: d1})
	if err != nil {
		t.Fatal(err)
	}
	if tn.Key != "" {
		t.Errorf("the answer carries a key: %q", tn.Key)
	}
	p, err := s.Authenticate(ctx, k1, "")
	if err != nil || p.ID != tn.ID || p.Admin {
		t.Fatalf("the caller's key signs in as %+v %v", p, err)
	}
	for name, d := range map[string]string{
		"upper case": strings.ToUpper(d1),
		"short":      d1[:63],
		"long":       d1 + "0",
		"not hex":    "g" + d1[1:],
		"the key":    k1,
	} {
		if _, err := s.Create(ctx, admin, &api.CreateTenant{Name: "bad", KeySHA256: d}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("create, digest %s: %v, want invalid argument", name, err)
		}
		if _, err := s.Update(ctx, admin, "ns-a", &api.UpdateTenant{KeySHA256: d}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("update, digest %s: %v, want invalid argument", name, err)
		}
	}
	// Keys the daemon knows: another tenant's, the admin's, an E2B alias.
	other, err := s.Create(ctx, admin, &api.CreateTenant{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnsureAdminKey(ctx, t.TempDir()+"/admin.key"); err != nil {
		t.Fatal(err)
	}
	adminHash, _ := db.Meta(ctx, adminKeyMeta)
	alias, err := s.E2BKey(ctx, admin, "other")
	if err != nil {
		t.Fatal(err)
	}
	// A repeated create (a controller's) is told the tenant exists.
	if _, err := s.Create(ctx, admin, &api.CreateTenant{Name: "ns-a", KeySHA256: d1}); !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "tenant ns-a exists") {
		t.Errorf("a repeated create: %v", err)
	}
	for name, d := range map[string]string{"its own": d1, "another tenant's": store.HashKey(other.Key), "the admin's": adminHash, "an E2B alias": store.HashKey(alias.Key)} {
		if _, err := s.Create(ctx, admin, &api.CreateTenant{Name: "again", KeySHA256: d}); !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "key is already in use") {
			t.Errorf("create with %s key: %v, want already exists", name, err)
		}
		if name == "its own" {
			continue
		}
		if _, err := s.Update(ctx, admin, "ns-a", &api.UpdateTenant{KeySHA256: d}); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("update to %s key: %v, want already exists", name, err)
		}
	}
	if _, err := s.Authenticate(ctx, k1, ""); err != nil {
		t.Fatalf("the key after refused updates: %v", err)
	}
	// Setting the key it has changes nothing; replacing it ends the old
	// one (cached above) at once.
	if _, err := s.Update(ctx, admin, "ns-a", &api.UpdateTenant{KeySHA256: d1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, k1, ""); err != nil {
		t.Fatalf("the key after an update to itself: %v", err)
	}
	k2, d2 := controllerKey(t)
	if _, err := s.Update(ctx, p, "ns-a", &api.UpdateTenant{KeySHA256: d2}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant replacing its own key: %v", err)
	}
	if u, err := s.Update(ctx, admin, "ns-a", &api.UpdateTenant{KeySHA256: d2}); err != nil || u.Key != "" {
		t.Fatalf("replace: %+v %v", u, err)
	}
	if _, err := s.Authenticate(ctx, k1, ""); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("the replaced key: %v", err)
	}
	if p2, err := s.Authenticate(ctx, k2, ""); err != nil || p2.ID != tn.ID {
		t.Errorf("the new key: %+v %v", p2, err)
	}
	var kinds []string
	for _, r := range log.Records() {
		if r.Tenant != tn.ID {
			continue
		}
		data := string(r.Data)
		for _, secret := range []string{k1, d1, k2, d2} {
			if strings.Contains(data, secret) {
				t.Errorf("%s holds a key or its digest: %s", r.Kind, data)
			}
		}
		switch {
		case r.Kind == "tenant.created" && strings.Contains(data, `"caller_key":true`):
			kinds = append(kinds, "created with the caller's key")
		case r.Kind == "tenant.updated" && strings.Contains(data, `"key_replaced":true`):
			kinds = append(kinds, "key replaced")
		case r.Kind == "tenant.updated":
			kinds = append(kinds, "updated")
		}
	}
	if want := "created with the caller's key,updated,key replaced"; strings.Join(kinds, ",") != want {
		t.Errorf("records %v, want %s", kinds, want)
	}
}
