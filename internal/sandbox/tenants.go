package sandbox

import (
	"context"

	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// What internal/tenant asks of the sandbox service (tenant.Sandboxes).
var _ tenant.Sandboxes = (*Service)(nil)

// EndTenant destroys every sandbox of tenant id for reason, the creates
// in flight included, and returns their ids once all are gone. The
// tenant's principals are refused before it is called (tenant.Service
// marks them), so no create of its is admitted after.
func (s *Service) EndTenant(by *tenant.Principal, id, reason string) ([]string, error) {
	return s.killAll(by, id, reason)
}

// ForgetTenant removes what the service keeps of deleted tenant id: its
// MCP spec, its CPU budget, and the snapshot files no record names any
// more (freed).
func (s *Service) ForgetTenant(ctx context.Context, id string, freed []string) error {
	if err := s.ForgetMCPSpec(ctx, id); err != nil {
		return err
	}
	for _, c := range freed {
		s.RemoveFiles(c)
	}
	s.Mu.Lock()
	delete(s.cpu, id)
	s.Mu.Unlock()
	return nil
}

// TenantUsage is what tenant id holds, counted as admit counts it for
// max_sandboxes (live sandboxes, creates in flight, its pools' ready
// sandboxes: a pool's refill is a create in flight), and the CPU seconds
// it used in its current period.
func (s *Service) TenantUsage(id string) tenant.Usage {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	var u tenant.Usage
	for _, b := range s.Boxes {
		if b.Rec.Tenant == id {
			u.Sandboxes++
		}
	}
	for _, pc := range s.pending {
		if pc.tenant == id {
			u.Sandboxes++
		}
	}
	u.Pooled, _, _ = s.pools.held(id, nil)
	u.Sandboxes += u.Pooled
	if b := s.cpu[id]; b != nil {
		u.CPUSeconds = b.used.Seconds()
	}
	return u
}
