package core

import (
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
)

// MaxEgressRecords caps the egress records one sandbox makes per second:
// a sandbox must not be able to flood the log. What is dropped is counted
// and recorded (audit.dropped) once a second.
const MaxEgressRecords = 500

// EgressSink is what sandbox id's egress proxy tells the service: each
// decision is counted and recorded, with one secret.finding record per
// finding.
func (s *Core) EgressSink(id string) func(eventlog.Event) {
	return func(ev eventlog.Event) {
		s.Cfg.Metrics.Egress.WithLabelValues(ev.Decision).Inc()
		s.NoteEgress(id, ev)
		for _, f := range record.EgressFindings(ev) {
			s.NoteFinding(id, f)
		}
	}
}

// NoteEgress records one decision of sandbox id's egress proxy or DNS
// forwarder (observed by the host).
func (s *Core) NoteEgress(id string, ev eventlog.Event) {
	s.noteCapped(id, record.Egress{Event: ev})
}

// NoteFinding records one thing sandbox id's egress proxy found: a
// credential, or a placeholder where it does not belong (data names the
// rule and a fingerprint, never the value). It shares the egress cap: a
// sandbox cannot flood the log with findings either.
func (s *Core) NoteFinding(id string, f record.SecretFinding) { s.noteCapped(id, f) }

// noteCapped records what a sandbox's egress proxy saw, within the
// sandbox's cap of MaxEgressRecords a second.
func (s *Core) noteCapped(id string, d record.Data) {
	s.Mu.Lock()
	b, ok := s.Boxes[id]
	s.Mu.Unlock()
	if !ok {
		s.Cfg.Audit.Note(record.Who{Sandbox: id}, d)
		return
	}
	if b.EgressRate.Take() != nil {
		b.EgressDropped.Add(1)
		return
	}
	s.Cfg.Audit.Note(b.Who(), d)
}

// NoteDropped records what a sandbox's rate cap dropped since last time.
func (s *Core) NoteDropped(b *Box) {
	b.EgressRate.Refill()
	if n := b.EgressDropped.Swap(0); n > 0 {
		s.Cfg.Audit.Note(b.Who(), record.AuditDropped{Of: "egress", Records: n, CapPerSecond: MaxEgressRecords})
	}
}
