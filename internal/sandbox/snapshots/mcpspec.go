package snapshots

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// mcpSpecMeta keys a tenant's default MCP sandbox spec in the store, by
// the tenant's id.
func mcpSpecMeta(tenantID string) string { return "mcp_spec/" + tenantID }

// MCPSpec is the tenant's default spec for the sandboxes of its MCP
// sessions (empty: the defaults of a create).
func (s *Keeper) MCPSpec(ctx context.Context, p *tenant.Principal) (*api.CreateSandbox, error) {
	if p.Admin {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, "MCP specs belong to tenants: use a tenant's key")
	}
	v, err := s.Cfg.Store.Meta(ctx, mcpSpecMeta(p.ID))
	if err != nil {
		return nil, err
	}
	spec := &api.CreateSandbox{}
	if v != "" {
		if err := json.Unmarshal([]byte(v), spec); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

// SetMCPSpec keeps the tenant's default MCP sandbox spec, validated as a
// create would be.
func (s *Keeper) SetMCPSpec(ctx context.Context, p *tenant.Principal, spec *api.CreateSandbox) error {
	if p.Admin {
		return errdefs.New(errdefs.ErrPermissionDenied, "MCP specs belong to tenants: use a tenant's key")
	}
	if spec.ExternalID != "" {
		return errdefs.Invalid("external_id: an MCP spec makes many sandboxes, and an external id names one")
	}
	sp, _, _, err := core.SpecOf(spec)
	if err != nil {
		return err
	}
	if err := s.Confine(p, &sp); err != nil {
		return err
	}
	if s.Cfg.Backend != nil {
		if err := s.Cfg.Backend.CheckHostPaths(&sp); err != nil {
			return err
		}
	}
	b, _ := json.Marshal(spec)
	if err := s.Cfg.Store.SetMeta(ctx, mcpSpecMeta(p.ID), string(b)); err != nil {
		return err
	}
	if err := p.UndoIfDeleted(func() { _ = s.Cfg.Store.DeleteMeta(context.WithoutCancel(ctx), mcpSpecMeta(p.ID)) }); err != nil {
		return err
	}
	rec := *spec
	rec.Env = nil // values may be secrets; the names stay
	names := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		names = append(names, k)
	}
	slices.Sort(names)
	return s.Cfg.Audit.Commit(ctx, record.Who{Tenant: p.ID}, record.MCPSpec{Spec: rec, Env: names})
}

// ForgetMCPSpec removes the MCP spec of deleted tenant id.
func (s *Keeper) ForgetMCPSpec(ctx context.Context, id string) error {
	return s.Cfg.Store.DeleteMeta(ctx, mcpSpecMeta(id))
}
