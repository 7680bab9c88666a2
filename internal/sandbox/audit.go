package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/scan"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Auditor is where the service records what sandboxes do
// (internal/audit.Log). Commit returns once the record is on disk; Append
// writes it within the log's flush interval.
type Auditor interface {
	Commit(ctx context.Context, r audit.Record) error
	Append(r audit.Record) error
	// Failed says why the log can no longer be written, or nil.
	Failed() error
}

// auditable refuses work up front once the log cannot record it.
func (s *Service) auditable() error {
	if s.cfg.Audit == nil {
		return nil
	}
	if err := s.cfg.Audit.Failed(); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return nil
}

// who is the tenant (by id), sandbox and trigger a record belongs to.
type who struct{ tenant, sandbox, trigger string }

func (b *box) who() who {
	var tr struct {
		TaskID string `json:"task_id"`
	}
	_ = json.Unmarshal([]byte(b.rec.Trigger), &tr)
	return who{b.rec.Tenant, b.rec.ID, tr.TaskID}
}

// commit records a fact before the call it describes answers success; a
// log that cannot be written refuses the call (nothing runs unrecorded).
func (s *Service) commit(ctx context.Context, w who, kind, source string, data any) error {
	if s.cfg.Audit == nil {
		return nil
	}
	r, err := record(w, kind, source, data)
	if err != nil {
		return err
	}
	if err := s.cfg.Audit.Commit(context.WithoutCancel(ctx), r); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return nil
}

// note records a fact nobody waits for (a process's end, an egress
// decision); a failure is logged: the log's own failure already refuses
// new work.
func (s *Service) note(w who, kind, source string, data any) {
	if s.cfg.Audit == nil {
		return
	}
	r, err := record(w, kind, source, data)
	if err == nil {
		err = s.cfg.Audit.Append(r)
	}
	if err != nil {
		s.cfg.Log.Error("audit", "kind", kind, "sandbox", w.sandbox, "err", err)
	}
}

func record(w who, kind, source string, data any) (audit.Record, error) {
	r := audit.Record{Kind: kind, Tenant: w.tenant, Sandbox: w.sandbox, Trigger: w.trigger, Source: source}
	if data != nil {
		b, err := json.Marshal(data)
		if err != nil {
			return r, err
		}
		r.Data = b
	}
	return r, nil
}

// envNames lists an environment's names, never its values.
func envNames(env map[string]string) []string {
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// streamDigest counts and hashes a command's output as it passes.
type streamDigest struct {
	n int64
	h hash.Hash
}

func newStreamDigest() *streamDigest { return &streamDigest{h: sha256.New()} }

func (d *streamDigest) add(b []byte) { d.n += int64(len(b)); d.h.Write(b) }

func (d *streamDigest) summary() map[string]any {
	return map[string]any{"bytes": d.n, "sha256": hex.EncodeToString(d.h.Sum(nil))}
}

// Controls says which controls a sandbox (or a run) has, and any
// explicit opt-out, for its created record.
func Controls(degraded []string) map[string]any {
	c := map[string]any{"namespaces": true, "cgroups": true, "seccomp": true, "capabilities": "dropped", "no_new_privs": true, "landlock": !slices.Contains(degraded, "landlock")}
	if len(degraded) > 0 {
		c["opt_out"] = degraded
	}
	return c
}

// Caps on what one record says of a workspace's changes. Reading them
// never holds up a destroy or the kill switch for long: the sandbox is
// killed first, and the reading stops at RecordTime, saying so.
const (
	MaxRecordedChanges = 1000
	maxRecordedUnread  = 100
	// MaxRecordedBytes caps the JSON of the paths one record lists, and a
	// quarter of it the names of what was not read: a sandbox chooses
	// them, 4 KiB each and six times that escaped, so 1000 of them would
	// be a record of tens of MiB, one per destroy or download.
	MaxRecordedBytes = 1 << 20
	MaxPatchBytes    = 1 << 20 // the patch stored beside the log
	RecordTime       = 5 * time.Second
)

// workspaceChanges summarizes what changed in a sandbox's /workspace and
// stores the patch (capped) beside the log.
func (s *Service) workspaceChanges(b *box) map[string]any {
	ctx, cancel := context.WithTimeout(context.Background(), RecordTime)
	defer cancel()
	patch := &cappedBuffer{max: MaxPatchBytes}
	ch, err := b.inst.Changes(ctx, patch, MaxPatchBytes)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	changes := ch.Changes
	out := map[string]any{"changed": len(changes)}
	if ch.Truncated != "" {
		out["truncated"] = true
		out["truncated_why"] = ch.Truncated
	}
	if kept, left := CapRecorded(changes, MaxRecordedChanges, MaxRecordedBytes); left > 0 {
		changes = kept
		out["truncated"] = true
	}
	out["paths"] = changes
	if len(ch.Unread) > 0 {
		out["unread"] = recordedNames(ch.Unread)
	}
	if patch.buf.Len() > 0 && s.cfg.PatchDir != "" {
		sum := sha256.Sum256(patch.buf.Bytes())
		name := b.rec.ID + "-" + hex.EncodeToString(sum[:8]) + ".patch"
		if err := os.MkdirAll(s.cfg.PatchDir, 0o700); err == nil {
			if err := os.WriteFile(filepath.Join(s.cfg.PatchDir, name), patch.buf.Bytes(), 0o600); err == nil {
				out["patch"] = map[string]any{"file": name, "sha256": hex.EncodeToString(sum[:]), "bytes": patch.buf.Len(), "truncated": patch.cut}
			}
		}
	}
	return out
}

// cappedBuffer keeps the first max bytes written to it. Its only method is
// Write, so no shortcut (io.WriteString, io.Copy's ReadFrom) passes the
// cap.
type cappedBuffer struct {
	buf bytes.Buffer
	max int
	cut bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(p) {
		c.cut = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return c.buf.Write(p)
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
		for _, f := range ev.Findings {
			s.NoteFinding(id, map[string]any{
				"call": "egress", "where": f.Where, "rule": f.Rule, "fingerprint": f.Fingerprint, "action": f.Action,
				"reason": f.Reason, "host": ev.Host, "method": ev.Method, "path": ev.Path, "rules": scan.RuleSet,
			})
		}
	}
}

// NoteEgress records one decision of sandbox id's egress proxy or DNS
// forwarder (observed by the host).
func (s *Service) NoteEgress(id string, decision any) { s.noteCapped(id, "egress", decision) }

// NoteFinding records one thing sandbox id's egress proxy found: a
// credential, or a placeholder where it does not belong (data names the
// rule and a fingerprint, never the value). It shares the egress cap: a
// sandbox cannot flood the log with findings either.
func (s *Service) NoteFinding(id string, data map[string]any) {
	s.noteCapped(id, "secret.finding", data)
}

// noteCapped records what a sandbox's egress proxy saw, within the
// sandbox's cap of MaxEgressRecords a second.
func (s *Service) noteCapped(id, kind string, data any) {
	s.mu.Lock()
	b, ok := s.boxes[id]
	s.mu.Unlock()
	if !ok {
		s.note(who{sandbox: id}, kind, "observed", data)
		return
	}
	if b.egressRate.take() != nil {
		b.egressDropped.Add(1)
		return
	}
	s.note(b.who(), kind, "observed", data)
}

// noteDropped records what a sandbox's rate cap dropped since last time.
func (s *Service) noteDropped(b *box) {
	b.egressRate.refill()
	if n := b.egressDropped.Swap(0); n > 0 {
		s.note(b.who(), "audit.dropped", "observed", map[string]any{"kind": "egress", "records": n, "cap_per_second": MaxEgressRecords})
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

// RedactedSpec is sp for the record: environment variables by name only
// (their values may be secrets).
func RedactedSpec(sp spec.Spec) spec.Spec {
	names := make([]string, 0, len(sp.Env))
	for _, kv := range sp.Env {
		k, _, _ := strings.Cut(kv, "=")
		names = append(names, k)
	}
	sp.Env = names
	// A grant's placeholder is worthless outside its sandbox, but it is
	// still not written down: the record names the grant by its rules.
	sp.Grants = slices.Clone(sp.Grants)
	for i := range sp.Grants {
		sp.Grants[i].Token = ""
	}
	return sp
}

// policyHash names an egress policy by its rules (order aside).
func policyHash(allow, deny []string) string {
	a, d := slices.Clone(allow), slices.Clone(deny)
	slices.Sort(a)
	slices.Sort(d)
	sum := sha256.Sum256([]byte("allow\x00" + strings.Join(a, "\x00") + "\x00deny\x00" + strings.Join(d, "\x00")))
	return hex.EncodeToString(sum[:])
}

// CapRecorded keeps the first entries of list, at most maxItems of them
// and maxBytes of their JSON, and says how many it left out.
func CapRecorded[T any](list []T, maxItems, maxBytes int) (kept []T, left int) {
	size := 0
	for i, e := range list {
		b, _ := json.Marshal(e)
		if size += len(b) + 1; i == maxItems || size > maxBytes {
			return list[:i:i], len(list) - i
		}
	}
	return list, 0
}

// recordedNames is a list of names a sandbox chose (what a reading left
// out) as a record holds it: capped (CapRecorded), the last entry counting
// the rest.
func recordedNames(names []string) []string {
	kept, left := CapRecorded(names, maxRecordedUnread, MaxRecordedBytes/4)
	if left > 0 {
		kept = append(kept, fmt.Sprintf("… %d more", left))
	}
	return kept
}
