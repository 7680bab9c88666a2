package tenant

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

type memAudit struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (m *memAudit) Commit(_ context.Context, r audit.Record) error { return m.Append(r) }
func (m *memAudit) Append(r audit.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, r)
	return nil
}

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
