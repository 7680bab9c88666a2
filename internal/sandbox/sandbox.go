// Package sandbox is the long-lived sandboxes' lifecycle: the registry of
// live sandboxes per tenant, their state machine (running ⇄ paused →
// ended), quotas, TTL and idle expiry, the kill switch, re-adoption after a
// daemon restart, and every call on a sandbox's agent. It talks to the host
// through the Backend interface (internal/lifecycle) and keeps its records in
// internal/store; the HTTP adapter (internal/httpapi) sits on top. Who
// calls is a tenant.Principal (internal/tenant, which signs callers in
// and, through the Service's tenant hooks, ends a deleted tenant's
// sandboxes); secrets are internal/secret's.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"github.com/airlock-sandbox/airlock/internal/workspace"
)

// Host is one sandbox as the host keeps it (*lifecycle.Sandbox).
type Host interface {
	Socket() string // the agent's host-side socket
	InitPid() int
	Done() <-chan struct{} // closed when the sandbox's init has exited
	OOM() <-chan struct{}  // closed when the OOM killer fired in it
	Pause() error
	Resume() error
	Usage() lifecycle.Usage
	// Diff streams the diff of /workspace to w; the walk stops where ctx
	// ends.
	Diff(ctx context.Context, w io.Writer) error
	// Changes lists what changed in /workspace and writes the patch (at
	// most maxPatch bytes) to w, within ctx's time.
	Changes(ctx context.Context, w io.Writer, maxPatch int64) (*workspace.Report, error)
	// Degraded lists the controls the sandbox runs without (an explicit
	// opt-out the host needed).
	Degraded() []string
	// ImageDigest is the content digest of its image ("" for the host's).
	ImageDigest() string
	// Archive streams a tar of /workspace/rel to the writer start returns;
	// start is called, with what the archive leaves out, once it is
	// known to fit maxBytes and before the first byte.
	Archive(ctx context.Context, rel string, maxBytes int64, start func(skipped []string) io.Writer) error
	Snapshot(maxBytes int64) (*lifecycle.SnapshotFiles, error)
	// Destroy kills every process and removes what the sandbox held on the
	// host, except what Release gives back: its workspace stays readable
	// (Changes) in between.
	Destroy() error
	Release()
}

// Backend makes and adopts sandboxes on the host (the lifecycle:
// NewBackend).
type Backend interface {
	// Create makes sandbox id; onEgress sees its egress decisions.
	Create(ctx context.Context, id string, s *spec.Spec, onEgress func(eventlog.Event)) (Host, error)
	Adopt(ctx context.Context, id string, s *spec.Spec, pid int, onEgress func(eventlog.Event)) (Host, error)
	// SnapshotPaths says where a snapshot's root ("" when it has none)
	// and workspace are; RemoveSnapshot deletes its files.
	SnapshotPaths(id string) (root, ws string, err error)
	RemoveSnapshot(id string) error
	// Discard ends whatever is left of a sandbox that could not be
	// adopted.
	Discard(id string) error
	// LongLived lists the long-lived sandboxes the host holds, whether
	// recorded or not.
	LongLived() []string
	// CheckHostPaths opens the host paths of s as Create would, and closes
	// them: a spec kept for later (MCP) is refused now, not at its use.
	CheckHostPaths(s *spec.Spec) error
}

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

// Defaults.
const (
	DefaultTTL = time.Hour
	MaxTTL     = 7 * 24 * time.Hour
	keepEnded  = 24 * time.Hour // ended records are listed this long
)

// Config configures the service.
type Config struct {
	Backend Backend
	Store   *store.Store
	Log     *slog.Logger
	Metrics *Metrics
	// Audit records what sandboxes do; nil records nothing (unit tests).
	Audit *record.Recorder
	// AuditDir is the log's directory, for reading it back; PatchDir
	// keeps the workspace patches its records name.
	AuditDir, PatchDir string
	// Broker mints and revokes grants' tokens and scans calls for
	// credentials; nil: no grants or scanning (unit tests).
	Broker *broker.Broker
	// Now is the clock (tests move it).
	Now func() time.Time
	// MaxBackground and MaxBackgroundPerTenant cap the background
	// commands running at once in one sandbox and in all of a tenant's
	// (each holds a stream of the daemon's); 0: the defaults.
	MaxBackground, MaxBackgroundPerTenant int
	// HostPaths lets every caller name any host path: the embedded
	// service of airlock mcp (root on the host, one user). A daemon that
	// serves tenants leaves it unset: they name paths only under their
	// roots (hostpaths.go).
	HostPaths bool
}

// Service holds every live sandbox of every tenant. Tenants are keyed by
// their id (tenant.Principal.ID), never by their name.
type Service struct {
	cfg     Config
	mu      sync.Mutex
	boxes   map[string]*box
	pending map[string]*pendingCreate // creates in flight, by sandbox id
	cpu     map[string]*cpuBudget
	// background counts running background commands per tenant (and
	// box.background per sandbox).
	background map[string]int
	// auditIndex finds a tenant's records in the log (nil: no log).
	auditIndex *audit.Index
}

// pendingCreate is a create in flight: admitted against its tenant's
// quotas, not yet among the live sandboxes. The kill switch ends it too.
type pendingCreate struct {
	id, tenant string // the sandbox's id, its tenant's id
	mem        int64
	cpus       float64
	cancel     context.CancelCauseFunc
	killed     string        // why the kill switch ended it (under Service.mu)
	done       chan struct{} // closed once the create has answered
}

// box is one live sandbox.
type box struct {
	mu     sync.Mutex
	rec    store.Sandbox
	spec   spec.Spec
	inst   Host
	agent  *agentClient
	ending bool
	ended  chan struct{} // closed once it is destroyed and recorded
	// cpuSeen is the CPU time already charged to the tenant's budget.
	cpuSeen time.Duration
	// The egress records it may make this second, and what was dropped.
	egressRate    *limiter
	egressDropped atomic.Int64
	// background is its running background commands (under Service.mu).
	background int
}

// New makes the service. Call Recover before serving, then Run.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.MaxBackground <= 0 {
		cfg.MaxBackground = DefaultMaxBackground
	}
	if cfg.MaxBackgroundPerTenant <= 0 {
		cfg.MaxBackgroundPerTenant = DefaultMaxBackgroundPerTenant
	}
	s := &Service{cfg: cfg, boxes: map[string]*box{}, pending: map[string]*pendingCreate{}, cpu: map[string]*cpuBudget{}, background: map[string]int{}}
	if cfg.AuditDir != "" {
		s.auditIndex = audit.NewIndex(cfg.AuditDir)
	}
	return s
}

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func parseDuration(field, s string, def, max time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || (max > 0 && d > max) {
		return 0, errdefs.Invalid(fmt.Sprintf("%s %q: want a duration such as 30m, at most %v", field, s, max))
	}
	return d, nil
}

// specOf turns a create request into a validated spec.
func specOf(req *api.CreateSandbox) (spec.Spec, time.Duration, time.Duration, error) {
	s := spec.Default()
	if req.Image != "" {
		s.Image = req.Image
	}
	s.WritableRootfs = req.WritableRootfs
	s.Workspace, s.Repo, s.Commit = req.Workspace, req.Repo, req.Commit
	if s.Repo != "" && s.Commit == "" {
		s.Commit = "HEAD"
	}
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		// Checked before joining: a name "A=B" would pass as A.
		if err := spec.CheckEnvName(k); err != nil {
			return s, 0, 0, err
		}
		s.Env = append(s.Env, k+"="+req.Env[k])
	}
	s.Hostname = req.Hostname
	s.AllowDegraded = req.AllowDegraded
	l := req.Limits
	if l.MemoryBytes != 0 {
		s.Limits.Memory = l.MemoryBytes
	}
	if l.DiskBytes != 0 {
		s.Limits.Disk = l.DiskBytes
	}
	if l.CPUs != 0 {
		s.Limits.CPUs = l.CPUs
	}
	if l.Pids != 0 {
		s.Limits.Pids = l.Pids
	}
	n := req.Network
	s.Net.Mode, s.Net.Allow, s.Net.Deny = n.Mode, n.Allow, n.Deny
	if n.EgressBytes != 0 {
		s.Net.EgressBytes = n.EgressBytes
	}
	if n.MaxConns != 0 {
		s.Net.MaxConns = n.MaxConns
	}
	ttl, err := parseDuration("ttl", req.TTL, DefaultTTL, MaxTTL)
	if err != nil {
		return s, 0, 0, err
	}
	if ttl == 0 {
		return s, 0, 0, errdefs.Invalid("ttl must be positive")
	}
	idle, err := parseDuration("idle_timeout", req.IdleTimeout, 0, MaxTTL)
	if err != nil {
		return s, 0, 0, err
	}
	s.Timeout = ttl
	if len(req.Metadata) > 64 {
		return s, 0, 0, errdefs.Invalid("metadata: at most 64 keys")
	}
	for k, v := range req.Metadata {
		if len(k) == 0 || len(k) > 128 || len(v) > 4096 {
			return s, 0, 0, errdefs.Invalid("metadata: keys of 1–128 bytes, values up to 4096")
		}
	}
	if len(req.Trigger.Inputs) > 256 || len(req.Trigger.TaskID) > 256 || len(req.Trigger.PromptDigest) > 256 {
		return s, 0, 0, errdefs.Invalid("trigger: task_id and prompt_digest up to 256 bytes, at most 256 inputs")
	}
	for i, g := range req.Grants {
		gttl, err := parseDuration(fmt.Sprintf("grant %d: ttl", i+1), g.TTL, 0, MaxTTL)
		if err != nil {
			return s, 0, 0, err
		}
		s.Grants = append(s.Grants, spec.Grant{Secret: g.Secret, Env: g.Env, Host: g.Host, Port: g.Port, Header: g.Header,
			Scheme: g.Scheme, Username: g.Username, Allow: g.Allow, TTL: gttl})
	}
	return s, ttl, idle, s.ValidateLongLived()
}

// Create makes a sandbox for tenant t.
func (s *Service) Create(ctx context.Context, t *tenant.Principal, req *api.CreateSandbox) (*api.Sandbox, error) {
	if t.Admin {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, "the admin key manages tenants; create sandboxes with a tenant's key")
	}
	sp, ttl, idle, err := specOf(req)
	if err != nil {
		return nil, err
	}
	if len(sp.Grants) > 0 && s.cfg.Broker == nil {
		return nil, errdefs.Unavailable("this daemon has no credential broker: grants cannot be kept")
	}
	sp.Tenant = t.ID
	if err := s.confine(t, &sp); err != nil {
		return nil, err
	}
	if s.cfg.Broker != nil {
		sp.Scan = t.ScanPolicy
		if sp.Scan == "" {
			sp.Scan = tenant.DefaultScanPolicy
		}
	}
	env := make([]field, 0, len(sp.Env))
	for i, kv := range sp.Env {
		k, _, _ := strings.Cut(kv, "=")
		env = append(env, field{"env " + k, &sp.Env[i], nil})
	}
	if err := s.scanCall(ctx, t, record.Who{Tenant: t.ID}, "create", env); err != nil {
		return nil, err
	}
	if err := s.auditable(); err != nil {
		return nil, err
	}
	if err := s.fromSnapshot(ctx, t, &sp); err != nil {
		return nil, err
	}
	id := newID()
	ctx, pc, err := s.admit(ctx, t, id, &sp)
	if err != nil {
		s.cfg.Metrics.createsRefused.Inc()
		return nil, err
	}
	defer s.settle(pc)
	t0 := time.Now()
	inst, err := s.cfg.Backend.Create(ctx, id, &sp, s.egressSink(id))
	if err != nil {
		if kerr := s.killedCreate(pc, nil); kerr != nil {
			return nil, kerr
		}
		s.cfg.Metrics.createFailures.Inc()
		return nil, err
	}
	if kerr := s.killedCreate(pc, inst); kerr != nil {
		return nil, kerr
	}
	ag := newAgentClient(inst.Socket())
	if err := ag.hello(ctx); err != nil {
		discard(inst)
		if kerr := s.killedCreate(pc, nil); kerr != nil {
			return nil, kerr
		}
		return nil, err
	}
	now := s.cfg.Now()
	specJSON, _ := json.Marshal(sp)
	meta, _ := json.Marshal(req.Metadata)
	trig, _ := json.Marshal(req.Trigger)
	b := &box{spec: sp, inst: inst, agent: ag, ended: make(chan struct{}), egressRate: newLimiter(MaxEgressRecords), rec: store.Sandbox{
		ID: id, Tenant: t.ID, TenantName: t.Tenant, State: api.StateRunning, Spec: string(specJSON), Metadata: string(meta), Trigger: string(trig),
		Created: now, Expires: now.Add(ttl), IdleTimeout: idle, LastActive: now, InitPid: inst.InitPid(),
	}}
	// The audit record first, then the daemon's own: a crash in between
	// leaves a sandbox without a record, which the next daemon ends (and
	// records); never one that runs unaudited.
	if err := s.cfg.Audit.Commit(ctx, b.who(), record.SandboxCreated{
		Spec: record.Spec(sp), Image: sp.Image, ImageDigest: inst.ImageDigest(), PolicySHA256: record.PolicyHash(sp.Net.Allow, sp.Net.Deny),
		Metadata: req.Metadata, Trigger: req.Trigger, Expires: &b.rec.Expires, IdleTimeout: idle.String(),
		Controls: record.ControlsOf(inst.Degraded()), InitPID: inst.InitPid(),
	}); err != nil {
		discard(inst)
		return nil, err
	}
	if err := s.cfg.Store.PutSandbox(context.WithoutCancel(ctx), b.rec); err != nil {
		discard(inst)
		s.cfg.Audit.Note(b.who(), record.SandboxDestroyed{Reason: "the daemon could not record it: " + err.Error()})
		return nil, fmt.Errorf("record sandbox: %w", err)
	}
	// Live from here, unless the kill switch came first: then it ends as
	// any live sandbox would (destroyed, its end recorded).
	s.mu.Lock()
	reason := pc.killed
	if reason == "" {
		s.boxes[id] = b
	}
	s.mu.Unlock()
	if reason != "" {
		s.end(b, reason)
		return nil, killedError(id, reason)
	}
	go s.watch(b)
	s.cfg.Metrics.creates.Inc()
	s.cfg.Metrics.createSeconds.Observe(time.Since(t0).Seconds())
	s.cfg.Log.Info("sandbox created", "id", id, "tenant", t.ID, "image", sp.Image, "took", time.Since(t0))
	return s.describe(b, true), nil
}

// admit checks tenant t's quotas for one more sandbox like sp and counts
// it as pending under id; the context it returns ends when the kill
// switch ends the create. A deleted tenant is admitted no more.
func (s *Service) admit(ctx context.Context, t *tenant.Principal, id string, sp *spec.Spec) (context.Context, *pendingCreate, error) {
	q := t.Quotas
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := t.Err(); err != nil {
		return nil, nil, err
	}
	if b := s.cpu[t.ID]; b != nil && b.exhausted(q, s.cfg.Now()) {
		return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s has used its CPU budget (%.0f s per %s); creates resume when the period ends", t.Tenant, q.CPUSeconds, q.CPUPeriod))
	}
	n, mem, cpus := 0, int64(0), 0.0
	for _, b := range s.boxes {
		if b.rec.Tenant == t.ID {
			n++
			mem += b.spec.Limits.Memory
			cpus += b.spec.Limits.CPUs
		}
	}
	for _, pc := range s.pending {
		if pc.tenant == t.ID {
			n++
			mem += pc.mem
			cpus += pc.cpus
		}
	}
	switch {
	case q.MaxSandboxes > 0 && n+1 > q.MaxSandboxes:
		return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s may have %d sandboxes at once and has %d", t.Tenant, q.MaxSandboxes, n))
	case q.MaxMemory > 0 && mem+sp.Limits.Memory > q.MaxMemory:
		return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s may use %s of memory in all; its sandboxes hold %s and this one asks %s", t.Tenant, spec.FormatSize(q.MaxMemory), spec.FormatSize(mem), spec.FormatSize(sp.Limits.Memory)))
	case q.MaxCPUs > 0 && cpus+sp.Limits.CPUs > q.MaxCPUs+1e-9:
		return nil, nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s may use %g CPUs in all; its sandboxes hold %g and this one asks %g", t.Tenant, q.MaxCPUs, cpus, sp.Limits.CPUs))
	}
	ctx, cancel := context.WithCancelCause(ctx)
	pc := &pendingCreate{id: id, tenant: t.ID, mem: sp.Limits.Memory, cpus: sp.Limits.CPUs, cancel: cancel, done: make(chan struct{})}
	s.pending[id] = pc
	return ctx, pc, nil
}

// settle takes an answered create off the pending list.
func (s *Service) settle(pc *pendingCreate) {
	s.mu.Lock()
	delete(s.pending, pc.id)
	s.mu.Unlock()
	pc.cancel(nil)
	close(pc.done)
}

// killedCreate says whether the kill switch ended create pc; if so it
// destroys inst (when there is one), records the end, and returns the
// error the create answers.
func (s *Service) killedCreate(pc *pendingCreate, inst Host) error {
	s.mu.Lock()
	reason := pc.killed
	s.mu.Unlock()
	if reason == "" {
		return nil
	}
	if inst != nil {
		discard(inst)
	}
	if s.cfg.Broker != nil {
		s.cfg.Broker.End(pc.id)
	}
	s.cfg.Audit.Note(record.Who{Tenant: pc.tenant, Sandbox: pc.id}, record.SandboxDestroyed{Reason: reason, While: "create"})
	s.cfg.Metrics.ends.WithLabelValues(endLabel(reason)).Inc()
	return killedError(pc.id, reason)
}

func killedError(id, reason string) error {
	return errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s was destroyed while it was being made: %s", id, reason))
}

// get finds sandbox id of tenant t. Another tenant's sandbox is not found,
// exactly as a missing one.
func (s *Service) get(t *tenant.Principal, id string) (*box, error) {
	s.mu.Lock()
	b, ok := s.boxes[id]
	s.mu.Unlock()
	if !ok || (!t.Admin && b.rec.Tenant != t.ID) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+quoteID(id))
	}
	return b, nil
}

func quoteID(id string) string {
	if len(id) > 64 {
		id = id[:64] + "…"
	}
	return fmt.Sprintf("%q", id)
}

// use finds a running sandbox for an operation and marks it active.
func (s *Service) use(t *tenant.Principal, id string) (*box, error) {
	b, err := s.get(t, id)
	if err != nil {
		return nil, err
	}
	if err := s.auditable(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.ending:
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+quoteID(id)+" (it is ending)")
	case b.rec.State == api.StatePaused:
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox "+id+" is paused: resume it first")
	}
	if err := b.agent.rate.take(); err != nil {
		return nil, err
	}
	b.rec.LastActive = s.cfg.Now()
	return b, nil
}

// Get describes one sandbox (live, or ended within the last day).
func (s *Service) Get(ctx context.Context, t *tenant.Principal, id string) (*api.Sandbox, error) {
	if b, err := s.get(t, id); err == nil {
		return s.describe(b, true), nil
	}
	// One record, by its id: not every ended one of every tenant.
	r, err := s.cfg.Store.SandboxByID(ctx, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if err == nil && r.State == api.StateEnded && (t.Admin || r.Tenant == t.ID) {
		return describeRecord(r, nil), nil
	}
	return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+quoteID(id))
}

// List describes tenant t's live sandboxes (every tenant's for the admin).
func (s *Service) List(_ context.Context, t *tenant.Principal) []*api.Sandbox {
	s.mu.Lock()
	var bs []*box
	for _, b := range s.boxes {
		if t.Admin || b.rec.Tenant == t.ID {
			bs = append(bs, b)
		}
	}
	s.mu.Unlock()
	out := make([]*api.Sandbox, 0, len(bs))
	for _, b := range bs {
		out = append(out, s.describe(b, false))
	}
	slices.SortFunc(out, func(a, b *api.Sandbox) int { return a.Created.Compare(b.Created) })
	return out
}

func (s *Service) describe(b *box, usage bool) *api.Sandbox {
	b.mu.Lock()
	rec := b.rec
	b.mu.Unlock()
	var u *lifecycle.Usage
	if usage {
		x := b.inst.Usage()
		u = &x
	}
	return describeRecord(rec, u)
}

func describeRecord(r store.Sandbox, u *lifecycle.Usage) *api.Sandbox {
	var sp spec.Spec
	_ = json.Unmarshal([]byte(r.Spec), &sp)
	out := &api.Sandbox{
		ID: r.ID, Tenant: r.TenantName, TenantID: r.Tenant, State: r.State, Image: sp.Image, Created: r.Created, Expires: r.Expires,
		LastActive: r.LastActive, EndReason: r.EndReason,
		Limits:  api.Limits{MemoryBytes: sp.Limits.Memory, DiskBytes: sp.Limits.Disk, CPUs: sp.Limits.CPUs, Pids: sp.Limits.Pids},
		Network: api.Network{Mode: sp.NetMode(), Allow: sp.Net.Allow, Deny: sp.Net.Deny, EgressBytes: sp.Net.EgressBytes, MaxConns: sp.Net.MaxConns},
	}
	if r.IdleTimeout > 0 {
		out.IdleTimeout = r.IdleTimeout.String()
	}
	for _, g := range sp.Grants {
		ag := api.Grant{Secret: g.Secret, Env: g.Env, Host: g.Host, Port: g.Port, Header: g.Header, Scheme: g.Scheme, Username: g.Username, Allow: g.Allow}
		if g.TTL > 0 {
			ag.TTL = g.TTL.String()
		}
		out.Grants = append(out.Grants, ag)
	}
	_ = json.Unmarshal([]byte(r.Metadata), &out.Metadata)
	_ = json.Unmarshal([]byte(r.Trigger), &out.Trigger)
	if !r.Ended.IsZero() {
		e := r.Ended
		out.Ended = &e
	}
	if u != nil {
		out.Usage = &api.Usage{CPUSeconds: u.CPU.Seconds(), MemoryBytes: u.Memory, MemoryPeakBytes: u.MemoryPeak, OOMKills: u.OOMKills, PidsLimited: u.PidsLimited}
	}
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
	b, err := s.get(t, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer func() { b.mu.Unlock() }()
	if b.ending {
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+quoteID(id)+" (it is ending)")
	}
	if pause == (b.rec.State == api.StatePaused) {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s is already %s", id, b.rec.State))
	}
	state := api.StateRunning
	if pause {
		state = api.StatePaused
		// A freeze the kernel did not finish may finish later: it is
		// undone, so that the sandbox runs, as it stays recorded.
		if err = b.inst.Pause(); err != nil {
			if rerr := b.inst.Resume(); rerr != nil {
				s.cfg.Log.Error("thaw after a failed freeze", "id", id, "err", rerr)
			}
		}
	} else {
		err = b.inst.Resume()
	}
	if err != nil {
		return nil, err
	}
	b.rec.State = state
	b.rec.LastActive = s.cfg.Now()
	rec := b.rec
	b.mu.Unlock()
	err = s.cfg.Store.PutSandbox(ctx, rec)
	if err == nil {
		var d record.Data = record.SandboxResumed{}
		if pause {
			d = record.SandboxPaused{}
		}
		err = s.cfg.Audit.Commit(ctx, b.who(), d)
	}
	b.mu.Lock()
	if err != nil {
		return nil, err
	}
	return describeRecord(rec, nil), nil
}

// Extend moves a sandbox's expiry to ttl from now.
func (s *Service) Extend(ctx context.Context, t *tenant.Principal, id string, req *api.Extend) (*api.Sandbox, error) {
	ttl, err := parseDuration("ttl", req.TTL, 0, MaxTTL)
	if err != nil {
		return nil, err
	}
	if ttl <= 0 {
		return nil, errdefs.Invalid("ttl must be positive")
	}
	b, err := s.get(t, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.ending {
		b.mu.Unlock()
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+quoteID(id)+" (it is ending)")
	}
	b.rec.Expires = s.cfg.Now().Add(ttl)
	b.rec.LastActive = s.cfg.Now()
	rec := b.rec
	b.mu.Unlock()
	if err := s.cfg.Store.PutSandbox(ctx, rec); err != nil {
		return nil, err
	}
	if err := s.cfg.Audit.Commit(ctx, b.who(), record.SandboxExtended{Expires: rec.Expires}); err != nil {
		return nil, err
	}
	return describeRecord(rec, nil), nil
}

// Destroy ends a sandbox and answers when it is gone.
func (s *Service) Destroy(_ context.Context, t *tenant.Principal, id string) error {
	b, err := s.get(t, id)
	if err != nil {
		return err
	}
	s.end(b, "destroyed by request")
	return nil
}

// KillAll destroys every sandbox of tenant (a name; every tenant's when
// tenant is "" and t is the admin), those being made included, and
// answers when they are all gone.
func (s *Service) KillAll(ctx context.Context, t *tenant.Principal, tenant string) ([]string, error) {
	switch {
	case !t.Admin && tenant != "" && tenant != t.Tenant:
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteID(tenant))
	case !t.Admin:
		return s.killAll(t, t.ID, "kill switch (tenant "+t.Tenant+")")
	case tenant == "":
		return s.killAll(t, "", "kill switch (all tenants)")
	}
	tn, err := s.cfg.Store.TenantByName(ctx, tenant)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteID(tenant))
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
	s.mu.Lock()
	var bs []*box
	for _, b := range s.boxes {
		if tid == "" || b.rec.Tenant == tid {
			bs = append(bs, b)
		}
	}
	var pcs []*pendingCreate
	for _, pc := range s.pending {
		if (tid == "" || pc.tenant == tid) && pc.killed == "" {
			pc.killed = reason
			pc.cancel(errdefs.New(errdefs.ErrFailedPrecondition, reason))
			pcs = append(pcs, pc)
		}
	}
	s.mu.Unlock()
	if len(pcs) > 0 {
		s.cfg.Log.Warn("kill switch: ending creates in flight", "tenant", tid, "creates", len(pcs))
	}
	var wg sync.WaitGroup
	ids := make([]string, 0, len(bs)+len(pcs))
	for _, b := range bs {
		ids = append(ids, b.rec.ID)
		wg.Add(1)
		go func() { defer wg.Done(); s.end(b, reason) }()
	}
	for _, pc := range pcs {
		ids = append(ids, pc.id)
		wg.Add(1)
		go func() { defer wg.Done(); <-pc.done }()
	}
	wg.Wait()
	slices.Sort(ids)
	s.cfg.Log.Warn("kill switch", "tenant", tid, "destroyed", len(ids), "in_flight", len(pcs))
	return ids, s.cfg.Audit.Commit(context.Background(), record.Who{Tenant: tid}, record.KillSwitch{Admin: t.Admin, Destroyed: ids})
}

// end destroys b (once) and records why; every caller returns only when
// it is gone.
func (s *Service) end(b *box, reason string) {
	b.mu.Lock()
	if b.ending {
		b.mu.Unlock()
		<-b.ended
		return
	}
	b.ending = true
	b.mu.Unlock()
	s.chargeCPU(b)
	b.agent.close()
	usage := b.inst.Usage()
	// Killed first (a kill switch must not wait for a diff), then what
	// changed is read from the dead sandbox's workspace.
	err := b.inst.Destroy()
	if err != nil {
		s.cfg.Log.Error("destroy", "id", b.rec.ID, "err", err)
	}
	changes := record.ReadWorkspace(b.inst, b.rec.ID, s.cfg.PatchDir)
	b.inst.Release()
	if s.cfg.Broker != nil {
		s.cfg.Broker.End(b.rec.ID) // every token it held is refused from now on
	}
	s.mu.Lock()
	delete(s.boxes, b.rec.ID)
	s.mu.Unlock()
	b.mu.Lock()
	b.rec.State, b.rec.Ended, b.rec.EndReason = api.StateEnded, s.cfg.Now(), reason
	rec := b.rec
	b.mu.Unlock()
	if err := s.cfg.Store.PutSandbox(context.Background(), rec); err != nil {
		s.cfg.Log.Error("record sandbox end", "id", rec.ID, "err", err)
	}
	if err := s.cfg.Audit.Commit(context.Background(), b.who(), record.SandboxDestroyed{
		Reason: reason, Limits: limitsHit(usage), CPUSeconds: usage.CPU.Seconds(), MemoryPeakBytes: usage.MemoryPeak,
		OOMKills: usage.OOMKills, PidsLimited: usage.PidsLimited, Workspace: changes,
	}); err != nil {
		s.cfg.Log.Error("audit", "kind", "sandbox.destroyed", "id", rec.ID, "err", err)
	}
	s.cfg.Metrics.ends.WithLabelValues(endLabel(reason)).Inc()
	s.cfg.Log.Info("sandbox ended", "id", rec.ID, "tenant", rec.Tenant, "reason", reason)
	close(b.ended)
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
func (s *Service) watch(b *box) {
	select {
	case <-b.inst.Done():
	case <-b.ended:
		return
	}
	reason := "the sandbox's init exited (its agent stopped)"
	select {
	case <-b.inst.OOM():
		reason = fmt.Sprintf("memory limit (%s) exceeded: the sandbox was destroyed", spec.FormatSize(b.spec.Limits.Memory))
		s.cfg.Metrics.limitKills.WithLabelValues("memory").Inc()
	default:
		if b.inst.Usage().PidsLimited > 0 {
			reason += fmt.Sprintf("; its pids limit (%d) had been reached", b.spec.Limits.Pids)
			s.cfg.Metrics.limitKills.WithLabelValues("pids").Inc()
		}
	}
	s.end(b, reason)
}

// Recover adopts the sandboxes an earlier daemon left running and records
// the ones it cannot (their remains are destroyed).
func (s *Service) Recover(ctx context.Context) error {
	ts, err := s.cfg.Store.Tenants(ctx)
	if err != nil {
		return err
	}
	s.loadBudgets(ts)
	recs, err := s.cfg.Store.Sandboxes(ctx, api.StateRunning, api.StatePaused)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.adopt(ctx, r)
		}()
	}
	wg.Wait()
	// A daemon killed between making a sandbox and recording it left one
	// nobody knows: end it.
	known := map[string]bool{}
	for _, r := range recs {
		known[r.ID] = true
	}
	for _, id := range s.cfg.Backend.LongLived() {
		if known[id] {
			continue
		}
		err := s.cfg.Backend.Discard(id)
		if s.cfg.Broker != nil {
			s.cfg.Broker.End(id)
		}
		s.cfg.Log.Warn("discarded a sandbox without a record", "id", id, "err", err)
		s.cfg.Audit.Note(record.Who{Sandbox: id}, record.SandboxDestroyed{Reason: "found without a record after a daemon restart"})
	}
	if s.cfg.Broker != nil {
		s.mu.Lock()
		live := slices.Collect(maps.Keys(s.boxes))
		s.mu.Unlock()
		s.cfg.Broker.Sweep(live)
	}
	return s.cfg.Store.PruneEnded(ctx, s.cfg.Now().Add(-keepEnded))
}

func (s *Service) adopt(ctx context.Context, r store.Sandbox) {
	fail := func(err error) {
		if derr := s.cfg.Backend.Discard(r.ID); derr != nil {
			s.cfg.Log.Error("discard an unadopted sandbox", "id", r.ID, "err", derr)
		}
		if s.cfg.Broker != nil {
			s.cfg.Broker.End(r.ID)
		}
		r.State, r.Ended, r.EndReason = api.StateEnded, s.cfg.Now(), "not adopted after a daemon restart: "+err.Error()
		if perr := s.cfg.Store.PutSandbox(ctx, r); perr != nil {
			s.cfg.Log.Error("record sandbox end", "id", r.ID, "err", perr)
		}
		s.cfg.Log.Warn("sandbox not adopted", "id", r.ID, "err", err)
		s.cfg.Audit.Note(record.Who{Tenant: r.Tenant, Sandbox: r.ID}, record.SandboxDestroyed{Reason: r.EndReason})
		s.cfg.Metrics.ends.WithLabelValues("lost").Inc()
	}
	var sp spec.Spec
	if err := json.Unmarshal([]byte(r.Spec), &sp); err != nil {
		fail(fmt.Errorf("its record is unreadable: %v", err))
		return
	}
	inst, err := s.cfg.Backend.Adopt(ctx, r.ID, &sp, r.InitPid, s.egressSink(r.ID))
	if err != nil {
		fail(err)
		return
	}
	ag := newAgentClient(inst.Socket())
	if err := helloAdopted(ctx, r.State, inst, ag); err != nil {
		discard(inst)
		fail(err)
		return
	}
	r.LastActive = s.cfg.Now() // idle time restarts with the daemon
	b := &box{rec: r, spec: sp, inst: inst, agent: ag, ended: make(chan struct{}), cpuSeen: inst.Usage().CPU, egressRate: newLimiter(MaxEgressRecords)}
	s.mu.Lock()
	s.boxes[r.ID] = b
	s.mu.Unlock()
	go s.watch(b)
	s.cfg.Metrics.adopted.Inc()
	s.cfg.Audit.Note(b.who(), record.SandboxAdopted{InitPID: inst.InitPid()})
	s.cfg.Log.Info("sandbox adopted", "id", r.ID, "tenant", r.Tenant)
}

// helloAdopted checks the agent of an adopted sandbox. A paused one's
// agent is frozen with it and would never answer: it is thawed for the
// check and frozen again.
func helloAdopted(ctx context.Context, state string, inst Host, ag *agentClient) error {
	if state != api.StatePaused {
		return ag.hello(ctx)
	}
	if err := inst.Resume(); err != nil {
		return err
	}
	if err := ag.hello(ctx); err != nil {
		return err
	}
	return inst.Pause()
}

// Run expires sandboxes (TTL, idle), enforces CPU budgets and refills the
// agents' rate limits, once a second, until ctx ends.
func (s *Service) Run(ctx context.Context) {
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
	now := s.cfg.Now()
	s.mu.Lock()
	bs := slices.Collect(maps.Values(s.boxes))
	s.mu.Unlock()
	states := map[string]float64{}
	var wg sync.WaitGroup
	for _, b := range bs {
		b.agent.rate.refill()
		s.noteDropped(b)
		b.mu.Lock()
		rec := b.rec
		ending := b.ending
		b.mu.Unlock()
		if ending {
			continue
		}
		states[rec.State]++
		reason := ""
		switch {
		case !now.Before(rec.Expires):
			reason = "TTL expired"
			s.cfg.Metrics.limitKills.WithLabelValues("ttl").Inc()
		case rec.IdleTimeout > 0 && now.Sub(rec.LastActive) >= rec.IdleTimeout:
			reason = fmt.Sprintf("idle for %v", rec.IdleTimeout)
			s.cfg.Metrics.limitKills.WithLabelValues("idle").Inc()
		}
		if reason != "" {
			wg.Add(1)
			go func() { defer wg.Done(); s.end(b, reason) }()
		}
	}
	for _, st := range []string{api.StateRunning, api.StatePaused} {
		s.cfg.Metrics.sandboxes.WithLabelValues(st).Set(states[st])
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
