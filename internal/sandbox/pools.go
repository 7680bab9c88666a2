package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
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
// pools again, as their tenants are now.

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
	by   map[string]map[string]*pool // tenant id → name → pool
	kick chan struct{}               // wakes the refiller
}

func newPoolSet() poolSet {
	return poolSet{by: map[string]map[string]*pool{}, kick: make(chan struct{}, 1)}
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

// remove takes tenant tid's pools (every tenant's for "") out of the set
// and marks them gone; their ready sandboxes are the caller's to end.
func (ps *poolSet) remove(tid string) []*pool {
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
	return s.setPool(ctx, t, name, req, false)
}

// setPool is SetPool; restored (a pool a restarted daemon read back) skips
// the quota check (made when it was set; each refill is admitted as any
// create) and the write of what is already recorded.
func (s *Service) setPool(ctx context.Context, t *tenant.Principal, name string, req *api.SetPool, restored bool) (*api.Pool, error) {
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
	var ending []*core.Box
	p := old
	if old == nil || !equalSpecs(matchable(old.sp), matchable(sp)) {
		if old != nil {
			old.gone = true
			ending = old.idle
			old.idle = nil
		}
		p = &pool{tenant: t.ID, name: name, sp: sp}
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
	out := p.describe()
	s.Mu.Unlock()
	s.Cfg.Metrics.PoolReady.Sub(float64(len(ending)))
	s.endAll(ending, "pool "+core.QuoteID(name)+" was redefined")
	s.pools.wake()
	return out, nil
}

// restorePools sets again the pools recorded by an earlier daemon, as
// their tenants are now; one that cannot be (its tenant gone, its spec
// refused now) is dropped, and the log says why.
func (s *Service) restorePools(ctx context.Context) error {
	if s.Cfg.Principal == nil {
		return nil
	}
	ps, err := s.Cfg.Store.Pools(ctx)
	if err != nil {
		return err
	}
	for _, rp := range ps {
		var req api.SetPool
		err := json.Unmarshal([]byte(rp.Def), &req)
		if err == nil {
			var t *tenant.Principal
			if t, err = s.Cfg.Principal(ctx, rp.Tenant); err == nil {
				_, err = s.setPool(ctx, t, rp.Name, &req, true)
			}
		}
		if err != nil {
			s.Cfg.Log.Warn("pool dropped at start", "tenant", rp.Tenant, "pool", rp.Name, "err", err)
			if derr := s.Cfg.Store.DeletePools(ctx, rp.Tenant, rp.Name); derr != nil {
				return derr
			}
		}
	}
	return nil
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
	return out
}

// Pool describes tenant t's pool name.
func (s *Service) Pool(_ context.Context, t *tenant.Principal, name string) (*api.Pool, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	p := s.pools.by[t.ID][name]
	if p == nil {
		return nil, errdefs.New(errdefs.ErrNotFound, "no pool "+core.QuoteID(name))
	}
	return p.describe(), nil
}

// DeletePool removes tenant t's pool name and ends its ready sandboxes;
// it answers when they are gone. What is being made for it is ended as
// it comes.
func (s *Service) DeletePool(ctx context.Context, t *tenant.Principal, name string) error {
	s.Mu.Lock()
	p := s.pools.by[t.ID][name]
	if p == nil {
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
	delete(s.pools.by[t.ID], name)
	p.gone = true
	ending := p.idle
	p.idle = nil
	s.Mu.Unlock()
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
	// In flight from here to its answer: the kill switch ends it too.
	pc := pendingCreates([]string{b.Rec.ID}, t.ID, &b.Spec, func(error) {})[0]
	s.pending[pc.id] = pc
	return b, pc, "", nil
}

// give makes pooled sandbox b (taken, pc) the caller's: thawed, given
// the create's env (spec sp) and birth, recorded and live. final says an
// error is the create's answer (the kill switch ended it); otherwise the
// sandbox is ended and the create may be made afresh.
func (s *Service) give(ctx context.Context, t *tenant.Principal, pc *pendingCreate, b *core.Box, sp *spec.Spec, bo birth) (*api.Sandbox, bool, error) {
	t0 := time.Now()
	fail := func(err error) (*api.Sandbox, bool, error) {
		s.end(b, "its pool's sandbox could not be given to a create: "+err.Error())
		return nil, false, err
	}
	b.Mu.Lock()
	if b.Ending {
		b.Mu.Unlock()
		return nil, false, errdefs.New(errdefs.ErrFailedPrecondition, "it ended")
	}
	if err := b.Inst.Resume(); err != nil {
		b.Mu.Unlock()
		return fail(fmt.Errorf("thaw: %w", err))
	}
	now := s.Cfg.Now()
	b.Spec.Env, b.Spec.Timeout = sp.Env, sp.Timeout
	specJSON, _ := json.Marshal(b.Spec)
	meta, _ := json.Marshal(bo.metadata)
	trig, _ := json.Marshal(bo.trigger)
	b.Rec.State, b.Rec.Spec, b.Rec.Metadata, b.Rec.Trigger = api.StateRunning, string(specJSON), string(meta), string(trig)
	b.Rec.Created, b.Rec.Expires, b.Rec.IdleTimeout, b.Rec.LastActive = now, bo.expires, bo.idle, now
	rec, bsp := b.Rec, b.Spec
	b.Mu.Unlock()
	if err := s.Cfg.Audit.Commit(ctx, b.Who(), record.SandboxCreated{
		Spec: record.Spec(bsp), Image: bsp.Image, ImageDigest: b.Inst.ImageDigest(), PolicySHA256: record.PolicyHash(bsp.Net.Allow, bsp.Net.Deny),
		Metadata: bo.metadata, Trigger: bo.trigger, Expires: &rec.Expires, IdleTimeout: bo.idle.String(),
		Controls: record.ControlsOf(b.Inst.Wall(), b.Inst.WallVersion(), b.Inst.Degraded()), InitPID: b.Inst.InitPid(), Pool: bsp.Pool,
	}); err != nil {
		return fail(err)
	}
	if err := s.Cfg.Store.PutSandbox(context.WithoutCancel(ctx), rec); err != nil {
		return fail(fmt.Errorf("record sandbox: %w", err))
	}
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
	s.Cfg.Metrics.Creates.Inc()
	s.Cfg.Metrics.CreateSeconds.Observe(time.Since(t0).Seconds())
	s.Cfg.Log.Info("sandbox created", "id", rec.ID, "tenant", t.ID, "pool", bsp.Pool, "took", time.Since(t0))
	out := b.Describe(true)
	return out, true, nil
}

// refill keeps the pools full until ctx ends: woken by a change (a take,
// a new pool) or once a second, it starts what the pools lack, at most
// poolFills at once, oldest need first; a pool whose refills fail waits
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
// as filling (a pool may be picked more than once).
func (s *Service) needs(k int) []*pool {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	now := s.Cfg.Now()
	var out []*pool
	for len(out) < k {
		var best *pool
		for _, byName := range s.pools.by {
			for _, p := range byName {
				if len(p.idle)+p.filling >= p.size || now.Before(p.retry) {
					continue
				}
				if best == nil || len(p.idle)+p.filling < len(best.idle)+best.filling {
					best = p
				}
			}
		}
		if best == nil {
			break
		}
		best.filling++
		out = append(out, best)
	}
	return out
}

// fill makes one sandbox for pool p (counted as filling) through launch,
// as its tenant now is.
func (s *Service) fill(ctx context.Context, p *pool) {
	err := s.fillOne(ctx, p)
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
