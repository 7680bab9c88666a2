// Package envd serves E2B's in-sandbox API (envd: the process and
// filesystem Connect services and the plain-HTTP /files and /health)
// for one sandbox per request, over the sandbox service, so every call is
// scanned, audited, rate limited and idle-tracked as airlock's own API's
// calls are. The front (internal/e2bapi) routes a request here only after
// it has found the sandbox and checked the caller's access token.
package envd

import (
	"context"

	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Target is the sandbox a request was routed to, and the tenant that owns
// it (the principal every service call is made as).
type Target struct {
	Principal *tenant.Principal
	ID        string
}

type targetKey struct{}

// WithTarget marks ctx as routed to t.
func WithTarget(ctx context.Context, t Target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

// TargetOf returns the sandbox ctx was routed to, if any.
func TargetOf(ctx context.Context) (Target, bool) {
	t, ok := ctx.Value(targetKey{}).(Target)
	return t, ok
}
