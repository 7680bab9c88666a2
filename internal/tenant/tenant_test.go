package tenant

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil/memlog"
)

// memAudit is an audit log in memory.
type memAudit = memlog.Log

// Regression (issue 12, item 14): quotas of 2^63-1 were accepted, and
// their sums overflow.
func TestQuotaCeilings(t *testing.T) {
	for name, q := range map[string]api.Quotas{
		"sandboxes": {MaxSandboxes: math.MaxInt}, "memory": {MaxMemory: math.MaxInt64}, "cpus": {MaxCPUs: 1e300},
		"cpu seconds": {CPUSeconds: 1e300}, "snapshot bytes": {MaxSnapshotBytes: math.MaxInt64}, "negative snapshot bytes": {MaxSnapshotBytes: -1},
	} {
		if err := validQuotas(q); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	if err := validQuotas(api.Quotas{MaxSandboxes: maxQuotaSandboxes, MaxMemory: maxQuotaBytes, MaxCPUs: maxQuotaCPUs, CPUSeconds: maxQuotaCPUSeconds, MaxSnapshotBytes: maxQuotaBytes}); err != nil {
		t.Errorf("at the ceilings: %v", err)
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
	s := New(Config{Store: db})
	ctx := context.Background()
	admin := &Principal{Admin: true}
	tn, err := s.Create(ctx, admin, &api.CreateTenant{Name: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Authenticate(ctx, tn.Key, "")
	if err != nil || p.ScanPolicy != "block" {
		t.Fatalf("%+v %v", p, err)
	}
	if _, err := s.Update(ctx, admin, "acme", &api.UpdateTenant{ScanPolicy: "record"}); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Authenticate(ctx, tn.Key, ""); p.ScanPolicy != "record" {
		t.Errorf("after the update: %+v", p)
	}
	if _, err := s.Update(ctx, admin, "acme", &api.UpdateTenant{ScanPolicy: "ignore"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a bad policy: %v", err)
	}
	if _, err := s.Update(ctx, p, "acme", &api.UpdateTenant{ScanPolicy: "block"}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant changing its own policy: %v", err)
	}
	if _, err := s.Update(ctx, admin, "nope", &api.UpdateTenant{ScanPolicy: "block"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a missing tenant: %v", err)
	}
}

// A tenant held to gvisor carries the hold in its principal from its
// key's next call; "container" lifts it; an unknown wall is refused; the
// hold is in the tenant's records and listing.
func TestTenantIsolationHold(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	log := &memAudit{}
	s := New(Config{Store: db, Audit: record.New(log, nil), Sandboxes: &fakeSandboxes{}})
	ctx := context.Background()
	admin := &Principal{Admin: true}
	if _, err := s.Create(ctx, admin, &api.CreateTenant{Name: "x", Isolation: "vm"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("isolation vm: %v", err)
	}
	tn, err := s.Create(ctx, admin, &api.CreateTenant{Name: "acme", Isolation: "gvisor"})
	if err != nil || tn.Isolation != "gvisor" {
		t.Fatalf("%+v %v", tn, err)
	}
	if p, err := s.Authenticate(ctx, tn.Key, ""); err != nil || p.Isolation != "gvisor" {
		t.Fatalf("%+v %v", p, err)
	}
	if u, err := s.Update(ctx, admin, "acme", &api.UpdateTenant{Isolation: "container"}); err != nil || u.Isolation != "container" {
		t.Fatalf("lift: %+v %v", u, err)
	}
	if p, _ := s.Authenticate(ctx, tn.Key, ""); p.Isolation != "" {
		t.Errorf("after the lift: %+v", p)
	}
	if _, err := s.Update(ctx, admin, "acme", &api.UpdateTenant{Isolation: "gvisor"}); err != nil {
		t.Fatal(err)
	}
	// An update of something else keeps the hold.
	if u, err := s.Update(ctx, admin, "acme", &api.UpdateTenant{ScanPolicy: "record"}); err != nil || u.Isolation != "gvisor" {
		t.Errorf("another update: %+v %v", u, err)
	}
	if ts, _ := s.List(ctx, admin); len(ts) != 1 || ts[0].Isolation != "gvisor" {
		t.Errorf("list: %+v", ts)
	}
	var held []string
	for _, r := range log.Records() {
		if strings.Contains(string(r.Data), `"isolation":"gvisor"`) {
			held = append(held, r.Kind)
		}
	}
	if len(held) != 3 || held[0] != "tenant.created" {
		t.Errorf("records naming the hold: %v", held)
	}
}

// fakeSandboxes is the sandbox service as the tenants' sees it: it records what
// deletion asked of it, and can run a sign-in while the tenant's
// sandboxes are being ended.
type fakeSandboxes struct {
	ended, forgot []string
	live          map[string]int
	whileEnding   func()
}

func (f *fakeSandboxes) EndTenant(_ *Principal, id, _ string) ([]string, error) {
	if f.whileEnding != nil {
		f.whileEnding()
	}
	f.ended = append(f.ended, id)
	return nil, nil
}

func (f *fakeSandboxes) ForgetTenant(_ context.Context, id string, _ []string) error {
	f.forgot = append(f.forgot, id)
	return nil
}

func (f *fakeSandboxes) TenantUsage(id string) Usage { return Usage{Sandboxes: f.live[id]} }

// Deleting a tenant refuses, from the moment it begins, its key (cached
// or not), every principal of it a request already holds, and a sign-in
// racing the deletion; it ends the tenant's sandboxes and has the
// sandbox service forget it, and no other tenant's principals change.
func TestDeletedTenantIsRefusedEverywhere(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fake := &fakeSandboxes{live: map[string]int{}}
	s := New(Config{Store: db, Sandboxes: fake})
	ctx := context.Background()
	admin := &Principal{Admin: true}
	acme, err := s.Create(ctx, admin, &api.CreateTenant{Name: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Create(ctx, admin, &api.CreateTenant{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	held, err := s.Authenticate(ctx, acme.Key, "")
	if err != nil || held.Err() != nil {
		t.Fatalf("sign in: %+v %v", held, err)
	}
	bystander, _ := s.Authenticate(ctx, other.Key, "")
	fake.live[acme.ID] = 2
	if l, _ := s.List(ctx, held); len(l) != 1 || l[0].Sandboxes != 2 {
		t.Errorf("acme lists %+v", l)
	}
	// A sign-in while the sandboxes are being ended: the principal cache
	// was emptied of acme's key, so it is loaded again, and refused.
	if p, err := s.ByID(ctx, acme.ID); err != nil || p.Tenant != "acme" {
		t.Errorf("acme by its id: %+v %v", p, err)
	}
	fake.whileEnding = func() {
		if _, err := s.Authenticate(ctx, acme.Key, ""); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("a sign-in during the deletion: %v", err)
		}
		// A pool's refill during the deletion is refused too.
		if _, err := s.ByID(ctx, acme.ID); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("acme by its id during the deletion: %v", err)
		}
	}
	if err := s.Delete(ctx, admin, "acme"); err != nil {
		t.Fatal(err)
	}
	if len(fake.ended) != 1 || fake.ended[0] != acme.ID || len(fake.forgot) != 1 || fake.forgot[0] != acme.ID {
		t.Errorf("the sandbox service ended %v and forgot %v, want %s once each", fake.ended, fake.forgot, acme.ID)
	}
	if err := held.Err(); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a principal held across the deletion: %v", err)
	}
	if err := held.UndoIfDeleted(func() {}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a write of a principal held across the deletion: %v", err)
	}
	if _, err := s.Authenticate(ctx, acme.Key, ""); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("the deleted tenant's key: %v", err)
	}
	if err := bystander.Err(); err != nil {
		t.Errorf("another tenant's principal: %v", err)
	}
	if p, err := s.Authenticate(ctx, other.Key, ""); err != nil || p.Err() != nil {
		t.Errorf("another tenant's key: %v", err)
	}
	if err := s.Delete(ctx, admin, "acme"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleting it again: %v", err)
	}
	if _, err := s.ByID(ctx, acme.ID); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("the deleted tenant by its id: %v", err)
	}
}

// ByID (a pool's refill) sees a tenant's settings as they are now, not as
// a principal signed in earlier holds them.
func TestByIDSeesTheQuotasOfNow(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := New(Config{Store: db, Sandboxes: &fakeSandboxes{live: map[string]int{}}})
	ctx := context.Background()
	admin := &Principal{Admin: true}
	acme, err := s.Create(ctx, admin, &api.CreateTenant{Name: "acme", Quotas: api.Quotas{MaxSandboxes: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s.ByID(ctx, acme.ID); err != nil || p.Quotas.MaxSandboxes != 5 {
		t.Fatalf("acme by its id: %+v %v", p, err)
	}
	if _, err := s.Update(ctx, admin, "acme", &api.UpdateTenant{Quotas: &api.Quotas{MaxSandboxes: 1}}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.ByID(ctx, acme.ID); err != nil || p.Quotas.MaxSandboxes != 1 || p.ID != acme.ID {
		t.Errorf("acme by its id after an update: %+v %v", p, err)
	}
}

// A tenant's E2B-shaped key signs it in as its own key does; a new one
// replaces it (at once, though the old one's principal was cached); only
// the admin mints one; deleting the tenant ends it.
func TestE2BKeyIsAnAliasOfTheTenantsKey(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	log := &memAudit{}
	s := New(Config{Store: db, Sandboxes: &fakeSandboxes{live: map[string]int{}}, Audit: record.New(log, nil)})
	ctx := context.Background()
	admin := &Principal{Admin: true}
	acme, err := s.Create(ctx, admin, &api.CreateTenant{Name: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	k1, err := s.E2BKey(ctx, admin, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(k1.Key) != 44 || !strings.HasPrefix(k1.Key, "e2b_") || strings.Trim(k1.Key[4:], "0123456789abcdef") != "" || k1.Tenant != "acme" {
		t.Errorf("key %q: want e2b_ and 40 hex digits", k1.Key)
	}
	if p, err := s.Authenticate(ctx, k1.Key, ""); err != nil || p.ID != acme.ID || p.Admin {
		t.Fatalf("the E2B key signs in as %+v %v", p, err)
	}
	k2, err := s.E2BKey(ctx, admin, "acme")
	if err != nil || k2.Key == k1.Key {
		t.Fatalf("a second key: %+v %v", k2, err)
	}
	if _, err := s.Authenticate(ctx, k1.Key, ""); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("the replaced key: %v", err)
	}
	if p, err := s.Authenticate(ctx, k2.Key, ""); err != nil || p.ID != acme.ID {
		t.Errorf("the new key: %+v %v", p, err)
	}
	tenantP, _ := s.Authenticate(ctx, acme.Key, "")
	if _, err := s.E2BKey(ctx, tenantP, "acme"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant minting its own: %v", err)
	}
	if _, err := s.E2BKey(ctx, admin, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a missing tenant: %v", err)
	}
	var recs []string
	for _, r := range log.Records() {
		if r.Kind == "tenant.e2b_key" {
			recs = append(recs, string(r.Data))
			if strings.Contains(string(r.Data), k1.Key[4:]) || strings.Contains(string(r.Data), k2.Key[4:]) {
				t.Errorf("a record holds the key: %s", r.Data)
			}
		}
	}
	if len(recs) != 2 || !strings.Contains(recs[1], `"replaced":true`) {
		t.Errorf("records %v", recs)
	}
	if err := s.Delete(ctx, admin, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, k2.Key, ""); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("the deleted tenant's E2B key: %v", err)
	}
	if h, _ := db.Meta(ctx, e2bKeyOfMeta+acme.ID); h != "" {
		t.Errorf("the deleted tenant's E2B key is still stored")
	}
}
