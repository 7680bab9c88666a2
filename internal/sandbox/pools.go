package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Warm pools. A pool is a tenant's named create spec of which the daemon
// keeps Size sandboxes made ahead, through the one construction path
// (launch → Backend.Create), and frozen. A create that names the pool, or
// whose spec equals the pool's but for what is per request (env, TTL,
// idle timeout, metadata, trigger), takes one: it is thawed, given what
// is per request, recorded (sandbox.created, with the pool's name) and
// from then on is the caller's like any other; it never goes back. One
// refiller per service makes what the pools lack, at most poolFills at
// once. Pooled sandboxes count against their tenant's quotas; the kill
// switch and a tenant's deletion end them and remove the pools. Pools are
// recorded in the store: a restarted daemon ends the pooled sandboxes it
// finds (Recover; they are made afresh rather than adopted) and sets the
// pools again, as their tenants are now (one that fails for a reason
// that may pass is tried again, restorePools).

// statePooled is the state recorded of a sandbox made ahead and not yet
// taken. Recover ends every one.
const statePooled = "pooled"

// Bounds of the pools.
const (
	maxPoolSize       = 64 // sandboxes in one pool
	maxPoolsPerTenant = 16
	poolFills         = 2 // pooled sandboxes being made at once, all pools
)

// poolName is compiled at first use: its repetition makes a program of
// ~60 states, which every start of airlock built at init for nothing.
var poolName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`) })

// pool is one tenant's pool (its fields under Core.Mu).
type pool struct {
	tenant, name string
	tenantName   string // as the node reports it (node.go)
	def          api.SetPool
	sp           spec.Spec // what each of its sandboxes is made from: no Env, Pool set
	size         int
	idle         []*core.Box // made and frozen, oldest first
	filling      int
	hits, misses int64
	err          string    // the last refill's failure ("": it worked)
	fails        int       // refills failed in a row
	retry        time.Time // no refill before this (after failures)
	gone         bool      // removed or redefined: what is made for it is ended
}

// poolSet is the tenants' pools (under Core.Mu).
type poolSet struct {
	by     map[string]map[string]*pool // tenant id → name → pool
	kick   chan struct{}               // wakes the refiller
	served string                      // the tenant the last refill was for (needs)
	// unrestored is the recorded pools a restarted daemon has not set
	// again yet (retryRestores).
	unrestored map[poolKey]*unrestored
}

// poolKey names a tenant's pool.
type poolKey struct{ tenant, name string }

// unrestored is a recorded pool not set again yet, and its failures.
type unrestored struct {
	rec   store.Pool
	fails int
	err   string    // the last try's failure
	retry time.Time // no try before this
}

func newPoolSet() poolSet {
	return poolSet{by: map[string]map[string]*pool{}, kick: make(chan struct{}, 1), unrestored: map[poolKey]*unrestored{}}
}

// wake asks the refiller to look at the pools.
func (ps *poolSet) wake() {
	select {
	case ps.kick <- struct{}{}:
	default:
	}
}

// held counts what tenant tid's pools hold ready (but for pool except),
// as a quota counts it; what they are making is counted with the
// creates in flight.
func (ps *poolSet) held(tid string, except *pool) (n int, mem int64, cpus float64) {
	for _, p := range ps.by[tid] {
		if p == except {
			continue
		}
		k := len(p.idle)
		n += k
		mem += int64(k) * p.sp.Limits.Memory
		cpus += float64(k) * p.sp.Limits.CPUs
	}
	return n, mem, cpus
}

// sized sets the size metric to what the pools are to hold (under
// Core.Mu, after a change).
func (ps *poolSet) sized(m *core.Metrics) {
	n := 0
	for _, byName := range ps.by {
		for _, p := range byName {
			n += p.size
		}
	}
	m.PoolSize.Set(float64(n))
}

// drop takes b out of its pool's ready sandboxes; it reports whether b
// was one.
func (ps *poolSet) drop(b *core.Box) bool {
	p := ps.by[b.Rec.Tenant][b.Spec.Pool]
	if p == nil {
		return false
	}
	i := slices.Index(p.idle, b)
	if i < 0 {
		return false
	}
	p.idle = slices.Delete(p.idle, i, i+1)
	return true
}

// remove takes tenant tid's pools (every tenant's for "") out of the set,
// those not restored yet too, and marks them gone; their ready sandboxes
// are the caller's to end.
func (ps *poolSet) remove(tid string) []*pool {
	for key := range ps.unrestored {
		if tid == "" || key.tenant == tid {
			delete(ps.unrestored, key)
		}
	}
	var out []*pool
	for id, byName := range ps.by {
		if tid != "" && id != tid {
			continue
		}
		for _, p := range byName {
			p.gone = true
			out = append(out, p)
		}
		delete(ps.by, id)
	}
	return out
}

// matchable is sp without what a create gives a made sandbox.
func matchable(sp spec.Spec) spec.Spec {
	sp.Env, sp.Timeout, sp.Pool = nil, 0, ""
	return sp
}

// poolMismatch says why a create of spec req cannot be given a sandbox
// of a pool of spec p ("": it can).
func poolMismatch(p, req spec.Spec) string {
	switch {
	case req.Workspace != "" || req.Repo != "":
		return "a workspace or repo cannot be given to a sandbox made ahead"
	case len(req.Grants) > 0:
		return "grants cannot be given to a sandbox made ahead"
	case req.Restore != "" || req.Fork != "":
		return "a sandbox restored from a snapshot is not made ahead"
	case req.NetMode() != p.NetMode():
		return fmt.Sprintf("its network mode (%s) is not the pool's (%s)", req.NetMode(), p.NetMode())
	case !slices.Equal(req.Net.Allow, p.Net.Allow) || !slices.Equal(req.Net.Deny, p.Net.Deny) || req.Net.PolicyFile != p.Net.PolicyFile ||
		req.Net.EgressBytes != p.Net.EgressBytes || req.Net.MaxConns != p.Net.MaxConns:
		return "its egress policy is not the pool's"
	case req.Wall() != p.Wall():
		return fmt.Sprintf("its isolation (%s) is not the pool's (%s)", req.Wall(), p.Wall())
	case req.Image != p.Image:
		return "its image is not the pool's"
	case req.Limits != p.Limits:
		return "its limits are not the pool's"
	}
	a, b := matchable(p), matchable(req)
	if !equalSpecs(a, b) {
		return "its spec is not the pool's (hostname, writable root, degraded controls, user or host roots)"
	}
	return ""
}

// equalSpecs compares two specs' fields, nil and empty lists alike.
func equalSpecs(a, b spec.Spec) bool {
	return a.Isolation == b.Isolation && a.Image == b.Image && a.WritableRootfs == b.WritableRootfs &&
		a.Workspace == b.Workspace && a.Repo == b.Repo && a.Commit == b.Commit && a.User == b.User &&
		slices.Equal(a.Env, b.Env) && slices.Equal(a.Command, b.Command) && a.TTY == b.TTY && a.Limits == b.Limits &&
		slices.Equal(a.AllowDegraded, b.AllowDegraded) && a.Hostname == b.Hostname && a.Timeout == b.Timeout &&
		a.Net.Mode == b.Net.Mode && slices.Equal(a.Net.Allow, b.Net.Allow) && slices.Equal(a.Net.Deny, b.Net.Deny) &&
		a.Net.PolicyFile == b.Net.PolicyFile && a.Net.EgressBytes == b.Net.EgressBytes && a.Net.MaxConns == b.Net.MaxConns &&
		len(a.Grants) == 0 && len(b.Grants) == 0 && a.Tenant == b.Tenant && a.Scan == b.Scan &&
		slices.Equal(a.HostRoots, b.HostRoots) && a.Restore == b.Restore && a.Fork == b.Fork && a.Pool == b.Pool
}

// SetPool defines tenant t's pool name (or redefines it: a pool whose
// spec changes has its ready sandboxes ended and is made afresh; one
// whose size alone changes keeps them, up to the new size). A pool that
// would take t past its quotas is refused.
func (s *Service) SetPool(ctx context.Context, t *tenant.Principal, name string, req *api.SetPool) (*api.Pool, error) {
	return s.setPool(ctx, t, name, req, nil)
}

// setPool is SetPool; restoring (a pool a restarted daemon read back,
// nil for a caller's) skips the quota check (made when it was set; each
// refill is admitted as any create) and the write of what is already
// recorded, and sets nothing (errSuperseded) once the pool was set or
// removed by its tenant since. A caller's set replaces a recorded pool
// not yet restored.
func (s *Service) setPool(ctx context.Context, t *tenant.Principal, name string, req *api.SetPool, restoring *unrestored) (*api.Pool, error) {
	restored := restoring != nil
	if s.Cfg.Principal == nil {
		return nil, errdefs.Unavailable("this service keeps no pools")
	}
	if !poolName().MatchString(name) {
		return nil, errdefs.Invalid(fmt.Sprintf("pool name %s: 1–63 of a-z, 0-9, _ and -, starting with a letter or digit", core.QuoteID(name)))
	}
	if req.Size < 1 || req.Size > maxPoolSize {
		return nil, errdefs.Invalid(fmt.Sprintf("size %d: a pool holds 1 to %d sandboxes (remove it with DELETE)", req.Size, maxPoolSize))
	}
	creq := &api.CreateSandbox{Isolation: req.Isolation, Image: req.Image, Limits: req.Limits, Network: req.Network}
	if strings.HasPrefix(creq.Image, "snapshot:") {
		return nil, errdefs.Invalid("a pool's image cannot be a snapshot")
	}
	sp, _, _, err := s.specOf(ctx, t, creq)
	if err != nil {
		return nil, err
	}
	sp.Pool = name // and the default TTL, for the wall; a create sets its own
	q := t.Quotas
	s.Mu.Lock()
	if err := t.Err(); err != nil {
		s.Mu.Unlock()
		return nil, err
	}
	key := poolKey{t.ID, name}
	if restored && s.pools.unrestored[key] != restoring {
		s.Mu.Unlock()
		return nil, errSuperseded
	}
	ps := s.pools.by[t.ID]
	old := ps[name]
	if old == nil && len(ps) >= maxPoolsPerTenant {
		s.Mu.Unlock()
		return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("a tenant has at most %d pools", maxPoolsPerTenant))
	}
	n, mem, cpus := s.pools.held(t.ID, old)
	for _, b := range s.Boxes {
		if b.Rec.Tenant == t.ID {
			n, mem, cpus = n+1, mem+b.Spec.Limits.Memory, cpus+b.Spec.Limits.CPUs
		}
	}
	for _, pc := range s.pending {
		if pc.tenant == t.ID {
			n, mem, cpus = n+1, mem+pc.mem, cpus+pc.cpus
		}
	}
	k := req.Size
	refuse := ""
	switch {
	case q.MaxSandboxes > 0 && n+k > q.MaxSandboxes:
		refuse = fmt.Sprintf("tenant %s may have %d sandboxes at once and has %d beside this pool", t.Tenant, q.MaxSandboxes, n)
	case q.MaxMemory > 0 && mem+int64(k)*sp.Limits.Memory > q.MaxMemory:
		refuse = fmt.Sprintf("tenant %s may use %s of memory in all and holds %s beside this pool, which asks %s", t.Tenant, spec.FormatSize(q.MaxMemory), spec.FormatSize(mem), spec.FormatSize(int64(k)*sp.Limits.Memory))
	case q.MaxCPUs > 0 && cpus+float64(k)*sp.Limits.CPUs > q.MaxCPUs+1e-9:
		refuse = fmt.Sprintf("tenant %s may use %g CPUs in all and holds %g beside this pool, which asks %g", t.Tenant, q.MaxCPUs, cpus, float64(k)*sp.Limits.CPUs)
	}
	if refuse != "" && !restored {
		s.Mu.Unlock()
		return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: a pool of %d sandboxes would exceed it: %s", k, refuse))
	}
	if !restored {
		// On the record before it takes effect (a pool set is rare: the
		// service waits for the write).
		if err := s.Cfg.Audit.Commit(ctx, record.Who{Tenant: t.ID}, record.PoolSet{Name: name, Size: req.Size, Spec: matchable(sp)}); err != nil {
			s.Mu.Unlock()
			return nil, err
		}
		def, _ := json.Marshal(req)
		if err := s.Cfg.Store.PutPool(ctx, store.Pool{Tenant: t.ID, Name: name, Def: string(def)}); err != nil {
			s.Mu.Unlock()
			return nil, fmt.Errorf("record pool: %w", err)
		}
	}
	delete(s.pools.unrestored, key)
	var ending []*core.Box
	p := old
	if old == nil || !equalSpecs(matchable(old.sp), matchable(sp)) {
		if old != nil {
			old.gone = true
			ending = old.idle
			old.idle = nil
		}
		p = &pool{tenant: t.ID, tenantName: t.Tenant, name: name, sp: sp}
		if ps == nil {
			ps = map[string]*pool{}
			s.pools.by[t.ID] = ps
		}
		ps[name] = p
	}
	p.def, p.size = *req, req.Size
	if len(p.idle) > p.size {
		ending = append(ending, p.idle[p.size:]...)
		p.idle = slices.Clone(p.idle[:p.size])
	}
	s.pools.sized(s.Cfg.Metrics)
	out := p.describe()
	s.Mu.Unlock()
	s.node.changed()
	s.Cfg.Metrics.PoolReady.Sub(float64(len(ending)))
	s.endAll(ending, "pool "+core.QuoteID(name)+" was redefined")
	s.pools.wake()
	return out, nil
}

// restorePools sets again the pools recorded by an earlier daemon, as
// their tenants are now (retryRestores). A pool that cannot be for a
// lasting reason (its tenant gone, its spec refused now) is dropped, and
// the log says why; one that fails for a reason that may pass (the
// store, a lookup) stays recorded and is tried again, later each time.
func (s *Service) restorePools(ctx context.Context) error {
	if s.Cfg.Principal == nil {
		return nil
	}
	ps, err := s.Cfg.Store.Pools(ctx)
	if err != nil {
		return err
	}
	s.Mu.Lock()
	for _, rp := range ps {
		s.pools.unrestored[poolKey{rp.Tenant, rp.Name}] = &unrestored{rec: rp}
	}
	s.Mu.Unlock()
	return s.retryRestores(ctx)
}

// errSuperseded: a recorded pool's tenant set or removed it before it
// was restored.
var errSuperseded = errors.New("set or removed since")

// retryRestores tries again the recorded pools not yet restored whose
// time has come (all of them at start). It fails only when a dropped
// pool's record cannot be removed.
func (s *Service) retryRestores(ctx context.Context) error {
	s.Mu.Lock()
	now := s.Cfg.Now()
	var due []*unrestored
	for _, u := range s.pools.unrestored {
		if !now.Before(u.retry) {
			due = append(due, u)
		}
	}
	s.Mu.Unlock()
	var errs []error
	for _, u := range due {
		rp := u.rec
		var req api.SetPool
		err := json.Unmarshal([]byte(rp.Def), &req)
		if err != nil {
			err = errdefs.Invalid("its recorded definition is unreadable: " + err.Error())
		} else {
			var t *tenant.Principal
			if t, err = s.Cfg.Principal(ctx, rp.Tenant); err == nil {
				_, err = s.setPool(ctx, t, rp.Name, &req, u)
			}
		}
		if err == nil || errors.Is(err, errSuperseded) {
			continue
		}
		key := poolKey{rp.Tenant, rp.Name}
		s.Mu.Lock()
		if s.pools.unrestored[key] != u {
			s.Mu.Unlock()
			continue // its tenant set or removed it meanwhile
		}
		if lasting(err) {
			delete(s.pools.unrestored, key)
			s.Cfg.Log.Warn("pool dropped at start", "tenant", rp.Tenant, "pool", rp.Name, "err", err)
			if derr := s.Cfg.Store.DeletePools(ctx, rp.Tenant, rp.Name); derr != nil {
				errs = append(errs, derr)
			}
		} else {
			u.fails++
			u.err = err.Error()
			u.retry = s.Cfg.Now().Add(min(time.Second<<min(u.fails, 6), time.Minute))
			s.Cfg.Log.Warn("pool not set again at start; it will be retried", "tenant", rp.Tenant, "pool", rp.Name, "err", err, "fails", u.fails)
		}
		s.Mu.Unlock()
	}
	return errors.Join(errs...)
}

// lasting says a recorded pool cannot be set again however often it is
// tried: its tenant is gone, or refuses it now (wall, roots, a spec or
// definition no longer valid).
func lasting(err error) bool {
	for _, class := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied, errdefs.ErrFailedPrecondition} {
		if errors.Is(err, class) {
			return true
		}
	}
	return false
}

// describe is u as the API shows it: its recorded definition, nothing
// ready, and why it is not set yet.
func (u *unrestored) describe() *api.Pool {
	var d api.SetPool
	_ = json.Unmarshal([]byte(u.rec.Def), &d)
	why := "not set again since the daemon restarted (it will be retried)"
	if u.err != "" {
		why = "not set again since the daemon restarted: " + u.err + " (it will be retried)"
	}
	return &api.Pool{Name: u.rec.Name, Size: d.Size, Isolation: d.Isolation, Image: d.Image, Limits: d.Limits, Network: d.Network, Error: why}
}

// describe is p as the API shows it (under Core.Mu).
func (p *pool) describe() *api.Pool {
	d := p.def
	return &api.Pool{Name: p.name, Size: p.size, Isolation: p.sp.Wall(), Image: p.sp.Image,
		Limits:  api.Limits{MemoryBytes: p.sp.Limits.Memory, DiskBytes: p.sp.Limits.Disk, CPUs: p.sp.Limits.CPUs, Pids: p.sp.Limits.Pids},
		Network: api.Network{Mode: p.sp.NetMode(), Allow: d.Network.Allow, Deny: d.Network.Deny, EgressBytes: p.sp.Net.EgressBytes, MaxConns: p.sp.Net.MaxConns},
		Ready:   len(p.idle), Filling: p.filling, Hits: p.hits, Misses: p.misses, Error: p.err}
}

// Pools lists tenant t's pools by name.
func (s *Service) Pools(_ context.Context, t *tenant.Principal) []*api.Pool {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	ps := s.pools.by[t.ID]
	out := make([]*api.Pool, 0, len(ps))
	for _, name := range slices.Sorted(maps.Keys(ps)) {
		out = append(out, ps[name].describe())
	}
	for key, u := range s.pools.unrestored {
		if key.tenant == t.ID {
			out = append(out, u.describe())
		}
	}
	slices.SortFunc(out, func(a, b *api.Pool) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Pool describes tenant t's pool name.
func (s *Service) Pool(_ context.Context, t *tenant.Principal, name string) (*api.Pool, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	p := s.pools.by[t.ID][name]
	if p == nil {
		if u := s.pools.unrestored[poolKey{t.ID, name}]; u != nil {
			return u.describe(), nil
		}
		return nil, errdefs.New(errdefs.ErrNotFound, "no pool "+core.QuoteID(name))
	}
	return p.describe(), nil
}

// DeletePool removes tenant t's pool name and ends its ready sandboxes;
// it answers when they are gone. What is being made for it is ended as
// it comes.
func (s *Service) DeletePool(ctx context.Context, t *tenant.Principal, name string) error {
	s.Mu.Lock()
	key := poolKey{t.ID, name}
	p := s.pools.by[t.ID][name]
	if p == nil && s.pools.unrestored[key] == nil {
		s.Mu.Unlock()
		return errdefs.New(errdefs.ErrNotFound, "no pool "+core.QuoteID(name))
	}
	if err := s.Cfg.Audit.Commit(ctx, record.Who{Tenant: t.ID}, record.PoolRemoved{Name: name}); err != nil {
		s.Mu.Unlock()
		return err
	}
	if err := s.Cfg.Store.DeletePools(context.WithoutCancel(ctx), t.ID, name); err != nil {
		s.Mu.Unlock()
		return err
	}
	delete(s.pools.unrestored, key)
	if p == nil {
		s.Mu.Unlock()
		return nil
	}
	delete(s.pools.by[t.ID], name)
	s.pools.sized(s.Cfg.Metrics)
	p.gone = true
	ending := p.idle
	p.idle = nil
	s.Mu.Unlock()
	s.node.changed()
	s.Cfg.Metrics.PoolReady.Sub(float64(len(ending)))
	s.endAll(ending, "pool "+core.QuoteID(name)+" was removed")
	return nil
}

// endAll ends bs for reason and returns when all are gone.
func (s *Service) endAll(bs []*core.Box, reason string) {
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Go(func() { s.end(b, reason) })
	}
	wg.Wait()
}

// withPoolDefaults is req with what it leaves unset of the pool it names
// (image, isolation, limits, network) set as the pool's.
func (s *Service) withPoolDefaults(t *tenant.Principal, req *api.CreateSandbox) (*api.CreateSandbox, error) {
	if req.Pool == "" {
		return req, nil
	}
	s.Mu.Lock()
	p := s.pools.by[t.ID][req.Pool]
	var def api.SetPool
	if p != nil {
		def = p.def
	}
	s.Mu.Unlock()
	if p == nil {
		return nil, errdefs.New(errdefs.ErrNotFound, "no pool "+core.QuoteID(req.Pool))
	}
	r := *req
	r.Image = cmp.Or(r.Image, def.Image)
	r.Isolation = cmp.Or(r.Isolation, def.Isolation)
	l := &r.Limits
	l.MemoryBytes, l.DiskBytes = cmp.Or(l.MemoryBytes, def.Limits.MemoryBytes), cmp.Or(l.DiskBytes, def.Limits.DiskBytes)
	l.CPUs, l.Pids = cmp.Or(l.CPUs, def.Limits.CPUs), cmp.Or(l.Pids, def.Limits.Pids)
	if r.Network.Mode == "" && len(r.Network.Allow) == 0 && len(r.Network.Deny) == 0 && r.Network.EgressBytes == 0 && r.Network.MaxConns == 0 {
		r.Network = def.Network
		r.Network.Allow, r.Network.Deny = slices.Clone(def.Network.Allow), slices.Clone(def.Network.Deny)
	}
	return &r, nil
}

// takePooled finds the pool a create of tenant t (spec sp, naming pool
// named or none) may take a sandbox of, and takes one: it returns the
// sandbox, counted as a create in flight (pc, for the kill switch), or
// why the create gets none ("" when it named no pool and matched none).
func (s *Service) takePooled(_ context.Context, t *tenant.Principal, named string, sp *spec.Spec) (*core.Box, *pendingCreate, string, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	ps := s.pools.by[t.ID]
	var p *pool
	if named != "" {
		if p = ps[named]; p == nil {
			return nil, nil, "", errdefs.New(errdefs.ErrNotFound, "no pool "+core.QuoteID(named))
		}
		if why := poolMismatch(p.sp, *sp); why != "" {
			p.misses++
			s.Cfg.Metrics.PoolMisses.Inc()
			return nil, nil, fmt.Sprintf("pool %s: %s", named, why), nil
		}
	} else {
		// Of the pools it matches, one with a sandbox ready.
		for _, name := range slices.Sorted(maps.Keys(ps)) {
			if q := ps[name]; poolMismatch(q.sp, *sp) == "" && (p == nil || len(p.idle) == 0) {
				p = q
			}
		}
		if p == nil {
			return nil, nil, "", nil
		}
	}
	if len(p.idle) == 0 {
		p.misses++
		s.Cfg.Metrics.PoolMisses.Inc()
		s.pools.wake()
		return nil, nil, fmt.Sprintf("pool %s had no sandbox ready", p.name), nil
	}
	if err := t.Err(); err != nil {
		return nil, nil, "", err
	}
	if b := s.cpu[t.ID]; b != nil && b.exhausted(t.Quotas, s.Cfg.Now()) {
		return nil, nil, "", errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s has used its CPU budget (%.0f s per %s); creates resume when the period ends", t.Tenant, t.Quotas.CPUSeconds, t.Quotas.CPUPeriod))
	}
	b := p.idle[0]
	p.idle = slices.Delete(p.idle, 0, 1)
	p.hits++
	s.Cfg.Metrics.PoolHits.Inc()
	s.Cfg.Metrics.PoolReady.Dec()
	s.pools.wake()
	s.node.changed()
	// In flight from here to its answer: the kill switch ends it too.
	pc := pendingCreates([]string{b.Rec.ID}, t.ID, &b.Spec, func(error) {})[0]
	s.pending[pc.id] = pc
	return b, pc, "", nil
}

// give makes pooled sandbox b (taken, pc) the caller's: given the
// create's env (spec sp) and birth, its sandbox.created record put in
// its place in the log, and live. It answers then; what is left (thaw,
// the record durable, the row stored: settleGiven) runs on, and every call
// on the sandbox, and its end, waits for it (core.Find, Box.Settle).
// final says an error is the create's answer (the kill switch ended
// it); otherwise the create may be made afresh.
func (s *Service) give(ctx context.Context, t *tenant.Principal, pc *pendingCreate, b *core.Box, sp *spec.Spec, bo birth) (*api.Sandbox, bool, error) {
	t0 := time.Now()
	b.Mu.Lock()
	if b.Ending {
		b.Mu.Unlock()
		return nil, false, errdefs.New(errdefs.ErrFailedPrecondition, "it ended")
	}
	now := s.Cfg.Now()
	b.Spec.Env, b.Spec.Timeout, b.Spec.OnTTL = sp.Env, sp.Timeout, sp.OnTTL
	specJSON, _ := json.Marshal(b.Spec)
	meta, _ := json.Marshal(bo.metadata)
	trig, _ := json.Marshal(bo.trigger)
	b.Rec.State, b.Rec.Spec, b.Rec.Metadata, b.Rec.Trigger = api.StateRunning, string(specJSON), string(meta), string(trig)
	b.Rec.Created, b.Rec.Expires, b.Rec.IdleTimeout, b.Rec.LastActive = now, bo.expires, bo.idle, now
	b.Rec.ExternalID = bo.externalID
	rec, bsp := b.Rec, b.Spec
	st := core.NewSettle()
	b.Settle = st
	b.Mu.Unlock()
	// Its place in the log comes first: every record of it (its network's
	// too, once thawed) follows this one.
	durable, err := s.Cfg.Audit.Queue(b.Who(), record.SandboxCreated{
		Spec: record.Spec(bsp), Image: bsp.Image, ImageDigest: b.Inst.ImageDigest(), PolicySHA256: record.PolicyHash(bsp.Net.Allow, bsp.Net.Deny),
		Metadata: bo.metadata, Trigger: bo.trigger, Expires: &rec.Expires, IdleTimeout: bo.idle.String(),
		Controls: record.ControlsOf(b.Inst.Wall(), b.Inst.WallVersion(), b.Inst.Degraded()), InitPID: b.Inst.InitPid(), Pool: bsp.Pool, ExternalID: bo.externalID,
	})
	if err != nil {
		st.Finish(err)
		s.end(b, "its pool's sandbox could not be given to a create: "+err.Error())
		return nil, false, err
	}
	s.settling.Go(func() { s.settleGiven(b, st, durable, rec) })
	s.Mu.Lock()
	reason := pc.killed
	if reason == "" {
		s.Boxes[rec.ID] = b
	}
	s.Mu.Unlock()
	if reason != "" {
		s.end(b, reason)
		return nil, true, killedError(rec.ID, reason)
	}
	out := b.Describe(true)
	told := *out
	told.Usage = nil // as a sandbox made for its create is told
	s.publishSandbox(api.NodeEventSandboxCreated, &told)
	s.Cfg.Metrics.Creates.Inc()
	s.Cfg.Metrics.CreateSeconds.Observe(time.Since(t0).Seconds())
	s.Cfg.Log.Info("sandbox created", "id", rec.ID, "tenant", t.ID, "pool", bsp.Pool, "took", time.Since(t0))
	return out, true, nil
}

// settleGiven finishes what give left of pooled sandbox b (record rec): it
// is thawed (its processes are airlock's init and agent alone: nothing
// of the caller's runs before a call, and every call waits for this),
// its sandbox.created record is waited for on disk (durable), then its
// row is stored as the caller's — the record first, as launch does: a
// daemon that dies in between finds it stored as pooled and ends it.
// Anything failing ends the sandbox; its calls are refused.
func (s *Service) settleGiven(b *core.Box, st *core.Settle, durable func() error, rec store.Sandbox) {
	b.Mu.Lock()
	err := b.Inst.Resume()
	b.Mu.Unlock()
	if err != nil {
		err = fmt.Errorf("thaw: %w", err)
	}
	if derr := durable(); err == nil && derr != nil {
		err = derr
	}
	if err == nil {
		if perr := s.Cfg.Store.PutSandbox(context.Background(), rec); perr != nil {
			err = fmt.Errorf("record sandbox: %w", perr)
		}
	}
	st.Finish(err)
	if err != nil {
		s.Cfg.Log.Error("pooled sandbox given to a create", "id", rec.ID, "err", err)
		s.end(b, "its pool's sandbox could not be given to its create: "+err.Error())
	}
}

// refill keeps the pools full until ctx ends: woken by a change (a take,
// a new pool) or once a second, it starts what the pools lack, at most
// poolFills at once, tenants in turn (needs); a pool whose refills fail waits
// longer each time (up to a minute) before the next.
func (s *Service) refill(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	slots := make(chan struct{}, poolFills)
	var fills sync.WaitGroup
	defer fills.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.pools.kick:
		}
		if err := s.retryRestores(ctx); err != nil {
			s.Cfg.Log.Error("pools", "err", err)
		}
		for _, p := range s.needs(poolFills - len(slots)) {
			slots <- struct{}{}
			fills.Go(func() {
				defer func() { <-slots; s.pools.wake() }()
				s.fill(ctx, p)
			})
		}
	}
}

// needs picks up to k pools to make one sandbox for each, counting each
// as filling (a pool may be picked more than once). Tenants take turns
// (round robin in the order of their ids, from the one after the last
// served): a tenant with many pools, or large ones, takes no more of
// the refill slots than one with a single small pool while both lack
// sandboxes. Of a tenant's pools, the one holding the fewest goes first.
func (s *Service) needs(k int) []*pool {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	now := s.Cfg.Now()
	tids := slices.Sorted(maps.Keys(s.pools.by))
	var out []*pool
	for len(out) < k {
		var best *pool
		start, _ := slices.BinarySearch(tids, s.pools.served)
		if start < len(tids) && tids[start] == s.pools.served {
			start++
		}
		for i := 0; i < len(tids) && best == nil; i++ {
			for _, p := range s.pools.by[tids[(start+i)%len(tids)]] {
				if len(p.idle)+p.filling >= p.size || now.Before(p.retry) {
					continue
				}
				if best == nil || len(p.idle)+p.filling < len(best.idle)+best.filling || (len(p.idle)+p.filling == len(best.idle)+best.filling && p.name < best.name) {
					best = p
				}
			}
		}
		if best == nil {
			break
		}
		best.filling++
		s.pools.served = best.tenant
		out = append(out, best)
	}
	if len(out) > 0 {
		s.node.changed()
	}
	return out
}

// fill makes one sandbox for pool p (counted as filling) through launch,
// as its tenant now is.
func (s *Service) fill(ctx context.Context, p *pool) {
	err := s.fillOne(ctx, p)
	defer s.node.changed()
	s.Mu.Lock()
	defer s.Mu.Unlock()
	p.filling--
	if err == nil {
		p.err, p.fails, p.retry = "", 0, time.Time{}
		return
	}
	p.err = err.Error()
	p.fails++
	p.retry = s.Cfg.Now().Add(min(time.Second<<min(p.fails, 6), time.Minute))
	s.Cfg.Log.Warn("pool refill", "tenant", p.tenant, "pool", p.name, "err", err, "fails", p.fails)
}

func (s *Service) fillOne(ctx context.Context, p *pool) error {
	t, err := s.Cfg.Principal(ctx, p.tenant)
	if err != nil {
		return err
	}
	// The tenant as it is now: a wall it is now held to, or roots it no
	// longer has, refuse the refill rather than act on the old ones.
	s.Mu.Lock()
	def := p.def
	s.Mu.Unlock()
	sp, _, _, err := s.specOf(ctx, t, &api.CreateSandbox{Isolation: def.Isolation, Image: def.Image, Limits: def.Limits, Network: def.Network})
	if err != nil {
		return err
	}
	sp.Pool = p.name
	if !equalSpecs(matchable(sp), matchable(p.sp)) {
		return errdefs.New(errdefs.ErrFailedPrecondition, "the tenant's settings (roots, wall, scan policy) changed since the pool was set: set it again")
	}
	id := core.NewID()
	ctx, pcs, err := s.admit(ctx, t, []string{id}, &sp)
	if err != nil {
		return err
	}
	defer s.settle(pcs[0])
	_, err = s.launch(ctx, t, pcs[0], &sp, birth{pool: p})
	return err
}
