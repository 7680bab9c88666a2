package sandbox

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// AuditFilter selects audit records.
type AuditFilter struct {
	Sandbox, Kind, Trigger string
	Since                  time.Time
}

// AuditRecords streams the audit records the caller may read: a tenant
// those of its own id (never a deleted namesake's; found through the log's
// index, not by reading every tenant's), the admin all.
func (s *Service) AuditRecords(ctx context.Context, t *tenant.Principal, f AuditFilter, emit func(*audit.Record) error) error {
	if s.Cfg.AuditDir == "" {
		return errdefs.New(errdefs.ErrUnavailable, "this daemon keeps no audit log")
	}
	read := func(fn func(*audit.Record) error) error { return audit.Read(ctx, s.Cfg.AuditDir, false, fn) }
	if !t.Admin {
		read = func(fn func(*audit.Record) error) error {
			err := s.auditIndex.ReadTenant(ctx, t.ID, fn)
			if errors.Is(err, audit.ErrIndexMismatch) {
				s.Cfg.Log.Error("audit index", "tenant", t.ID, "err", err)
				return errdefs.New(errdefs.ErrInternal, "the audit log's index does not match the log; it is rebuilt at the next read (the operator can check the log with airlock audit verify)")
			}
			return err
		}
	}
	return read(func(r *audit.Record) error {
		switch {
		case !t.Admin && r.Tenant != t.ID,
			f.Sandbox != "" && r.Sandbox != f.Sandbox,
			f.Trigger != "" && r.Trigger != f.Trigger,
			f.Kind != "" && r.Kind != f.Kind && !strings.HasPrefix(r.Kind, f.Kind+"."),
			!f.Since.IsZero() && r.Time.Before(f.Since):
			return nil
		}
		return emit(r)
	})
}
