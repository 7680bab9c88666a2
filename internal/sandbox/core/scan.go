package core

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/scan"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// What one API call may cost the secret scanner, which runs on the
// daemon's CPU (gitleaks' generic rule costs microseconds a byte on its
// worst input) and records each finding with an fsync.
const (
	// MaxScanBytes is how much of a call's values is read: the first
	// bytes, in the order of the call's fields, as the egress proxy reads
	// the first 64 KiB of a body. What comes after goes through unread,
	// and the call's secret.scan_summary record says so.
	MaxScanBytes = broker.MaxScanBody
	// MaxFindingRecords is how many secret.finding records one call
	// makes; the rest are counted in its secret.scan_summary record.
	MaxFindingRecords = 16
	// maxUnscannedNamed is how many partly read values a summary names.
	maxUnscannedNamed = 32
)

// Field is one value of a call the scanner reads, named for messages
// (Where). Shown, when set, is the copy of it a record keeps: it is given the
// value with every credential found redacted, whatever the policy (under
// record the call goes on with the value unchanged; its record does not
// keep it). More says Val is the head of a longer value (a streamed file):
// it counts as read in part, and the rest is counted by Unread.
type Field struct {
	Where string
	Val   *string
	Shown *string
	More  bool
}

// ScanBudget is what is left of one call's scanning allowance; an
// upload's files share one.
type ScanBudget struct {
	bytes, records int
	// What the call's summary says.
	read, total      int
	found, dropped   int
	unscanned        []string // values read in part or not at all
	unscannedUnnamed int      // past maxUnscannedNamed
}

// Unread counts n more bytes of a call's values that went through unread
// (the rest of a streamed value past its head), for the summary.
func (b *ScanBudget) Unread(n int64) { b.total += int(n) }

// NewScanBudget is one call's whole allowance.
func NewScanBudget() *ScanBudget {
	return &ScanBudget{bytes: MaxScanBytes, records: MaxFindingRecords}
}

// ScanCall applies the secret scanner to a call's fields under the
// tenant's policy, within one call's budget (see ScanFields).
func (s *Core) ScanCall(ctx context.Context, t *tenant.Principal, w record.Who, call string, fields []Field) error {
	bud := NewScanBudget()
	err := s.ScanFields(ctx, t, w, call, fields, bud)
	if serr := s.ScanSummary(ctx, w, call, bud); err == nil {
		err = serr
	}
	return err
}

// ScanFields applies the secret scanner to fields under the tenant's
// policy: block fails the call (naming the rule, not the value), redact
// rewrites the fields, record lets it through. It reads at most what is
// left of bud's bytes, and records findings with their rule and a keyed
// fingerprint (never the value) while bud has records left; the rest are
// counted for ScanSummary.
func (s *Core) ScanFields(ctx context.Context, t *tenant.Principal, w record.Who, call string, fields []Field, bud *ScanBudget) error {
	if s.Cfg.Broker == nil {
		return nil
	}
	parts := make([]broker.Part, len(fields))
	partial := make([]bool, len(fields))
	for i, f := range fields {
		text := *f.Val
		bud.total += len(text)
		if n := min(len(text), bud.bytes); n < len(text) || f.More {
			text, partial[i] = text[:n], true
			if len(bud.unscanned) < maxUnscannedNamed {
				bud.unscanned = append(bud.unscanned, f.Where)
			} else {
				bud.unscannedUnnamed++
			}
		}
		bud.bytes -= len(text)
		bud.read += len(text)
		parts[i] = broker.Part{Text: text}
	}
	// One pass, the fields joined as a command line.
	fs, err := s.Cfg.Broker.ScanParts(parts, ' ')
	if err != nil {
		return errdefs.New(errdefs.ErrUnavailable, "the secret scanner is unavailable: "+err.Error())
	}
	if len(fs) == 0 {
		return nil
	}
	policy := t.ScanPolicy
	if policy == "" {
		policy = tenant.DefaultScanPolicy
	}
	action := map[string]string{"block": "blocked", "redact": "redacted", "record": "recorded"}[policy]
	bud.found += len(fs)
	for _, f := range fs {
		if bud.records == 0 {
			bud.dropped++
			continue
		}
		bud.records--
		d := record.SecretFinding{Call: call, Where: fields[f.Part].Where, Rule: f.Rule, Rules: scan.RuleSet,
			Fingerprint: s.Cfg.Broker.Keys().Fingerprint(f.Secret), Action: action, PartlyScanned: partial[f.Part]}
		if err := s.Cfg.Audit.Commit(ctx, w, d); err != nil {
			return err
		}
	}
	texts := make([]string, len(fields))
	for i := range fields {
		texts[i] = parts[i].Text
	}
	broker.RedactParts(texts, fs)
	for i, f := range fields {
		if f.Shown != nil {
			*f.Shown = texts[i] + (*f.Val)[len(parts[i].Text):]
		}
	}
	first := fs[0]
	switch policy {
	case "block":
		return errdefs.New(errdefs.ErrSecretDetected, fmt.Sprintf("secret scan: %s holds what looks like a credential (rule %s: %s); the tenant's scan policy blocks the call (put credentials in secrets and grants instead)",
			fields[first.Part].Where, first.Rule, strings.TrimSuffix(first.Description, ".")))
	case "redact":
		for i, f := range fields {
			*f.Val = texts[i] + (*f.Val)[len(parts[i].Text):]
		}
	}
	return nil
}

// ScanSummary records what a call's scan left out: findings past
// MaxFindingRecords, and values read only in part (past MaxScanBytes).
// A call that fit its budget makes no summary.
func (s *Core) ScanSummary(ctx context.Context, w record.Who, call string, bud *ScanBudget) error {
	if s.Cfg.Broker == nil || bud.dropped == 0 && len(bud.unscanned) == 0 {
		return nil
	}
	return s.Cfg.Audit.Commit(ctx, w, record.ScanSummary{Call: call, Findings: bud.found, FindingsRecorded: bud.found - bud.dropped,
		FindingsDropped: bud.dropped, ScannedBytes: bud.read, Bytes: bud.total, MaxScanBytes: MaxScanBytes, MaxFindingRecords: MaxFindingRecords,
		PartlyScanned: bud.unscanned, PartlyScannedMore: bud.unscannedUnnamed})
}
