package sandbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// External ids. A create may name the sandbox by an id of the caller's
// own (api.CreateSandbox.ExternalID: a cluster's object's uid), unique
// among its tenant's listed sandboxes: the live ones (Boxes, adopted
// ones included: the id is stored with the sandbox's row) and the ended
// ones still on record. A create naming one of those answers it and
// makes nothing; creates naming the same id at once are one create, the
// others waiting for its answer (Service.external) and then looking
// again: they find its sandbox, or, when it failed, the next of them
// makes one.

// externalKey is one tenant's external id.
type externalKey struct{ tenant, id string }

// externalIDChar says c may be in an external id.
func externalIDChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '/' || c == '-'
}

// validExternalID refuses an external id that is too long or holds a
// character outside A-Za-z0-9 . _ : / - ("" is none).
func validExternalID(id string) error {
	if len(id) > api.MaxExternalID {
		return errdefs.Invalid(fmt.Sprintf("external_id: at most %d characters, not %d", api.MaxExternalID, len(id)))
	}
	for i := 0; i < len(id); i++ {
		if !externalIDChar(id[i]) {
			return errdefs.Invalid(fmt.Sprintf("external_id %s: only A-Z, a-z, 0-9, '.', '_', ':', '/' and '-'", core.QuoteID(id)))
		}
	}
	return nil
}

// checkCreate refuses what a create request names that it cannot: an
// invalid external id, pool_only without a pool.
func checkCreate(req *api.CreateSandbox) error {
	if req.PoolOnly && req.Pool == "" {
		return errdefs.Invalid("pool_only needs pool: the pool to take a sandbox of")
	}
	return validExternalID(req.ExternalID)
}

// claimExternal finds tenant t's sandbox of external id ext, or claims
// the id for the caller's create: then release must be called once the
// create has answered. It waits for a create in flight naming the same
// id.
func (s *Service) claimExternal(ctx context.Context, t *tenant.Principal, ext string) (found *api.Sandbox, release func(), err error) {
	key := externalKey{t.ID, ext}
	var done chan struct{}
	for done == nil {
		s.Mu.Lock()
		if b := s.liveExternal(key); b != nil {
			s.Mu.Unlock()
			return b.Describe(true), nil, nil
		}
		wait := s.external[key]
		if wait == nil {
			done = make(chan struct{})
			s.external[key] = done
		}
		s.Mu.Unlock()
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, nil, context.Cause(ctx)
			}
		}
	}
	release = func() {
		s.Mu.Lock()
		delete(s.external, key)
		s.Mu.Unlock()
		close(done)
	}
	recs, err := s.Cfg.Store.SandboxesByExternalID(ctx, t.ID, ext, api.StateEnded)
	if err != nil {
		release()
		return nil, nil, err
	}
	if len(recs) > 0 {
		release()
		return core.DescribeRecord(recs[len(recs)-1], nil), nil, nil
	}
	return nil, release, nil
}

// liveExternal is the live sandbox of key, or nil (under Core.Mu).
func (s *Service) liveExternal(key externalKey) *core.Box {
	for _, b := range s.Boxes {
		if b.Rec.ExternalID == key.id && b.Rec.Tenant == key.tenant {
			return b
		}
	}
	return nil
}

// ListSandboxes describes the sandboxes of tenant t that f selects: its
// live ones (every tenant's for the admin, and with f.All, which only
// the admin may ask), those of external id f.ExternalID alone when set,
// then with its ended ones still on record.
func (s *Service) ListSandboxes(ctx context.Context, t *tenant.Principal, f api.ListSandboxes) ([]*api.Sandbox, error) {
	if f.All && !t.Admin {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, "all=true (every tenant's sandboxes) needs the admin key")
	}
	if err := validExternalID(f.ExternalID); err != nil {
		return nil, err
	}
	out := s.List(ctx, t)
	if f.ExternalID == "" {
		return out, nil
	}
	out = slices.DeleteFunc(out, func(sb *api.Sandbox) bool { return sb.ExternalID != f.ExternalID })
	tid := t.ID
	if t.Admin {
		tid = ""
	}
	recs, err := s.Cfg.Store.SandboxesByExternalID(ctx, tid, f.ExternalID, api.StateEnded)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if !slices.ContainsFunc(out, func(sb *api.Sandbox) bool { return sb.ID == r.ID }) {
			out = append(out, core.DescribeRecord(r, nil))
		}
	}
	return out, nil
}
