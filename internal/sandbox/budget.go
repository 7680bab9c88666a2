package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/airlock-sandbox/airlock/internal/store"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// cpuBudget is one tenant's CPU use in its current period.
type cpuBudget struct {
	start time.Time
	used  time.Duration
}

func (b *cpuBudget) exhausted(q api.Quotas, now time.Time) bool {
	if q.CPUSeconds <= 0 {
		return false
	}
	period := tenant.CPUPeriod(q)
	if now.Sub(b.start) >= period {
		return false // a new period starts with the next tick
	}
	return b.used.Seconds() >= q.CPUSeconds
}

// chargeCPU adds what b used since last charged (of cpu, all it used so
// far) to its tenant's budget.
func (s *Service) chargeCPU(b *core.Box, cpu time.Duration) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	bud := s.cpu[b.Rec.Tenant]
	if bud == nil {
		bud = &cpuBudget{start: s.Cfg.Now()}
		s.cpu[b.Rec.Tenant] = bud
	}
	if cpu > b.CPUSeen {
		bud.used += cpu - b.CPUSeen
		b.CPUSeen = cpu
	}
}

// loadBudgets takes the CPU budgets of tenants ts that the service does
// not hold yet from their records: budgets carry over a daemon restart
// (Recover loads them before any sandbox can end and charge one), and a
// tenant made since is loaded at the next tick.
func (s *Service) loadBudgets(ts []store.Tenant) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	for _, t := range ts {
		if s.cpu[t.ID] == nil {
			s.cpu[t.ID] = &cpuBudget{start: t.CPUPeriodStart, used: t.CPUUsed}
		}
	}
}

// enforceCPU charges every live sandbox's CPU time, rolls budget periods
// over, and stops the sandboxes of tenants past their budget.
func (s *Service) enforceCPU(ctx context.Context, bs []*core.Box) {
	ts, err := s.Cfg.Store.Tenants(ctx)
	if err != nil {
		return
	}
	s.loadBudgets(ts)
	for _, b := range bs {
		s.chargeCPU(b, b.Inst.CPU())
	}
	now := s.Cfg.Now()
	for _, t := range ts {
		var q api.Quotas
		_ = json.Unmarshal([]byte(t.Quotas), &q)
		period := tenant.CPUPeriod(q)
		s.Mu.Lock()
		bud := s.cpu[t.ID]
		if now.Sub(bud.start) >= period {
			bud.start, bud.used = now, 0
		}
		start, used := bud.start, bud.used
		s.Mu.Unlock()
		if start != t.CPUPeriodStart || used != t.CPUUsed {
			_ = s.Cfg.Store.SetTenantCPU(ctx, t.ID, start, used)
		}
		if q.CPUSeconds > 0 && used.Seconds() >= q.CPUSeconds {
			reason := fmt.Sprintf("cpu budget of tenant %s exhausted (%.1f s of %.0f s per %v)", t.Name, used.Seconds(), q.CPUSeconds, period)
			for _, b := range bs {
				b.Mu.Lock()
				ending := b.Ending // stopped already, or ending for another reason
				b.Mu.Unlock()
				if b.Rec.Tenant == t.ID && !ending {
					s.Cfg.Metrics.LimitKills.WithLabelValues("cpu_budget").Inc()
					go s.end(b, reason)
				}
			}
		}
	}
}
