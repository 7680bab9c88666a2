// Package sandbox is the long-lived sandboxes' lifecycle: the registry of
// live sandboxes per tenant, their state machine (running ⇄ paused →
// ended), quotas and CPU budgets, TTL and idle expiry, the kill switch,
// re-adoption after a daemon restart, creates made once per external id
// (external.go), and the audit records a caller may
// read. Its Service is built of parts whose calls are its own: the state
// they share, the agent client and the scan of every call
// (internal/sandbox/core), commands (internal/sandbox/execs), files
// (internal/sandbox/files), snapshots and MCP specs
// (internal/sandbox/snapshots), and connections to its ports
// (internal/sandbox/ports). It talks to the host through the Backend
// interface (internal/lifecycle) and keeps its records in internal/store;
// the HTTP adapter (internal/httpapi) sits on top. Who calls is a
// tenant.Principal (internal/tenant, which signs callers in and, through
// the Service's tenant hooks, ends a deleted tenant's sandboxes); secrets
// are internal/secret's.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/sandbox/execs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/files"
	"github.com/airlock-sandbox/airlock/internal/sandbox/ports"
	"github.com/airlock-sandbox/airlock/internal/sandbox/snapshots"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// NewBackend is the service's backend: the lifecycle.
func NewBackend(l *lifecycle.Lifecycle) Backend { return lifecycleBackend{l} }

type lifecycleBackend struct{ *lifecycle.Lifecycle }

func (b lifecycleBackend) Create(ctx context.Context, id string, s *spec.Spec, onEgress func(eventlog.Event)) (Host, error) {
	sb, err := b.Lifecycle.Create(ctx, id, s, lifecycle.Options{OnEgress: onEgress})
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (b lifecycleBackend) Adopt(ctx context.Context, id string, s *spec.Spec, pid int, onEgress func(eventlog.Event)) (Host, error) {
	sb, err := b.Lifecycle.Adopt(ctx, id, s, pid, onEgress)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// Ended records are listed this long.
const keepEnded = 24 * time.Hour

// Service holds every live sandbox of every tenant (its Core) and
// answers every call on them: the registry and lifecycle here, commands,
// files, and snapshots and MCP specs from the parts it is built of (their
// methods are the Service's). Tenants are keyed by their id
// (tenant.Principal.ID), never by their name.
type Service struct {
	*core.Core
	*execs.Commands
	*files.Files
	*snapshots.Keeper
	*ports.Ports
	pending map[string]*pendingCreate // creates in flight, by sandbox id (under Mu)
	forking map[string]int            // forks in flight, by the content of their files (under Mu)
	cpu     map[string]*cpuBudget     // by tenant id (under Mu)
	pools   poolSet                   // the tenants' pools (under Mu)
	node    *nodeHub                  // the node's watchers (node.go)
	// settling counts the pooled sandboxes given to creates whose
	// thaw, durable record and stored row are still to come (give).
	settling sync.WaitGroup
	// auditIndex finds a tenant's records in the log (nil: no log).
	auditIndex *audit.Index

	// external is the creates in flight that name an external id, by
	// tenant and id; each channel closes when its create has answered
	// (under Mu).
	external map[externalKey]chan struct{}
}

// pendingCreate is a create in flight: admitted against its tenant's
// quotas, not yet among the live sandboxes. The kill switch ends it too.
type pendingCreate struct {
	id, tenant string // the sandbox's id, its tenant's id
	mem        int64
	cpus       float64
	cancel     context.CancelCauseFunc
	killed     string        // why the kill switch ended it (under Core.Mu)
	done       chan struct{} // closed once the create has answered
}

// New makes the service. Call Recover before serving, then Run.
func New(cfg Config) *Service {
	c := core.New(cfg)
	s := &Service{Core: c, Commands: execs.New(c), Files: files.New(c), Keeper: snapshots.New(c), Ports: ports.New(c), pending: map[string]*pendingCreate{}, pools: newPoolSet(), forking: map[string]int{}, cpu: map[string]*cpuBudget{}}
	s.external = map[externalKey]chan struct{}{}
	if c.Cfg.AuditDir != "" {
		s.auditIndex = audit.NewIndex(c.Cfg.AuditDir)
	}
	s.node = newNodeHub()
	return s
}

// Create makes a sandbox for tenant t: it takes one of t's pooled
// sandboxes when the request names a pool or matches one (pools.go),
// and makes one otherwise. A create naming an external id one of t's
// sandboxes has answers that sandbox and makes nothing (CreateOnce).
func (s *Service) Create(ctx context.Context, t *tenant.Principal, req *api.CreateSandbox) (*api.Sandbox, error) {
	sb, _, err := s.CreateOnce(ctx, t, req)
	return sb, err
}

// CreateOnce is Create; existed says the request named an external id
// that one of t's sandboxes (live, or ended and still on record) has,
// and the answer is that sandbox: nothing was made. Creates naming the
// same external id at once make one sandbox: the others wait for it
// (external.go).
func (s *Service) CreateOnce(ctx context.Context, t *tenant.Principal, req *api.CreateSandbox) (sb *api.Sandbox, existed bool, err error) {
	if err := checkCreate(req); err != nil {
		return nil, false, err
	}
	if req.ExternalID != "" && !t.Admin {
		found, release, err := s.claimExternal(ctx, t, req.ExternalID)
		if err != nil || found != nil {
			return found, found != nil, err
		}
		defer release()
	}
	sb, err = s.create(ctx, t, req)
	return sb, false, err
}

// create is Create, the external id claimed (if any).
func (s *Service) create(ctx context.Context, t *tenant.Principal, req *api.CreateSandbox) (*api.Sandbox, error) {
	req, err := s.withPoolDefaults(t, req)
	if err != nil {
		return nil, err
	}
	sp, ttl, idle, err := s.specOf(ctx, t, req)
	if err != nil {
		return nil, err
	}
	env := make([]core.Field, 0, len(sp.Env))
	for i, kv := range sp.Env {
		k, _, _ := strings.Cut(kv, "=")
		env = append(env, core.Field{Where: "env " + k, Val: &sp.Env[i]})
	}
	if err := s.ScanCall(ctx, t, record.Who{Tenant: t.ID}, "create", env); err != nil {
		return nil, err
	}
	if err := s.Auditable(); err != nil {
		return nil, err
	}
	if err := s.FromSnapshot(ctx, t, &sp); err != nil {
		return nil, err
	}
	now := s.Cfg.Now()
	bo := birth{expires: now.Add(ttl), idle: idle, metadata: req.Metadata, trigger: req.Trigger, externalID: req.ExternalID}
	pb, pc, miss, err := s.takePooled(ctx, t, req.Pool, &sp)
	if err != nil {
		return nil, err
	}
	if pb != nil {
		out, final, err := s.give(ctx, t, pc, pb, &sp, bo)
		s.settle(pc) // answered, or ended: no longer counted for the quota
		if err == nil || final {
			return out, err
		}
		miss = "its pooled sandbox could not be given: " + err.Error()
		if req.PoolOnly {
			miss = "pool " + core.QuoteID(req.Pool) + ": " + miss
		}
	}
	if req.PoolOnly {
		// Nothing made: the caller asked for a pooled sandbox or none.
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, miss)
	}
	id := core.NewID()
	ctx, pcs, err := s.admit(ctx, t, []string{id}, &sp)
	if err != nil {
		s.Cfg.Metrics.CreatesRefused.Inc()
		return nil, err
	}
	defer s.settle(pcs[0])
	bo.poolMiss = miss
	b, err := s.launch(ctx, t, pcs[0], &sp, bo)
	if err != nil {
		return nil, err
	}
	out := b.Describe(true)
	out.PoolMiss = miss
	return out, nil
}

// specOf is tenant t's validated spec of request req, held to t's wall
// and host paths, with t's scan policy; its TTL and idle timeout.
func (s *Service) specOf(ctx context.Context, t *tenant.Principal, req *api.CreateSandbox) (spec.Spec, time.Duration, time.Duration, error) {
	if t.Admin {
		return spec.Spec{}, 0, 0, errdefs.New(errdefs.ErrPermissionDenied, "the admin key manages tenants; create sandboxes with a tenant's key")
	}
	sp, ttl, idle, err := core.SpecOf(req)
	if err != nil {
		return sp, 0, 0, err
	}
	if req.Isolation == "" && s.Cfg.DefaultIsolation != "" {
		sp.Isolation = s.Cfg.DefaultIsolation
	}
	if err := spec.HeldTo(sp.Wall(), t.Isolation); err != nil {
		if aerr := s.Cfg.Audit.Commit(ctx, record.Who{Tenant: t.ID}, record.SandboxRefused{Isolation: sp.Wall(), Required: t.Isolation, Reason: err.Error()}); aerr != nil {
			return sp, 0, 0, aerr
		}
		return sp, 0, 0, err
	}
	if len(sp.Grants) > 0 && s.Cfg.Broker == nil {
		return sp, 0, 0, errdefs.Unavailable("this daemon has no credential broker: grants cannot be kept")
	}
	sp.Tenant = t.ID
	if err := s.Confine(t, &sp); err != nil {
		return sp, 0, 0, err
	}
	if s.Cfg.Broker != nil {
		sp.Scan = t.ScanPolicy
		if sp.Scan == "" {
			sp.Scan = tenant.DefaultScanPolicy
		}
	}
	return sp, ttl, idle, nil
}

// birth is what a new sandbox's record says beside its spec: when it
// expires, its idle timeout, and its creator's metadata and trigger; or,
// for a sandbox made ahead, its pool. poolMiss says why a create that
// named or matched a pool was not given one of its sandboxes.
type birth struct {
	expires  time.Time
	idle     time.Duration
	metadata map[string]string
	trigger  api.Trigger
	pool     *pool
	poolMiss string

	externalID string // the create's external id ("": none)
}

// launch makes the sandbox of create pc (admitted) from sp, records and
// audits it, and makes it live; it answers the live sandbox, or an error
// and nothing left of it.
func (s *Service) launch(ctx context.Context, t *tenant.Principal, pc *pendingCreate, sp *spec.Spec, bo birth) (*core.Box, error) {
	id := pc.id
	t0 := time.Now()
	inst, err := s.Cfg.Backend.Create(ctx, id, sp, s.EgressSink(id))
	if err != nil {
		if kerr := s.killedCreate(pc, nil); kerr != nil {
			return nil, kerr
		}
		s.Cfg.Metrics.CreateFailures.Inc()
		return nil, err
	}
	if kerr := s.killedCreate(pc, inst); kerr != nil {
		return nil, kerr
	}
	ag := core.NewAgent(inst.Socket())
	err = ag.Hello(ctx)
	if err == nil && bo.pool != nil {
		// Made ahead: frozen until a create takes it.
		if err = inst.Pause(); err != nil {
			err = fmt.Errorf("freeze: %w", err)
		}
	}
	if err != nil {
		discard(inst)
		if kerr := s.killedCreate(pc, nil); kerr != nil {
			return nil, kerr
		}
		return nil, err
	}
	now := s.Cfg.Now()
	specJSON, _ := json.Marshal(sp)
	meta, _ := json.Marshal(bo.metadata)
	trig, _ := json.Marshal(bo.trigger)
	state := api.StateRunning
	controls := record.ControlsOf(inst.Wall(), inst.WallVersion(), inst.Degraded())
	var rd record.Data = record.SandboxCreated{
		Spec: record.Spec(*sp), Image: sp.Image, ImageDigest: inst.ImageDigest(), PolicySHA256: record.PolicyHash(sp.Net.Allow, sp.Net.Deny),
		Metadata: bo.metadata, Trigger: bo.trigger, Expires: &bo.expires, IdleTimeout: bo.idle.String(),
		Controls: controls, InitPID: inst.InitPid(), PoolMiss: bo.poolMiss, ExternalID: bo.externalID,
	}
	if bo.pool != nil {
		state = statePooled
		rd = record.SandboxPooled{Pool: bo.pool.name, Spec: record.Spec(*sp), ImageDigest: inst.ImageDigest(), Controls: controls, InitPID: inst.InitPid()}
	}
	b := &core.Box{Spec: *sp, Inst: inst, Agent: ag, Ended: make(chan struct{}), EgressRate: core.NewLimiter(core.MaxEgressRecords), Rec: store.Sandbox{
		ID: id, Tenant: t.ID, TenantName: t.Tenant, State: state, Spec: string(specJSON), Metadata: string(meta), Trigger: string(trig),
		Created: now, Expires: bo.expires, IdleTimeout: bo.idle, LastActive: now, InitPid: inst.InitPid(), ExternalID: bo.externalID,
	}}
	// The audit record first, then the daemon's own: a crash in between
	// leaves a sandbox without a record, which the next daemon ends (and
	// records); never one that runs unaudited.
	if err := s.Cfg.Audit.Commit(ctx, b.Who(), rd); err != nil {
		discard(inst)
		return nil, err
	}
	if err := s.Cfg.Store.PutSandbox(context.WithoutCancel(ctx), b.Rec); err != nil {
		discard(inst)
		s.Cfg.Audit.Note(b.Who(), record.SandboxDestroyed{Reason: "the daemon could not record it: " + err.Error()})
		return nil, fmt.Errorf("record sandbox: %w", err)
	}
	// Live from here, unless the kill switch came first: then it ends as
	// any live sandbox would (destroyed, its end recorded).
	// A pooled one joins its pool, unless the pool went meanwhile.
	s.Mu.Lock()
	reason := pc.killed
	switch {
	case reason != "":
	case bo.pool == nil:
		s.Boxes[id] = b
	case bo.pool.gone:
		reason = "its pool " + core.QuoteID(bo.pool.name) + " was removed or redefined"
	case len(bo.pool.idle) >= bo.pool.size:
		reason = "its pool " + core.QuoteID(bo.pool.name) + " is full (its size was lowered)"
	default:
		bo.pool.idle = append(bo.pool.idle, b)
	}
	s.Mu.Unlock()
	s.node.changed()
	if reason != "" {
		s.end(b, reason)
		return nil, killedError(id, reason)
	}
	if bo.pool == nil {
		s.publishSandbox(api.NodeEventSandboxCreated, b.Describe(false))
	}
	go s.watch(b)
	if bo.pool != nil {
		s.Cfg.Metrics.PoolReady.Inc()
		s.Cfg.Metrics.PoolFillSecs.Observe(time.Since(t0).Seconds())
		s.Cfg.Log.Debug("pooled sandbox made", "id", id, "tenant", t.ID, "pool", bo.pool.name, "took", time.Since(t0))
		return b, nil
	}
	s.Cfg.Metrics.Creates.Inc()
	s.Cfg.Metrics.CreateSeconds.Observe(time.Since(t0).Seconds())
	s.Cfg.Log.Info("sandbox created", "id", id, "tenant", t.ID, "image", sp.Image, "took", time.Since(t0))
	return b, nil
}

// admit checks tenant t's quotas for len(ids) more sandboxes like sp, all
// or none, and counts them as pending under ids; the context it returns
// ends when the kill switch ends any of the creates. A deleted tenant is
// admitted no more.
func (s *Service) admit(ctx context.Context, t *tenant.Principal, ids []string, sp *spec.Spec) (context.Context, []*pendingCreate, error) {
	q := t.Quotas
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if err := t.Err(); err != nil {
		return nil, nil, err
	}
	if b := s.cpu[t.ID]; b != nil && b.exhausted(q, s.Cfg.Now()) {
		return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s has used its CPU budget (%.0f s per %s); creates resume when the period ends", t.Tenant, q.CPUSeconds, q.CPUPeriod))
	}
	n, mem, cpus := 0, int64(0), 0.0
	for _, b := range s.Boxes {
		if b.Rec.Tenant == t.ID {
			n++
			mem += b.Spec.Limits.Memory
			cpus += b.Spec.Limits.CPUs
		}
	}
	for _, pc := range s.pending {
		if pc.tenant == t.ID {
			n++
			mem += pc.mem
			cpus += pc.cpus
		}
	}
	pn, pmem, pcpus := s.pools.held(t.ID, nil)
	n, mem, cpus = n+pn, mem+pmem, cpus+pcpus
	k := len(ids)
	these := "this one asks"
	if k > 1 {
		these = fmt.Sprintf("these %d ask", k)
	}
	switch {
	case q.MaxSandboxes > 0 && n+k > q.MaxSandboxes:
		if k > 1 {
			return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s may have %d sandboxes at once, has %d and asks %d more", t.Tenant, q.MaxSandboxes, n, k))
		}
		return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s may have %d sandboxes at once and has %d", t.Tenant, q.MaxSandboxes, n))
	case q.MaxMemory > 0 && mem+int64(k)*sp.Limits.Memory > q.MaxMemory:
		return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s may use %s of memory in all; its sandboxes hold %s and %s %s", t.Tenant, spec.FormatSize(q.MaxMemory), spec.FormatSize(mem), these, spec.FormatSize(int64(k)*sp.Limits.Memory)))
	case q.MaxCPUs > 0 && cpus+float64(k)*sp.Limits.CPUs > q.MaxCPUs+1e-9:
		return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s may use %g CPUs in all; its sandboxes hold %g and %s %g", t.Tenant, q.MaxCPUs, cpus, these, float64(k)*sp.Limits.CPUs))
	}
	if err := s.nodeRoom(k, sp); err != nil {
		return nil, nil, err
	}
	// One context for them all: the kill switch ending one ends the lot.
	ctx, cancel := context.WithCancelCause(ctx)
	pcs := pendingCreates(ids, t.ID, sp, cancel)
	for _, pc := range pcs {
		s.pending[pc.id] = pc
	}
	s.node.changed()
	return ctx, pcs, nil
}

// pendingCreates are the creates of sandboxes ids like sp for tenant id
// tid, ended together by cancel.
func pendingCreates(ids []string, tid string, sp *spec.Spec, cancel context.CancelCauseFunc) []*pendingCreate {
	pcs := make([]*pendingCreate, len(ids))
	for i, id := range ids {
		pcs[i] = &pendingCreate{id: id, tenant: tid, mem: sp.Limits.Memory, cpus: sp.Limits.CPUs, cancel: cancel, done: make(chan struct{})}
	}
	return pcs
}

// settle takes an answered create off the pending list.
func (s *Service) settle(pc *pendingCreate) {
	s.Mu.Lock()
	delete(s.pending, pc.id)
	s.Mu.Unlock()
	s.node.changed()
	pc.cancel(nil)
	close(pc.done)
}

// killedCreate says whether the kill switch ended create pc; if so it
// destroys inst (when there is one), records the end, and returns the
// error the create answers.
func (s *Service) killedCreate(pc *pendingCreate, inst Host) error {
	s.Mu.Lock()
	reason := pc.killed
	s.Mu.Unlock()
	if reason == "" {
		return nil
	}
	if inst != nil {
		discard(inst)
	}
	if s.Cfg.Broker != nil {
		s.Cfg.Broker.End(pc.id)
	}
	s.Cfg.Audit.Note(record.Who{Tenant: pc.tenant, Sandbox: pc.id}, record.SandboxDestroyed{Reason: reason, While: "create"})
	s.Cfg.Metrics.Ends.WithLabelValues(endLabel(reason)).Inc()
	return killedError(pc.id, reason)
}

func killedError(id, reason string) error {
	return errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s was destroyed while it was being made: %s", id, reason))
}

// Get describes one sandbox (live, or ended within the last day).
func (s *Service) Get(ctx context.Context, t *tenant.Principal, id string) (*api.Sandbox, error) {
	if b, err := s.Find(t, id); err == nil {
		return b.Describe(true), nil
	}
	// One record, by its id: not every ended one of every tenant.
	r, err := s.Cfg.Store.SandboxByID(ctx, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if err == nil && r.State == api.StateEnded && (t.Admin || r.Tenant == t.ID) {
		return core.DescribeRecord(r, nil), nil
	}
	return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+core.QuoteID(id))
}

// Peek describes live sandbox id of tenant t without reading its usage
// (which costs the host reads of its cgroup): for a front that routes
// each request of a sandbox's own traffic (internal/e2bapi).
func (s *Service) Peek(t *tenant.Principal, id string) (*api.Sandbox, error) {
	b, err := s.Find(t, id)
	if err != nil {
		return nil, err
	}
	return b.Describe(false), nil
}

// List describes tenant t's live sandboxes (every tenant's for the admin).
func (s *Service) List(_ context.Context, t *tenant.Principal) []*api.Sandbox {
	s.Mu.Lock()
	var bs []*core.Box
	for _, b := range s.Boxes {
		if t.Admin || b.Rec.Tenant == t.ID {
			bs = append(bs, b)
		}
	}
	s.Mu.Unlock()
	out := make([]*api.Sandbox, 0, len(bs))
	for _, b := range bs {
		out = append(out, b.Describe(false))
	}
	slices.SortFunc(out, func(a, b *api.Sandbox) int { return a.Created.Compare(b.Created) })
	return out
}

// Pause freezes every process of a sandbox; its TTL still runs.
func (s *Service) Pause(ctx context.Context, t *tenant.Principal, id string) (*api.Sandbox, error) {
	return s.setPaused(ctx, t, id, true)
}

// Resume thaws a paused sandbox.
func (s *Service) Resume(ctx context.Context, t *tenant.Principal, id string) (*api.Sandbox, error) {
	return s.setPaused(ctx, t, id, false)
}

func (s *Service) setPaused(ctx context.Context, t *tenant.Principal, id string, pause bool) (*api.Sandbox, error) {
	b, err := s.Find(t, id)
	if err != nil {
		return nil, err
	}
	return s.pauseBox(ctx, t, b, pause, false)
}

// pauseAtTTL pauses b, whose TTL has come (spec OnTTL "pause"), and keeps
// it api.PausedTTL more.
func (s *Service) pauseAtTTL(ctx context.Context, b *core.Box) {
	_, err := s.pauseBox(ctx, nil, b, true, true)
	switch {
	case err == nil, errors.Is(err, errdefs.ErrNotFound): // paused, or ending already
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		// Paused by a call since the tick looked: its TTL ends it.
	default:
		s.end(b, "TTL expired (pausing it failed: "+err.Error()+")")
	}
}

// pauseBox pauses (or resumes) b for t (nil: the service itself); atTTL,
// its expiry moves api.PausedTTL on.
func (s *Service) pauseBox(ctx context.Context, t *tenant.Principal, b *core.Box, pause, atTTL bool) (*api.Sandbox, error) {
	id := b.Rec.ID
	b.Mu.Lock()
	defer func() { b.Mu.Unlock() }()
	var err error
	if b.Ending {
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+core.QuoteID(id)+" (it is ending)")
	}
	if pause == (b.Rec.State == api.StatePaused) {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s is already %s", id, b.Rec.State))
	}
	state := api.StateRunning
	if pause {
		state = api.StatePaused
		// A freeze the kernel did not finish may finish later: it is
		// undone, so that the sandbox runs, as it stays recorded.
		if err = b.Inst.Pause(); err != nil {
			if rerr := b.Inst.Resume(); rerr != nil {
				s.Cfg.Log.Error("thaw after a failed freeze", "id", id, "err", rerr)
			}
		}
	} else {
		err = b.Inst.Resume()
	}
	if err != nil {
		return nil, err
	}
	b.Rec.State = state
	b.Rec.LastActive = s.Cfg.Now()
	if atTTL {
		b.Rec.Expires = s.Cfg.Now().Add(api.PausedTTL)
	}
	rec := b.Rec
	b.Mu.Unlock()
	err = s.Cfg.Store.PutSandbox(ctx, rec)
	if err == nil {
		var d record.Data = record.SandboxResumed{}
		if pause {
			d = record.SandboxPaused{}
		}
		if atTTL {
			d = record.SandboxPaused{AtTTL: true, Expires: &rec.Expires}
		}
		err = s.Cfg.Audit.Commit(ctx, b.WhoFor(t), d)
	}
	b.Mu.Lock()
	if err != nil {
		return nil, err
	}
	return core.DescribeRecord(rec, nil), nil
}

// Extend moves a sandbox's expiry to ttl from now.
func (s *Service) Extend(ctx context.Context, t *tenant.Principal, id string, req *api.Extend) (*api.Sandbox, error) {
	ttl, err := core.ParseDuration("ttl", req.TTL, 0, core.MaxTTL)
	if err != nil {
		return nil, err
	}
	if ttl <= 0 {
		return nil, errdefs.Invalid("ttl must be positive")
	}
	b, err := s.Find(t, id)
	if err != nil {
		return nil, err
	}
	b.Mu.Lock()
	if b.Ending {
		b.Mu.Unlock()
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+core.QuoteID(id)+" (it is ending)")
	}
	b.Rec.Expires = s.Cfg.Now().Add(ttl)
	b.Rec.LastActive = s.Cfg.Now()
	rec := b.Rec
	b.Mu.Unlock()
	if err := s.Cfg.Store.PutSandbox(ctx, rec); err != nil {
		return nil, err
	}
	if err := s.Cfg.Audit.Commit(ctx, b.WhoFor(t), record.SandboxExtended{Expires: rec.Expires}); err != nil {
		return nil, err
	}
	return core.DescribeRecord(rec, nil), nil
}

// Destroy ends a sandbox and answers when it is gone.
func (s *Service) Destroy(_ context.Context, t *tenant.Principal, id string) error {
	b, err := s.Find(t, id)
	if err != nil {
		return err
	}
	s.endBy(t, b, "destroyed by request")
	return nil
}

// KillAll destroys every sandbox of tenant (a name; every tenant's when
// tenant is "" and t is the admin), those being made included, and
// answers when they are all gone.
func (s *Service) KillAll(ctx context.Context, t *tenant.Principal, tenant string) ([]string, error) {
	switch {
	case !t.Admin && tenant != "" && tenant != t.Tenant:
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+core.QuoteID(tenant))
	case !t.Admin:
		return s.killAll(t, t.ID, "kill switch (tenant "+t.Tenant+")")
	case tenant == "":
		return s.killAll(t, "", "kill switch (all tenants)")
	}
	tn, err := s.Cfg.Store.TenantByName(ctx, tenant)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+core.QuoteID(tenant))
	}
	if err != nil {
		return nil, err
	}
	return s.killAll(t, tn.ID, "kill switch (tenant "+tenant+")")
}

// killAll destroys every sandbox of tenant id tid ("": of every tenant)
// for reason: the live ones, and the creates in flight, which end
// destroyed and answer an error. It returns when all of them are gone.
func (s *Service) killAll(t *tenant.Principal, tid, reason string) ([]string, error) {
	s.Mu.Lock()
	var bs []*core.Box
	for _, b := range s.Boxes {
		if tid == "" || b.Rec.Tenant == tid {
			bs = append(bs, b)
		}
	}
	// The kill switch removes the pools too: nothing refills them, now or
	// after a restart. Records it could not remove fail the kill switch
	// (once everything it found is ended): a restart would set those pools
	// again.
	poolsErr := s.Cfg.Store.DeletePools(context.Background(), tid, "")
	for _, p := range s.pools.remove(tid) {
		bs = append(bs, p.idle...)
		s.Cfg.Metrics.PoolReady.Sub(float64(len(p.idle)))
		p.idle = nil
	}
	s.pools.sized(s.Cfg.Metrics)
	s.node.changed()
	var pcs []*pendingCreate
	for _, pc := range s.pending {
		if (tid == "" || pc.tenant == tid) && pc.killed == "" {
			pc.killed = reason
			pc.cancel(errdefs.New(errdefs.ErrFailedPrecondition, reason))
			pcs = append(pcs, pc)
		}
	}
	s.Mu.Unlock()
	if len(pcs) > 0 {
		s.Cfg.Log.Warn("kill switch: ending creates in flight", "tenant", tid, "creates", len(pcs))
	}
	// Every sandbox is killed before any is torn down: the kernel ends
	// them all at once, and none waits behind another's teardown. Each is
	// claimed first, so that its watcher, seeing it die, does not end it
	// for another reason. What one left behind, or its end not recorded,
	// fails the kill switch (once everything is ended).
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	ids := make([]string, 0, len(bs)+len(pcs))
	for _, b := range bs {
		ids = append(ids, b.Rec.ID)
		wg.Add(1)
		if !claim(b) {
			go func() { defer wg.Done(); <-b.Ended }()
			continue
		}
		b.Inst.Kill()
		go func() {
			defer wg.Done()
			// A pooled sandbox just given to a create is torn down once
			// it is settled, as endBy does: its stored row and created
			// record come before its end.
			_ = b.Settled()
			if err := s.finish(nil, b, reason); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("kill switch: sandbox %s: %w", b.Rec.ID, err))
				mu.Unlock()
			}
		}()
	}
	for _, pc := range pcs {
		ids = append(ids, pc.id)
		wg.Add(1)
		go func() { defer wg.Done(); <-pc.done }()
	}
	wg.Wait()
	slices.Sort(ids)
	s.Cfg.Log.Warn("kill switch", "tenant", tid, "destroyed", len(ids), "in_flight", len(pcs))
	err := s.Cfg.Audit.Commit(context.Background(), record.Who{Tenant: tid}, record.KillSwitch{Admin: t.Admin, Destroyed: ids})
	err = errors.Join(append([]error{err}, errs...)...)
	if poolsErr != nil {
		err = errors.Join(err, fmt.Errorf("kill switch: the pools' records were not removed (a restart would set them again): %w", poolsErr))
	}
	return ids, err
}

// end destroys b (once) and records why; every caller returns only when
// it is gone.
func (s *Service) end(b *core.Box, reason string) { s.endBy(nil, b, reason) }

// endBy is end, at t's request (nil: the daemon's own decision), for the
// record.
func (s *Service) endBy(t *tenant.Principal, b *core.Box, reason string) {
	// A pooled sandbox just given to a create is ended once it is
	// settled: its end follows its thaw and its stored row.
	_ = b.Settled()
	if !claim(b) {
		<-b.Ended
		return
	}
	_ = s.finish(t, b, reason) // logged
}

// claim marks b as ending; false when someone else already ends it.
func claim(b *core.Box) bool {
	b.Mu.Lock()
	defer b.Mu.Unlock()
	if b.Ending {
		return false
	}
	b.Ending = true
	return true
}

// finish ends b, claimed by the caller: destroys it, records why and what
// it used, and closes b.Ended. It answers (and logs) what the host could
// not remove of it and what of its end could not be recorded.
func (s *Service) finish(t *tenant.Principal, b *core.Box, reason string) error {
	b.Agent.Close()
	usage := b.Inst.Usage()
	s.chargeCPU(b, usage.CPU)
	// Killed first (a kill switch must not wait for a diff), then what
	// changed is read from the dead sandbox's workspace.
	var errs []error
	if err := b.Inst.Destroy(); err != nil {
		s.Cfg.Log.Error("destroy", "id", b.Rec.ID, "err", err)
		errs = append(errs, fmt.Errorf("destroy: %w", err))
	}
	changes := record.ReadWorkspace(b.Inst, b.Rec.ID, s.Cfg.PatchDir)
	b.Inst.Release()
	if b.Spec.Fork != "" {
		defer s.forkFilesDone(b.Spec.Fork) // once it is no longer live
	}
	if s.Cfg.Broker != nil {
		s.Cfg.Broker.End(b.Rec.ID) // every token it held is refused from now on
	}
	s.Mu.Lock()
	_, given := s.Boxes[b.Rec.ID] // a caller's: its end is told to the node's watchers
	delete(s.Boxes, b.Rec.ID)
	if s.pools.drop(b) {
		s.Cfg.Metrics.PoolReady.Dec()
	}
	s.Mu.Unlock()
	s.node.changed()
	b.Mu.Lock()
	b.Rec.State, b.Rec.Ended, b.Rec.EndReason = api.StateEnded, s.Cfg.Now(), reason
	rec := b.Rec
	b.Mu.Unlock()
	if err := s.Cfg.Store.PutSandbox(context.Background(), rec); err != nil {
		s.Cfg.Log.Error("record sandbox end", "id", rec.ID, "err", err)
		errs = append(errs, fmt.Errorf("record its end: %w", err))
	}
	if err := s.Cfg.Audit.Commit(context.Background(), b.WhoFor(t), record.SandboxDestroyed{
		Reason: reason, Limits: limitsHit(usage), CPUSeconds: usage.CPU.Seconds(), MemoryPeakBytes: usage.MemoryPeak,
		OOMKills: usage.OOMKills, PidsLimited: usage.PidsLimited, Workspace: changes,
	}); err != nil {
		s.Cfg.Log.Error("audit", "kind", "sandbox.destroyed", "id", rec.ID, "err", err)
		errs = append(errs, fmt.Errorf("audit its end: %w", err))
	}
	s.Cfg.Metrics.Ends.WithLabelValues(endLabel(reason)).Inc()
	s.Cfg.Log.Info("sandbox ended", "id", rec.ID, "tenant", rec.Tenant, "reason", reason)
	if given {
		s.publishSandbox(api.NodeEventSandboxEnded, core.DescribeRecord(rec, nil))
	}
	close(b.Ended)
	return errors.Join(errs...)
}

// limitsHit names the limits a sandbox's usage says it reached, as a
// run's record names them.
func limitsHit(u lifecycle.Usage) []string {
	out := []string{}
	if u.OOMKills > 0 {
		out = append(out, "memory")
	}
	if u.PidsLimited > 0 {
		out = append(out, "pids")
	}
	return out
}

// watch ends a sandbox whose init died on its own (a limit, a crash).
func (s *Service) watch(b *core.Box) {
	select {
	case <-b.Inst.Done():
	case <-b.Ended:
		return
	}
	b.Mu.Lock()
	ending := b.Ending
	b.Mu.Unlock()
	if ending {
		return // killed by whoever ends it, who records why
	}
	// A command that meets its limits is stopped and the sandbox lives on;
	// init itself can still die of the sandbox's (its own memory past the
	// reserve), so the reason names the limits that had been met.
	reason := "the sandbox's init exited (its agent stopped)"
	u := b.Inst.Usage()
	if u.OOMKills > 0 {
		reason += fmt.Sprintf("; its memory limit (%s) had been reached (%d OOM kills)", spec.FormatSize(b.Spec.Limits.Memory), u.OOMKills)
	}
	if u.PidsLimited > 0 {
		reason += fmt.Sprintf("; its pids limit (%d) had been reached", b.Spec.Limits.Pids)
	}
	s.end(b, reason)
}

// Recover adopts the sandboxes an earlier daemon left running and records
// the ones it cannot (their remains are destroyed).
func (s *Service) Recover(ctx context.Context) error {
	ts, err := s.Cfg.Store.Tenants(ctx)
	if err != nil {
		return err
	}
	s.loadBudgets(ts)
	recs, err := s.Cfg.Store.Sandboxes(ctx, api.StateRunning, api.StatePaused)
	if err != nil {
		return err
	}
	// Pooled sandboxes are not kept: the pools are made afresh.
	pooled, err := s.Cfg.Store.Sandboxes(ctx, statePooled)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, r := range recs {
		wg.Go(func() { s.adopt(ctx, r) })
	}
	for _, r := range pooled {
		wg.Go(func() { s.lost(ctx, r, "a pooled sandbox is not kept across a daemon restart", "pool") })
	}
	wg.Wait()
	// A daemon killed between making a sandbox and recording it left one
	// nobody knows: end it.
	known := map[string]bool{}
	for _, r := range slices.Concat(recs, pooled) {
		known[r.ID] = true
	}
	for _, id := range s.Cfg.Backend.LongLived() {
		if known[id] {
			continue
		}
		err := s.Cfg.Backend.Discard(id)
		if s.Cfg.Broker != nil {
			s.Cfg.Broker.End(id)
		}
		s.Cfg.Log.Warn("discarded a sandbox without a record", "id", id, "err", err)
		s.Cfg.Audit.Note(record.Who{Sandbox: id}, record.SandboxDestroyed{Reason: "found without a record after a daemon restart"})
	}
	if err := s.restorePools(ctx); err != nil {
		return err
	}
	if s.Cfg.Broker != nil {
		s.Mu.Lock()
		live := slices.Collect(maps.Keys(s.Boxes))
		s.Mu.Unlock()
		s.Cfg.Broker.Sweep(live)
	}
	return s.Cfg.Store.PruneEnded(ctx, s.Cfg.Now().Add(-keepEnded))
}

// lost ends what is left of recorded sandbox r, which a restarted
// daemon does not adopt, and records why (metric label label).
func (s *Service) lost(ctx context.Context, r store.Sandbox, reason, label string) {
	if derr := s.Cfg.Backend.Discard(r.ID); derr != nil {
		s.Cfg.Log.Error("discard an unadopted sandbox", "id", r.ID, "err", derr)
	}
	if s.Cfg.Broker != nil {
		s.Cfg.Broker.End(r.ID)
	}
	r.State, r.Ended, r.EndReason = api.StateEnded, s.Cfg.Now(), reason
	if perr := s.Cfg.Store.PutSandbox(ctx, r); perr != nil {
		s.Cfg.Log.Error("record sandbox end", "id", r.ID, "err", perr)
	}
	s.Cfg.Log.Warn("sandbox not adopted", "id", r.ID, "reason", reason)
	s.Cfg.Audit.Note(record.Who{Tenant: r.Tenant, Sandbox: r.ID}, record.SandboxDestroyed{Reason: r.EndReason})
	s.Cfg.Metrics.Ends.WithLabelValues(label).Inc()
}

func (s *Service) adopt(ctx context.Context, r store.Sandbox) {
	fail := func(err error) { s.lost(ctx, r, "not adopted after a daemon restart: "+err.Error(), "lost") }
	var sp spec.Spec
	if err := json.Unmarshal([]byte(r.Spec), &sp); err != nil {
		fail(fmt.Errorf("its record is unreadable: %v", err))
		return
	}
	inst, err := s.Cfg.Backend.Adopt(ctx, r.ID, &sp, r.InitPid, s.EgressSink(r.ID))
	if err != nil {
		fail(err)
		return
	}
	ag := core.NewAgent(inst.Socket())
	if err := helloAdopted(ctx, r.State, inst, ag); err != nil {
		discard(inst)
		fail(err)
		return
	}
	r.LastActive = s.Cfg.Now() // idle time restarts with the daemon
	b := &core.Box{Rec: r, Spec: sp, Inst: inst, Agent: ag, Ended: make(chan struct{}), CPUSeen: inst.Usage().CPU, EgressRate: core.NewLimiter(core.MaxEgressRecords)}
	s.Mu.Lock()
	s.Boxes[r.ID] = b
	s.Mu.Unlock()
	go s.watch(b)
	s.Cfg.Metrics.Adopted.Inc()
	s.Cfg.Audit.Note(b.Who(), record.SandboxAdopted{InitPID: inst.InitPid()})
	s.Cfg.Log.Info("sandbox adopted", "id", r.ID, "tenant", r.Tenant)
}

// helloAdopted checks the agent of an adopted sandbox. A paused one's
// agent is frozen with it and would never answer: it is thawed for the
// check and frozen again.
func helloAdopted(ctx context.Context, state string, inst Host, ag *core.Agent) error {
	if state != api.StatePaused {
		return ag.Hello(ctx)
	}
	if err := inst.Resume(); err != nil {
		return err
	}
	if err := ag.Hello(ctx); err != nil {
		return err
	}
	return inst.Pause()
}

// Run expires sandboxes (TTL, idle), enforces CPU budgets and refills the
// agents' rate limits, once a second, and keeps the pools full (refill),
// until ctx ends.
func (s *Service) Run(ctx context.Context) {
	defer s.settling.Wait() // the doors are shut: what they started ends before the log closes
	refilled := make(chan struct{})
	go func() { s.refill(ctx); close(refilled) }()
	defer func() { <-refilled }()
	published := make(chan struct{})
	go func() { s.publishNodeChanges(ctx.Done()); close(published) }()
	defer func() { <-published }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.tick(ctx)
		}
	}
}

func (s *Service) tick(ctx context.Context) {
	now := s.Cfg.Now()
	s.Mu.Lock()
	bs := slices.Collect(maps.Values(s.Boxes))
	s.Mu.Unlock()
	states := map[string]float64{}
	var wg sync.WaitGroup
	for _, b := range bs {
		b.Agent.Rate.Refill()
		s.NoteDropped(b)
		b.Mu.Lock()
		rec := b.Rec
		ending := b.Ending
		pauseAtTTL := b.Spec.OnTTL == "pause" && rec.State == api.StateRunning
		b.Mu.Unlock()
		if ending {
			continue
		}
		states[rec.State]++
		reason := ""
		switch {
		case !now.Before(rec.Expires) && pauseAtTTL:
			wg.Go(func() { s.pauseAtTTL(ctx, b) })
		case !now.Before(rec.Expires):
			reason = "TTL expired"
			s.Cfg.Metrics.LimitKills.WithLabelValues("ttl").Inc()
		case rec.IdleTimeout > 0 && now.Sub(rec.LastActive) >= rec.IdleTimeout:
			reason = fmt.Sprintf("idle for %v", rec.IdleTimeout)
			s.Cfg.Metrics.LimitKills.WithLabelValues("idle").Inc()
		}
		if reason != "" {
			wg.Add(1)
			go func() { defer wg.Done(); s.end(b, reason) }()
		}
	}
	for _, st := range []string{api.StateRunning, api.StatePaused} {
		s.Cfg.Metrics.Sandboxes.WithLabelValues(st).Set(states[st])
	}
	s.enforceCPU(ctx, bs)
	wg.Wait()
}

func endLabel(reason string) string {
	switch {
	case reason == "destroyed by request":
		return "destroyed"
	case reason == "TTL expired":
		return "ttl"
	case len(reason) > 4 && reason[:4] == "idle":
		return "idle"
	case len(reason) > 11 && reason[:11] == "kill switch":
		return "kill_switch"
	case len(reason) > 3 && reason[:3] == "cpu":
		return "cpu_budget"
	}
	return "died"
}

// discard ends an instance the service will not keep.
func discard(inst Host) {
	_ = inst.Destroy()
	inst.Release()
}
