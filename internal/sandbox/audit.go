package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// auditable refuses work up front once the log cannot record it.
func (s *Service) auditable() error { return s.cfg.Audit.Failed() }

func (b *box) who() record.Who {
	var tr struct {
		TaskID string `json:"task_id"`
	}
	_ = json.Unmarshal([]byte(b.rec.Trigger), &tr)
	return record.Who{Tenant: b.rec.Tenant, Sandbox: b.rec.ID, Trigger: tr.TaskID}
}

// MaxEgressRecords caps the egress records one sandbox makes per second:
// a sandbox must not be able to flood the log. What is dropped is counted
// and recorded (audit.dropped) once a second.
const MaxEgressRecords = 500

// egressSink is what sandbox id's egress proxy tells the service: each
// decision is counted and recorded, with one secret.finding record per
// finding.
func (s *Service) egressSink(id string) func(eventlog.Event) {
	return func(ev eventlog.Event) {
		s.cfg.Metrics.Egress.WithLabelValues(ev.Decision).Inc()
		s.NoteEgress(id, ev)
		for _, f := range record.EgressFindings(ev) {
			s.NoteFinding(id, f)
		}
	}
}

// NoteEgress records one decision of sandbox id's egress proxy or DNS
// forwarder (observed by the host).
func (s *Service) NoteEgress(id string, ev eventlog.Event) {
	s.noteCapped(id, record.Egress{Event: ev})
}

// NoteFinding records one thing sandbox id's egress proxy found: a
// credential, or a placeholder where it does not belong (data names the
// rule and a fingerprint, never the value). It shares the egress cap: a
// sandbox cannot flood the log with findings either.
func (s *Service) NoteFinding(id string, f record.SecretFinding) { s.noteCapped(id, f) }

// noteCapped records what a sandbox's egress proxy saw, within the
// sandbox's cap of MaxEgressRecords a second.
func (s *Service) noteCapped(id string, d record.Data) {
	s.mu.Lock()
	b, ok := s.boxes[id]
	s.mu.Unlock()
	if !ok {
		s.cfg.Audit.Note(record.Who{Sandbox: id}, d)
		return
	}
	if b.egressRate.take() != nil {
		b.egressDropped.Add(1)
		return
	}
	s.cfg.Audit.Note(b.who(), d)
}

// noteDropped records what a sandbox's rate cap dropped since last time.
func (s *Service) noteDropped(b *box) {
	b.egressRate.refill()
	if n := b.egressDropped.Swap(0); n > 0 {
		s.cfg.Audit.Note(b.who(), record.AuditDropped{Of: "egress", Records: n, CapPerSecond: MaxEgressRecords})
	}
}

// AuditFilter selects audit records.
type AuditFilter struct {
	Sandbox, Kind, Trigger string
	Since                  time.Time
}

// AuditRecords streams the audit records the caller may read: a tenant
// those of its own id (never a deleted namesake's; found through the log's
// index, not by reading every tenant's), the admin all.
func (s *Service) AuditRecords(ctx context.Context, t *tenant.Principal, f AuditFilter, emit func(*audit.Record) error) error {
	if s.cfg.AuditDir == "" {
		return errdefs.New(errdefs.ErrUnavailable, "this daemon keeps no audit log")
	}
	read := func(fn func(*audit.Record) error) error { return audit.Read(ctx, s.cfg.AuditDir, false, fn) }
	if !t.Admin {
		read = func(fn func(*audit.Record) error) error {
			err := s.auditIndex.ReadTenant(ctx, t.ID, fn)
			if errors.Is(err, audit.ErrIndexMismatch) {
				s.cfg.Log.Error("audit index", "tenant", t.ID, "err", err)
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
