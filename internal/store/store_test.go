package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestTenantsAndSandboxes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "a.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(time.Now().UnixMilli())
	ida, err := s.CreateTenant(ctx, Tenant{Name: "a", KeyHash: HashKey("k1"), Quotas: "{}", Created: now, CPUPeriodStart: now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTenant(ctx, Tenant{Name: "a", KeyHash: HashKey("k2"), Quotas: "{}"}); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate name: %v", err)
	}
	if _, err := s.CreateTenant(ctx, Tenant{Name: "b", KeyHash: HashKey("k1"), Quotas: "{}"}); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate key: %v", err)
	}
	got, err := s.TenantByKey(ctx, HashKey("k1"))
	if err != nil || got.Name != "a" || got.ID != ida || !got.Created.Equal(now) {
		t.Errorf("by key: %+v %v", got, err)
	}
	if _, err := s.TenantByKey(ctx, HashKey("nope")); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown key: %v", err)
	}
	if HashKey("k1") == "k1" || len(HashKey("k1")) != 64 {
		t.Error("keys must be stored hashed")
	}
	if err := s.SetTenantCPU(ctx, ida, now, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTenantRoots(ctx, ida, `["/srv/a"]`); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.TenantByKey(ctx, HashKey("k1")); got.Roots != `["/srv/a"]` {
		t.Errorf("roots: %q", got.Roots)
	}
	if err := s.SetTenantRoots(ctx, "nope", ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("roots of a missing tenant: %v", err)
	}
	b := Sandbox{ID: "x1", Tenant: ida, TenantName: "a", State: "running", Spec: "{}", Metadata: "{}", Trigger: "{}", Created: now, Expires: now.Add(time.Hour), IdleTimeout: time.Minute, LastActive: now, InitPid: 42}
	if err := s.PutSandbox(ctx, b); err != nil {
		t.Fatal(err)
	}
	b2 := b
	b2.ID, b2.State, b2.Ended, b2.EndReason = "x2", "ended", now.Add(-48*time.Hour), "gone"
	if err := s.PutSandbox(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if err := s.SetMeta(ctx, "m", "v"); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// Everything survives a reopen (a daemon restart).
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	live, err := s.Sandboxes(ctx, "running", "paused")
	if err != nil || len(live) != 1 || live[0].InitPid != 42 || live[0].Tenant != ida || live[0].TenantName != "a" || live[0].IdleTimeout != time.Minute || !live[0].Expires.Equal(now.Add(time.Hour)) {
		t.Errorf("live: %+v %v", live, err)
	}
	if v, _ := s.Meta(ctx, "m"); v != "v" {
		t.Errorf("meta: %q", v)
	}
	ts, _ := s.Tenants(ctx)
	if len(ts) != 1 || ts[0].CPUUsed != 3*time.Second {
		t.Errorf("tenants: %+v", ts)
	}
	if err := s.PruneEnded(ctx, now.Add(-24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if all, _ := s.Sandboxes(ctx); len(all) != 1 {
		t.Errorf("after prune: %+v", all)
	}
	if _, err := s.DeleteTenant(ctx, ida); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteTenant(ctx, ida); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete twice: %v", err)
	}
}

// A tenant deleted and made again under its name is a new tenant: a new
// id, none of the old one's secrets or snapshots; a content another
// tenant still records keeps its files.
func TestDeletedTenantLeavesNothingToItsName(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, err := s.CreateTenant(ctx, Tenant{Name: "acme", KeyHash: HashKey("k1"), Quotas: "{}"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.CreateTenant(ctx, Tenant{Name: "other", KeyHash: HashKey("k2"), Quotas: "{}"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range []Snapshot{{ID: "s1", Tenant: old, Content: "c-shared"}, {ID: "s2", Tenant: old, Content: "c-own"}, {ID: "s3", Tenant: other, Content: "c-shared"}} {
		if err := s.PutSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddSecret(ctx, Secret{Tenant: old, Name: "k", Version: 1, Sealed: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Pool{{Tenant: old, Name: "p", Def: "{}"}, {Tenant: other, Name: "p", Def: "{}"}} {
		if err := s.PutPool(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	freed, err := s.DeleteTenant(ctx, old)
	if err != nil || len(freed) != 1 || freed[0] != "c-own" {
		t.Errorf("freed %v, %v", freed, err)
	}
	again, err := s.CreateTenant(ctx, Tenant{Name: "acme", KeyHash: HashKey("k3"), Quotas: "{}"})
	if err != nil || again == old {
		t.Fatalf("the new acme: %q (the old: %q), %v", again, old, err)
	}
	if sns, _ := s.Snapshots(ctx, again); len(sns) != 0 {
		t.Errorf("the new acme has snapshots: %+v", sns)
	}
	if secs, _ := s.Secrets(ctx, again); len(secs) != 0 {
		t.Errorf("the new acme has secrets: %+v", secs)
	}
	if _, err := s.SnapshotOf(ctx, again, "s1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the old acme's snapshot, by the new: %v", err)
	}
	if sn, err := s.SnapshotOf(ctx, other, "s3"); err != nil || sn.Content != "c-shared" {
		t.Errorf("the other tenant's snapshot: %+v %v", sn, err)
	}
	if ps, err := s.Pools(ctx); err != nil || len(ps) != 1 || ps[0].Tenant != other {
		t.Errorf("pools after the deletion: %+v %v", ps, err)
	}
	// An id is never issued again, whatever the name.
	var n int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM tenant_ids WHERE id = ?`, old).Scan(&n); err != nil || n != 1 {
		t.Errorf("the deleted id is not kept: %d %v", n, err)
	}
}

// A database an earlier version made (tenants without scan_policy or id,
// snapshots without content, sandboxes without tenant_name or
// external_id) is brought up
// to date on open, its rows kept: a tenant of then keeps its name as its
// id, so what it owned (keyed by that name) stays its own.
func TestMigratesAnOlderDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE tenants (name TEXT PRIMARY KEY, key_hash TEXT NOT NULL UNIQUE, quotas TEXT NOT NULL, created INTEGER NOT NULL,
		cpu_period_start INTEGER NOT NULL DEFAULT 0, cpu_used_ns INTEGER NOT NULL DEFAULT 0);
		INSERT INTO tenants (name, key_hash, quotas, created) VALUES ('old', 'h', '{}', 1);
		CREATE TABLE sandboxes (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, spec TEXT NOT NULL, metadata TEXT NOT NULL,
		trigger_record TEXT NOT NULL, created INTEGER NOT NULL, expires INTEGER NOT NULL, idle_timeout_ms INTEGER NOT NULL,
		last_active INTEGER NOT NULL, init_pid INTEGER NOT NULL DEFAULT 0, ended INTEGER NOT NULL DEFAULT 0, end_reason TEXT NOT NULL DEFAULT '');
		INSERT INTO sandboxes (id, tenant, state, spec, metadata, trigger_record, created, expires, idle_timeout_ms, last_active)
		VALUES ('sb1', 'old', 'running', '{}', '{}', '{}', 1, 2, 0, 1);
		CREATE TABLE snapshots (id TEXT NOT NULL, tenant TEXT NOT NULL, name TEXT NOT NULL, sandbox TEXT NOT NULL, base TEXT NOT NULL,
		has_root INTEGER NOT NULL, bytes INTEGER NOT NULL, created INTEGER NOT NULL, PRIMARY KEY (tenant, id));
		INSERT INTO snapshots VALUES ('0123456789abcdef01234567', 'old', 'n', 'sb1', 'host', 0, 5, 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := s.Tenants(context.Background())
	if err != nil || len(ts) != 1 || ts[0].Name != "old" || ts[0].ID != "old" || ts[0].ScanPolicy != "" || ts[0].Isolation != "" {
		t.Fatalf("%+v %v", ts, err)
	}
	ctx := context.Background()
	if err := s.SetTenantIsolation(ctx, "old", "gvisor"); err != nil {
		t.Fatal(err)
	}
	if tn, err := s.TenantByName(ctx, "old"); err != nil || tn.Isolation != "gvisor" {
		t.Errorf("the migrated isolation column: %+v %v", tn, err)
	}
	if sbs, err := s.Sandboxes(ctx); err != nil || len(sbs) != 1 || sbs[0].Tenant != "old" || sbs[0].TenantName != "old" || sbs[0].ExternalID != "" {
		t.Errorf("sandboxes: %+v %v", sbs, err)
	}
	// The external id column: written, and found by.
	sb := Sandbox{ID: "sb2", Tenant: "old", State: "ended", Spec: "{}", Metadata: "{}", Trigger: "{}", ExternalID: "uid-1"}
	if err := s.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, err := s.SandboxesByExternalID(ctx, "old", "uid-1", "ended"); err != nil || len(got) != 1 || got[0].ID != "sb2" || got[0].ExternalID != "uid-1" {
		t.Errorf("by external id: %+v %v", got, err)
	}
	if got, _ := s.SandboxesByExternalID(ctx, "other", "uid-1", "ended"); len(got) != 0 {
		t.Errorf("another tenant's by external id: %+v", got)
	}
	if sn, err := s.SnapshotOf(ctx, "old", "0123456789abcdef01234567"); err != nil || sn.Content != sn.ID {
		t.Errorf("snapshot: %+v %v", sn, err)
	}
	if err := s.AddSecret(ctx, Secret{Tenant: "old", Name: "k", Version: 1, Sealed: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddSecret(ctx, Secret{Tenant: "old", Name: "k", Version: 1, Sealed: []byte{2}}); !errors.Is(err, ErrExists) {
		t.Errorf("a second secret of one name: %v", err)
	}
	if err := s.RotateSecret(ctx, Secret{Tenant: "old", Name: "k", Version: 3, Sealed: []byte{3}}, 2); !errors.Is(err, ErrNotFound) {
		t.Errorf("a rotation from a stale version: %v", err)
	}
	s.Close()
	// Opening it again changes nothing more.
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if freed, err := s.DeleteTenant(ctx, "old"); err != nil || len(freed) != 1 || freed[0] != "0123456789abcdef01234567" {
		t.Fatalf("delete: %v %v", freed, err)
	}
	if _, err := s.GetSecret(ctx, "old", "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a removed tenant's secret: %v", err)
	}
	// A new tenant of the old name gets a new id.
	if id, err := s.CreateTenant(ctx, Tenant{Name: "old", KeyHash: "h2", Quotas: "{}"}); err != nil || id == "old" {
		t.Errorf("re-created: %q %v", id, err)
	}
}

// Records put at once (a kill switch's, written together) all land, each
// as it was put, and a record put again afterwards replaces its own.
func TestConcurrentPutsAllLand(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 300
	now := time.UnixMilli(time.Now().UnixMilli())
	rec := func(i int, state string) Sandbox {
		return Sandbox{ID: fmt.Sprintf("sb%03d", i), Tenant: "t1", TenantName: "acme", State: state, Spec: "{}", Metadata: "{}", Trigger: "{}",
			Created: now, Expires: now.Add(time.Hour), LastActive: now, InitPid: 1000 + i, EndReason: fmt.Sprint("reason ", i)}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- s.PutSandbox(ctx, rec(i, "ended")) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutSandbox(ctx, rec(7, "running")); err != nil {
		t.Fatal(err)
	}
	got, err := s.Sandboxes(ctx)
	if err != nil || len(got) != n {
		t.Fatalf("%d records (%v), want %d", len(got), err, n)
	}
	for _, b := range got {
		var i int
		fmt.Sscanf(b.ID, "sb%03d", &i)
		want := rec(i, "ended")
		if i == 7 {
			want.State = "running"
		}
		if b != want {
			t.Errorf("record %s: %+v, want %+v", b.ID, b, want)
		}
	}
}
