package sandbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/broker"
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
	parts := make([]broker.Part, len(fields))
	for i, f := range fields {
		parts[i] = broker.Part{Text: *f.val}
	}
	// One pass, the fields joined as a command line.
	fs, err := s.cfg.Broker.ScanParts(parts, ' ')
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
	for _, f := range fs {
		where := fields[f.Part].where
		data := map[string]any{"call": call, "where": where, "rule": f.Rule, "rules": scan.RuleSet, "fingerprint": s.cfg.Broker.Keys().Fingerprint(f.Secret), "action": action}
		if err := s.commit(ctx, w, "secret.finding", "observed", data); err != nil {
			return err
		}
	}
	first := fs[0]
	switch policy {
	case "block":
		return errdefs.New(errdefs.ErrSecretDetected, fmt.Sprintf("secret scan: %s holds what looks like a credential (rule %s: %s); the tenant's scan policy blocks the call (put credentials in secrets and grants instead)",
			fields[first.Part].where, first.Rule, strings.TrimSuffix(first.Description, ".")))
	case "redact":
		texts := make([]string, len(fields))
		for i, f := range fields {
			texts[i] = *f.val
		}
		broker.RedactParts(texts, fs)
		for i, f := range fields {
			*f.val = texts[i]
		}
	}
	return nil
}
