package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Principal is who a request comes from: the admin, or one tenant. What
// the tenant owns is bound to its ID; Tenant, its name, is for messages.
type Principal struct {
	Admin      bool
	ID         string
	Tenant     string
	Quotas     api.Quotas
	ScanPolicy string // block, redact or record
	// Roots are the host directories the tenant may name paths under.
	Roots []string
}

const adminKeyMeta = "admin_key_hash"

// newKey returns a fresh API key: 256 random bits, with a prefix that says
// what it is (so secret scanners can find leaked ones).
func newKey(kind string) string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "airlock_" + kind + "_" + base64.RawURLEncoding.EncodeToString(b[:])
}

// EnsureAdminKey writes a new admin key to path (root only) when the
// database has none, and says whether it did.
func (s *Service) EnsureAdminKey(ctx context.Context, path string) (bool, error) {
	h, err := s.cfg.Store.Meta(ctx, adminKeyMeta)
	if err != nil {
		return false, err
	}
	if h != "" {
		if _, err := os.Stat(path); err == nil {
			return false, nil
		}
	}
	key := newKey("admin")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, err
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(key+"\n"), 0o600); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return false, err
	}
	return true, s.cfg.Store.SetMeta(ctx, adminKeyMeta, store.HashKey(key))
}

// Authenticate maps an API key to its principal; remote is the request's
// remote address, for the record of a failure.
func (s *Service) Authenticate(ctx context.Context, key, remote string) (*Principal, error) {
	if key == "" {
		s.authFailed(remote, map[string]any{"reason": "no key"})
		return nil, errdefs.New(errdefs.ErrUnauthenticated, "no API key: send Authorization: Bearer <key>")
	}
	h := store.HashKey(key)
	s.mu.Lock()
	p, ok := s.keys[h]
	s.mu.Unlock()
	if !ok {
		var err error
		p, err = s.authenticate(ctx, h)
		if errors.Is(err, store.ErrNotFound) {
			// Who tried is unknown; the key's digest prefix ties attempts
			// together without keeping anything usable.
			s.authFailed(remote, map[string]any{"key_sha256_prefix": h[:12]})
			return nil, errdefs.New(errdefs.ErrUnauthenticated, "unknown API key")
		}
		if err != nil {
			return nil, err
		}
	}
	// A tenant deleted while its key was being looked up must not stay
	// cached.
	s.mu.Lock()
	defer s.mu.Unlock()
	if !p.Admin && s.gone[p.ID] {
		delete(s.keys, h)
		return nil, errTenantGone()
	}
	s.keys[h] = p
	return p, nil
}

// authenticate looks a key's hash up in the store (store.ErrNotFound:
// no such key).
func (s *Service) authenticate(ctx context.Context, h string) (*Principal, error) {
	admin, err := s.cfg.Store.Meta(ctx, adminKeyMeta)
	if err != nil {
		return nil, err
	}
	if admin != "" && h == admin {
		return &Principal{Admin: true}, nil
	}
	t, err := s.cfg.Store.TenantByKey(ctx, h)
	if err != nil {
		return nil, err
	}
	p := &Principal{ID: t.ID, Tenant: t.Name, ScanPolicy: t.ScanPolicy}
	if p.ScanPolicy == "" {
		p.ScanPolicy = DefaultScanPolicy
	}
	_ = json.Unmarshal([]byte(t.Quotas), &p.Quotas)
	p.Roots = rootsOf(t)
	return p, nil
}

func rootsOf(t store.Tenant) []string {
	var roots []string
	_ = json.Unmarshal([]byte(t.Roots), &roots)
	return roots
}

var tenantName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`) })

// Ceilings of a tenant's quotas.
const (
	maxQuotaSandboxes  = 100_000
	maxQuotaBytes      = 1 << 50 // 1 PiB
	maxQuotaCPUs       = 1 << 20
	maxQuotaCPUSeconds = 1 << 40
)

func validQuotas(q api.Quotas) error {
	if q.MaxSandboxes < 0 || q.MaxMemory < 0 || q.MaxCPUs < 0 || q.CPUSeconds < 0 || q.MaxSnapshotBytes < 0 {
		return errdefs.Invalid("quotas must not be negative")
	}
	// Ceilings keep sums and products of quotas far from overflow.
	switch {
	case q.MaxSandboxes > maxQuotaSandboxes:
		return errdefs.Invalid(fmt.Sprintf("max_sandboxes %d: at most %d", q.MaxSandboxes, maxQuotaSandboxes))
	case q.MaxMemory > maxQuotaBytes:
		return errdefs.Invalid(fmt.Sprintf("max_memory_bytes %d: at most %s", q.MaxMemory, spec.FormatSize(maxQuotaBytes)))
	case q.MaxSnapshotBytes > maxQuotaBytes:
		return errdefs.Invalid(fmt.Sprintf("max_snapshot_bytes %d: at most %s", q.MaxSnapshotBytes, spec.FormatSize(maxQuotaBytes)))
	case q.MaxCPUs > maxQuotaCPUs:
		return errdefs.Invalid(fmt.Sprintf("max_cpus %g: at most %d", q.MaxCPUs, maxQuotaCPUs))
	case q.CPUSeconds > maxQuotaCPUSeconds:
		return errdefs.Invalid(fmt.Sprintf("cpu_seconds %g: at most %g", q.CPUSeconds, float64(maxQuotaCPUSeconds)))
	}
	if _, err := parseDuration("cpu_period", q.CPUPeriod, DefaultCPUPeriod, 31*24*time.Hour); err != nil {
		return err
	}
	return nil
}

func admin(p *Principal) error {
	if !p.Admin {
		return errdefs.New(errdefs.ErrPermissionDenied, "this needs the admin key")
	}
	return nil
}

// CreateTenant adds a tenant and returns its key, shown this once.
func (s *Service) CreateTenant(ctx context.Context, p *Principal, req *api.CreateTenant) (*api.Tenant, error) {
	if err := admin(p); err != nil {
		return nil, err
	}
	if !tenantName().MatchString(req.Name) {
		return nil, errdefs.Invalid(fmt.Sprintf("tenant name %q: 1–63 of a-z, 0-9, _ and -, starting with a letter or digit", req.Name))
	}
	if err := validQuotas(req.Quotas); err != nil {
		return nil, err
	}
	if req.ScanPolicy == "" {
		req.ScanPolicy = DefaultScanPolicy
	}
	if !slices.Contains(spec.ScanPolicies, req.ScanPolicy) {
		return nil, errdefs.Invalid(fmt.Sprintf("scan_policy %q: one of %s", req.ScanPolicy, strings.Join(spec.ScanPolicies, ", ")))
	}
	roots, err := s.validRoots(req.Roots)
	if err != nil {
		return nil, err
	}
	key := newKey("tenant")
	q, _ := json.Marshal(req.Quotas)
	now := s.cfg.Now()
	id, err := s.cfg.Store.CreateTenant(ctx, store.Tenant{Name: req.Name, KeyHash: store.HashKey(key), Quotas: string(q), Created: now, CPUPeriodStart: now, ScanPolicy: req.ScanPolicy, Roots: rootsJSON(roots)})
	if errors.Is(err, store.ErrExists) {
		return nil, errdefs.New(errdefs.ErrAlreadyExists, "tenant "+req.Name+" exists")
	}
	if err != nil {
		return nil, err
	}
	if err := s.commit(ctx, who{tenant: id}, "tenant.created", "observed", map[string]any{"name": req.Name, "quotas": req.Quotas, "scan_policy": req.ScanPolicy, "roots": roots}); err != nil {
		return nil, err
	}
	s.cfg.Log.Info("tenant created", "tenant", req.Name, "id", id)
	return &api.Tenant{ID: id, Name: req.Name, Quotas: req.Quotas, ScanPolicy: req.ScanPolicy, Roots: roots, Created: now, Key: key}, nil
}

// UpdateTenant changes a tenant's quotas or scan policy; its key's next
// call sees them. Live sandboxes' proxies keep the policy they were made
// with.
func (s *Service) UpdateTenant(ctx context.Context, p *Principal, name string, req *api.UpdateTenant) (*api.Tenant, error) {
	if err := admin(p); err != nil {
		return nil, err
	}
	cur, err := s.cfg.Store.TenantByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteID(name))
	}
	if err != nil {
		return nil, err
	}
	var q api.Quotas
	_ = json.Unmarshal([]byte(cur.Quotas), &q)
	if req.Quotas != nil {
		if err := validQuotas(*req.Quotas); err != nil {
			return nil, err
		}
		q = *req.Quotas
	}
	policy := cur.ScanPolicy
	if req.ScanPolicy != "" {
		if !slices.Contains(spec.ScanPolicies, req.ScanPolicy) {
			return nil, errdefs.Invalid(fmt.Sprintf("scan_policy %q: one of %s", req.ScanPolicy, strings.Join(spec.ScanPolicies, ", ")))
		}
		policy = req.ScanPolicy
	}
	if policy == "" {
		policy = DefaultScanPolicy
	}
	roots := rootsOf(cur)
	if req.Roots != nil {
		if roots, err = s.validRoots(*req.Roots); err != nil {
			return nil, err
		}
	}
	qb, _ := json.Marshal(q)
	if err := s.cfg.Store.UpdateTenant(ctx, cur.ID, string(qb), policy); errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteID(name))
	} else if err != nil {
		return nil, err
	}
	if err := s.cfg.Store.SetTenantRoots(ctx, cur.ID, rootsJSON(roots)); err != nil {
		return nil, err
	}
	s.mu.Lock()
	for h, kp := range s.keys {
		if !kp.Admin && kp.ID == cur.ID {
			delete(s.keys, h) // the next call loads the new settings
		}
	}
	s.mu.Unlock()
	if err := s.commit(ctx, who{tenant: cur.ID}, "tenant.updated", "observed", map[string]any{"quotas": q, "scan_policy": policy, "roots": roots}); err != nil {
		return nil, err
	}
	return &api.Tenant{ID: cur.ID, Name: name, Quotas: q, ScanPolicy: policy, Roots: roots, Created: cur.Created}, nil
}

// Tenants lists the tenants (admin), or the caller's own tenant.
func (s *Service) Tenants(ctx context.Context, p *Principal) ([]*api.Tenant, error) {
	ts, err := s.cfg.Store.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	count := map[string]int{}
	for _, b := range s.boxes {
		count[b.rec.Tenant]++
	}
	s.mu.Unlock()
	out := []*api.Tenant{}
	for _, t := range ts {
		if !p.Admin && t.ID != p.ID {
			continue
		}
		at := &api.Tenant{ID: t.ID, Name: t.Name, Created: t.Created, Sandboxes: count[t.ID], ScanPolicy: t.ScanPolicy, Roots: rootsOf(t)}
		if at.ScanPolicy == "" {
			at.ScanPolicy = DefaultScanPolicy
		}
		_ = json.Unmarshal([]byte(t.Quotas), &at.Quotas)
		s.mu.Lock()
		if b := s.cpu[t.ID]; b != nil {
			at.CPUSeconds = b.used.Seconds()
		}
		s.mu.Unlock()
		out = append(out, at)
	}
	return out, nil
}

// DeleteTenant destroys a tenant's sandboxes (those being made included)
// and removes it with its snapshots and secrets; its key stops working at
// once. Its id is never issued again, so nothing of it passes to a tenant
// made later under the same name.
func (s *Service) DeleteTenant(ctx context.Context, p *Principal, name string) error {
	if err := admin(p); err != nil {
		return err
	}
	tn, err := s.cfg.Store.TenantByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteID(name))
	}
	if err != nil {
		return err
	}
	// From here no create of its is admitted and no cached key of its
	// answers; then what it has, live or being made, is destroyed.
	s.mu.Lock()
	s.gone[tn.ID] = true
	for h, kp := range s.keys {
		if !kp.Admin && kp.ID == tn.ID {
			delete(s.keys, h)
		}
	}
	s.mu.Unlock()
	ids, err := s.killAll(p, tn.ID, "kill switch (tenant "+name+" deleted)")
	if err != nil {
		return err
	}
	freed, err := s.cfg.Store.DeleteTenant(ctx, tn.ID)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteID(name))
	} else if err != nil {
		return err
	}
	if err := s.cfg.Store.DeleteMeta(ctx, mcpSpecMeta(tn.ID)); err != nil {
		return err
	}
	for _, c := range freed {
		s.removeSnapshotFiles(c)
	}
	s.mu.Lock()
	delete(s.cpu, tn.ID)
	s.mu.Unlock()
	s.cfg.Log.Info("tenant deleted", "tenant", name, "id", tn.ID, "sandboxes", len(ids), "snapshot_files_removed", len(freed))
	return s.commit(ctx, who{tenant: tn.ID}, "tenant.deleted", "observed", map[string]any{"name": name, "destroyed": ids})
}

// undoIfGone undoes a write that raced the deletion of tenant p (whose
// request was under way when it was deleted), so that nothing is left
// bound to a dead id, and refuses the call. Deletion marks the tenant gone
// before it removes what the tenant owns, so a write the removal missed
// is seen here.
func (s *Service) undoIfGone(p *Principal, undo func()) error {
	s.mu.Lock()
	gone := s.gone[p.ID]
	s.mu.Unlock()
	if !gone {
		return nil
	}
	undo()
	return errTenantGone()
}

// cpuBudget is one tenant's CPU use in its current period.
type cpuBudget struct {
	start time.Time
	used  time.Duration
}

func (b *cpuBudget) exhausted(q api.Quotas, now time.Time) bool {
	if q.CPUSeconds <= 0 {
		return false
	}
	period, _ := parseDuration("cpu_period", q.CPUPeriod, DefaultCPUPeriod, 0)
	if now.Sub(b.start) >= period {
		return false // a new period starts with the next tick
	}
	return b.used.Seconds() >= q.CPUSeconds
}

// chargeCPU adds what b used since last charged to its tenant's budget.
func (s *Service) chargeCPU(b *box) {
	cpu := b.inst.Usage().CPU
	s.mu.Lock()
	defer s.mu.Unlock()
	bud := s.cpu[b.rec.Tenant]
	if bud == nil {
		bud = &cpuBudget{start: s.cfg.Now()}
		s.cpu[b.rec.Tenant] = bud
	}
	if cpu > b.cpuSeen {
		bud.used += cpu - b.cpuSeen
		b.cpuSeen = cpu
	}
}

// loadBudgets takes the CPU budgets of tenants ts that the service does
// not hold yet from their records: budgets carry over a daemon restart
// (Recover loads them before any sandbox can end and charge one), and a
// tenant made since is loaded at the next tick.
func (s *Service) loadBudgets(ts []store.Tenant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range ts {
		if s.cpu[t.ID] == nil {
			s.cpu[t.ID] = &cpuBudget{start: t.CPUPeriodStart, used: t.CPUUsed}
		}
	}
}

// enforceCPU charges every live sandbox's CPU time, rolls budget periods
// over, and stops the sandboxes of tenants past their budget.
func (s *Service) enforceCPU(ctx context.Context, bs []*box) {
	ts, err := s.cfg.Store.Tenants(ctx)
	if err != nil {
		return
	}
	s.loadBudgets(ts)
	for _, b := range bs {
		s.chargeCPU(b)
	}
	now := s.cfg.Now()
	for _, t := range ts {
		var q api.Quotas
		_ = json.Unmarshal([]byte(t.Quotas), &q)
		period, _ := parseDuration("cpu_period", q.CPUPeriod, DefaultCPUPeriod, 0)
		s.mu.Lock()
		bud := s.cpu[t.ID]
		if now.Sub(bud.start) >= period {
			bud.start, bud.used = now, 0
		}
		start, used := bud.start, bud.used
		s.mu.Unlock()
		if start != t.CPUPeriodStart || used != t.CPUUsed {
			_ = s.cfg.Store.SetTenantCPU(ctx, t.ID, start, used)
		}
		if q.CPUSeconds > 0 && used.Seconds() >= q.CPUSeconds {
			reason := fmt.Sprintf("cpu budget of tenant %s exhausted (%.1f s of %.0f s per %v)", t.Name, used.Seconds(), q.CPUSeconds, period)
			for _, b := range bs {
				b.mu.Lock()
				ending := b.ending // stopped already, or ending for another reason
				b.mu.Unlock()
				if b.rec.Tenant == t.ID && !ending {
					s.cfg.Metrics.limitKills.WithLabelValues("cpu_budget").Inc()
					go s.end(b, reason)
				}
			}
		}
	}
}

// mcpSpecMeta keys a tenant's default MCP sandbox spec in the store, by
// the tenant's id.
func mcpSpecMeta(tenantID string) string { return "mcp_spec/" + tenantID }

// MCPSpec is the tenant's default spec for the sandboxes of its MCP
// sessions (empty: the defaults of a create).
func (s *Service) MCPSpec(ctx context.Context, p *Principal) (*api.CreateSandbox, error) {
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
func (s *Service) SetMCPSpec(ctx context.Context, p *Principal, spec *api.CreateSandbox) error {
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
	if err := s.undoIfGone(p, func() { _ = s.cfg.Store.DeleteMeta(context.WithoutCancel(ctx), mcpSpecMeta(p.ID)) }); err != nil {
		return err
	}
	rec := *spec
	rec.Env = nil // values may be secrets; the names stay
	names := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		names = append(names, k)
	}
	slices.Sort(names)
	return s.commit(ctx, who{tenant: p.ID}, "mcp.spec", "observed", map[string]any{"spec": rec, "env": names})
}
