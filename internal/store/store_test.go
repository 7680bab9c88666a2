package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
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
	if err := s.CreateTenant(ctx, Tenant{Name: "a", KeyHash: HashKey("k1"), Quotas: "{}", Created: now, CPUPeriodStart: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTenant(ctx, Tenant{Name: "a", KeyHash: HashKey("k2"), Quotas: "{}"}); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate name: %v", err)
	}
	if err := s.CreateTenant(ctx, Tenant{Name: "b", KeyHash: HashKey("k1"), Quotas: "{}"}); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate key: %v", err)
	}
	got, err := s.TenantByKey(ctx, HashKey("k1"))
	if err != nil || got.Name != "a" || !got.Created.Equal(now) {
		t.Errorf("by key: %+v %v", got, err)
	}
	if _, err := s.TenantByKey(ctx, HashKey("nope")); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown key: %v", err)
	}
	if HashKey("k1") == "k1" || len(HashKey("k1")) != 64 {
		t.Error("keys must be stored hashed")
	}
	if err := s.SetTenantCPU(ctx, "a", now, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	b := Sandbox{ID: "x1", Tenant: "a", State: "running", Spec: "{}", Metadata: "{}", Trigger: "{}", Created: now, Expires: now.Add(time.Hour), IdleTimeout: time.Minute, LastActive: now, InitPid: 42}
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
	if err != nil || len(live) != 1 || live[0].InitPid != 42 || live[0].IdleTimeout != time.Minute || !live[0].Expires.Equal(now.Add(time.Hour)) {
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
	if err := s.DeleteTenant(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTenant(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete twice: %v", err)
	}
}

// A database an earlier version made (tenants without scan_policy) is
// brought up to date on open, its rows kept.
func TestMigratesAnOlderDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE tenants (name TEXT PRIMARY KEY, key_hash TEXT NOT NULL UNIQUE, quotas TEXT NOT NULL, created INTEGER NOT NULL,
		cpu_period_start INTEGER NOT NULL DEFAULT 0, cpu_used_ns INTEGER NOT NULL DEFAULT 0);
		INSERT INTO tenants (name, key_hash, quotas, created) VALUES ('old', 'h', '{}', 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts, err := s.Tenants(context.Background())
	if err != nil || len(ts) != 1 || ts[0].Name != "old" || ts[0].ScanPolicy != "" {
		t.Fatalf("%+v %v", ts, err)
	}
	ctx := context.Background()
	if err := s.AddSecret(ctx, Secret{Tenant: "old", Name: "k", Version: 1, Sealed: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddSecret(ctx, Secret{Tenant: "old", Name: "k", Version: 1, Sealed: []byte{2}}); !errors.Is(err, ErrExists) {
		t.Errorf("a second secret of one name: %v", err)
	}
	if err := s.RotateSecret(ctx, Secret{Tenant: "old", Name: "k", Version: 3, Sealed: []byte{3}}, 2); !errors.Is(err, ErrNotFound) {
		t.Errorf("a rotation from a stale version: %v", err)
	}
	if err := s.DeleteTenant(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSecret(ctx, "old", "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a removed tenant's secret: %v", err)
	}
}
