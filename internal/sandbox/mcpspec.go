package sandbox

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// the tenant's id.
func mcpSpecMeta(tenantID string) string { return "mcp_spec/" + tenantID }

// MCPSpec is the tenant's default spec for the sandboxes of its MCP
// sessions (empty: the defaults of a create).
func (s *Service) MCPSpec(ctx context.Context, p *tenant.Principal) (*api.CreateSandbox, error) {
	if p.Admin {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, "MCP specs belong to tenants: use a tenant's key")
	}
	v, err := s.cfg.Store.Meta(ctx, mcpSpecMeta(p.ID))
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
func (s *Service) SetMCPSpec(ctx context.Context, p *tenant.Principal, spec *api.CreateSandbox) error {
	if p.Admin {
		return errdefs.New(errdefs.ErrPermissionDenied, "MCP specs belong to tenants: use a tenant's key")
	}
	sp, _, _, err := specOf(spec)
	if err != nil {
		return err
	}
	if err := s.confine(p, &sp); err != nil {
		return err
	}
	if s.cfg.Backend != nil {
		if err := s.cfg.Backend.CheckHostPaths(&sp); err != nil {
			return err
		}
	}
	b, _ := json.Marshal(spec)
	if err := s.cfg.Store.SetMeta(ctx, mcpSpecMeta(p.ID), string(b)); err != nil {
		return err
	}
	if err := p.UndoIfDeleted(func() { _ = s.cfg.Store.DeleteMeta(context.WithoutCancel(ctx), mcpSpecMeta(p.ID)) }); err != nil {
		return err
	}
	rec := *spec
	rec.Env = nil // values may be secrets; the names stay
	names := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		names = append(names, k)
	}
	slices.Sort(names)
	return s.cfg.Audit.Commit(ctx, record.Who{Tenant: p.ID}, record.MCPSpec{Spec: rec, Env: names})
}
