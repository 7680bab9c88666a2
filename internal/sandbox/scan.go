package sandbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/scan"
)

// DefaultScanPolicy is a tenant's unless it chose another.
const DefaultScanPolicy = "block"

// field is one value of a call the scanner reads, named for messages.
type field struct {
	where string
	val   *string
}

// scanCall applies the secret scanner to a call's fields under the
// tenant's policy: block fails the call (naming the rule, not the value),
// redact rewrites the fields, record lets it through. Every finding is
// recorded with its rule and a keyed fingerprint, never the value.
func (s *Service) scanCall(ctx context.Context, t *Principal, w who, call string, fields []field) error {
	if s.cfg.Broker == nil {
		return nil
	}
	// One pass over the fields joined as a command line: a credential
	// split from its name ("--token", "ghp_...") is still found.
	var b strings.Builder
	starts := make([]int, len(fields))
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(' ')
		}
		starts[i] = b.Len()
		b.WriteString(*f.val)
	}
	joined := b.String()
	fs, err := s.cfg.Broker.Scan(joined)
	if err != nil {
		return errdefs.New(errdefs.ErrUnavailable, "the secret scanner is unavailable: "+err.Error())
	}
	if len(fs) == 0 {
		return nil
	}
	policy := t.ScanPolicy
	if policy == "" {
		policy = DefaultScanPolicy
	}
	action := map[string]string{"block": "blocked", "redact": "redacted", "record": "recorded"}[policy]
	perField := make([][]scan.Finding, len(fields))
	var first string
	for _, f := range fs {
		i := 0
		for i+1 < len(fields) && starts[i+1] <= f.Start {
			i++
		}
		local := f
		local.Start -= starts[i]
		local.End = min(local.End-starts[i], len(*fields[i].val))
		perField[i] = append(perField[i], local)
		data := map[string]any{"call": call, "where": fields[i].where, "rule": f.Rule, "rules": scan.RuleSet, "fingerprint": s.cfg.Broker.Keys().Fingerprint(f.Secret), "action": action}
		if err := s.commit(ctx, w, "secret.finding", "observed", data); err != nil {
			return err
		}
		if first == "" {
			first = fmt.Sprintf("%s holds what looks like a credential (rule %s: %s)", fields[i].where, f.Rule, strings.TrimSuffix(f.Description, "."))
		}
	}
	switch policy {
	case "block":
		return errdefs.New(errdefs.ErrSecretDetected, "secret scan: "+first+"; the tenant's scan policy blocks the call (put credentials in secrets and grants instead)")
	case "redact":
		for i, local := range perField {
			if len(local) > 0 {
				*fields[i].val = scan.Redact(*fields[i].val, local)
			}
		}
	}
	return nil
}
