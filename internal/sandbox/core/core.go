// Package core is what the sandbox service's parts share: its
// configuration and the host's interfaces, the live sandboxes (Box) under
// one lock and finding a tenant's sandbox for a call (Find, Use), a
// sandbox as the API describes it, the client of a sandbox's agent and its
// rate limit, the scan of every call for credentials, the cap on a
// sandbox's egress records, a create request turned into a spec, a
// tenant's host paths held to its roots, and the service's metrics. The
// service (internal/sandbox) and its calls on commands, files and
// snapshots are built on one Core.
package core

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/api"
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
	Pause() error
	Resume() error
	Usage() lifecycle.Usage
	// LimitEvents are Usage's OOMKills and PidsLimited alone, read at a
	// fraction of its cost.
	LimitEvents() (oomKills, pidsLimited int64)
	// CPU is Usage's CPU alone, read each second for every sandbox.
	CPU() time.Duration
	// Diff streams the diff of /workspace to w; the walk stops where ctx
	// ends.
	Diff(ctx context.Context, w io.Writer) error
	// Changes lists what changed in /workspace and writes the patch (at
	// most maxPatch bytes) to w, within ctx's time.
	Changes(ctx context.Context, w io.Writer, maxPatch int64) (*workspace.Report, error)
	// Degraded lists the controls the sandbox runs without (an explicit
	// opt-out the host needed).
	Degraded() []string
	// Wall names the wall it is on; WallVersion, its runtime's version.
	Wall() string
	WallVersion() string
	// ImageDigest is the content digest of its image ("" for the host's).
	ImageDigest() string
	// Archive streams a tar of /workspace/rel to the writer start returns;
	// start is called, with what the archive leaves out, once it is
	// known to fit maxBytes and before the first byte.
	Archive(ctx context.Context, rel string, maxBytes int64, start func(skipped []string) io.Writer) error
	// Snapshot saves the sandbox's files (at most maxBytes of content),
	// reporting its progress to ctx's sink; a ctx that ends before the
	// copy is whole leaves nothing.
	// With memory, it saves the sandbox's memory too (gVisor only), and
	// the sandbox runs on.
	Snapshot(ctx context.Context, maxBytes int64, memory bool) (*lifecycle.SnapshotFiles, error)
	// Kill ends every process of the sandbox at once (Destroy does too,
	// and then removes what it held).
	Kill()
	// Destroy kills every process and removes what the sandbox held on the
	// host, except what Release gives back: its workspace stays readable
	// (Changes) in between.
	Destroy() error
	Release()
}

// Backend makes and adopts sandboxes on the host (the lifecycle:
// sandbox.NewBackend).
type Backend interface {
	// Create makes sandbox id; onEgress sees its egress decisions.
	Create(ctx context.Context, id string, s *spec.Spec, onEgress func(eventlog.Event)) (Host, error)
	Adopt(ctx context.Context, id string, s *spec.Spec, pid int, onEgress func(eventlog.Event)) (Host, error)
	// SnapshotPaths says where a snapshot's root ("" when it has none)
	// and workspace are; RemoveSnapshot deletes its files.
	SnapshotPaths(id string) (root, ws string, err error)
	RemoveSnapshot(id string) error
	// SnapshotHasMemory reports whether a snapshot holds a sandbox's
	// memory (it is restored running).
	SnapshotHasMemory(id string) bool
	// RemoveCheckpoint deletes a snapshot's memory checkpoint, keeping
	// its files (a fork's, once its copies are restored).
	RemoveCheckpoint(id string) error
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
// Default caps on background commands running at once.
const (
	DefaultMaxBackground          = 64
	DefaultMaxBackgroundPerTenant = 256
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
	// DefaultIsolation is the wall of a create that names none
	// (spec.Isolations; "": container). Unlike a tenant's hold it is a
	// default only: a create may name another wall.
	DefaultIsolation string
	// Principal is tenant id as its key signs it in now (its quotas,
	// roots, hold): the pools' refills are admitted as it. Nil: pools
	// cannot be set.
	Principal func(ctx context.Context, id string) (*tenant.Principal, error)
	// Node is what the daemon says of its node (GET /v1/node) and the
	// capacity it holds every create and pool refill to.
	Node NodeConfig
}

// NodeConfig describes the node a daemon runs on (internal/sandbox,
// node.go).
type NodeConfig struct {
	Name, Version string
	// Isolations are the walls the node can make sandboxes on.
	Isolations []string
	// Capacity is what the node reports it may hand out; Held is the part
	// of it every create and pool refill is held to, across all tenants (a
	// zero field holds nothing: the host's CPUs and memory are reported
	// by default without holding sandboxes to them).
	Capacity, Held api.Resources
	// AuditHead is the audit log's last record on disk (nil, or answering
	// nil: no log).
	AuditHead func() *api.AuditHead
}

// Core holds every live sandbox of every tenant. Tenants are keyed by
// their id (tenant.Principal.ID), never by their name.
type Core struct {
	Cfg Config
	// Mu guards Boxes, each Box's Background, and what the parts built
	// on the Core keep beside them.
	Mu    sync.Mutex
	Boxes map[string]*Box // by sandbox id
}

// New makes the core, with cfg's defaults filled in.
func New(cfg Config) *Core {
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
	return &Core{Cfg: cfg, Boxes: map[string]*Box{}}
}

// Box is one live sandbox.
type Box struct {
	Mu     sync.Mutex
	Rec    store.Sandbox
	Spec   spec.Spec
	Inst   Host
	Agent  *Agent
	Ending bool
	Ended  chan struct{} // closed once it is destroyed and recorded
	// CPUSeen is the CPU time already charged to the tenant's budget.
	CPUSeen time.Duration
	// The egress records it may make this second, and what was dropped.
	EgressRate    *Limiter
	EgressDropped atomic.Int64
	// Background is its running background commands (under Core.Mu).
	Background int
	// Settle, when set (under Mu, before the Box is published; never
	// changed after), is
	// what its create left to finish after it answered: a pooled
	// sandbox is handed out once its sandbox.created record has its
	// place in the log, and is thawed, its record made durable and its
	// row stored after (internal/sandbox, pools.go). Every call on it
	// waits for it (Find), and so does its end.
	Settle *Settle
}

// Settle is work a create finishes after its answer.
type Settle struct {
	done chan struct{}
	err  error
}

// NewSettle is unfinished work.
func NewSettle() *Settle { return &Settle{done: make(chan struct{})} }

// Finish marks it done, failed with err (nil: it worked); once.
func (st *Settle) Finish(err error) {
	st.err = err
	close(st.done)
}

// Settled waits until what b's create left to finish is done and says
// whether it failed (then b is being ended).
func (b *Box) Settled() error {
	b.Mu.Lock()
	st := b.Settle
	b.Mu.Unlock()
	if st == nil {
		return nil
	}
	<-st.done
	return st.err
}

// Who is what b's records say of whom they are.
func (b *Box) Who() record.Who {
	var tr struct {
		TaskID string `json:"task_id"`
	}
	_ = json.Unmarshal([]byte(b.Rec.Trigger), &tr)
	return record.Who{Tenant: b.Rec.Tenant, Sandbox: b.Rec.ID, Trigger: tr.TaskID}
}

// WhoFor is what the records of t's call on b say of whom they are: b's,
// and "admin" as the actor when the admin key made the call.
func (b *Box) WhoFor(t *tenant.Principal) record.Who {
	w := b.Who()
	if t != nil && t.Admin {
		w.Actor = "admin"
	}
	return w
}

// Describe is b as the API describes it, with its usage when usage.
func (b *Box) Describe(usage bool) *api.Sandbox {
	b.Mu.Lock()
	rec := b.Rec
	b.Mu.Unlock()
	var u *lifecycle.Usage
	if usage {
		x := b.Inst.Usage()
		u = &x
	}
	return DescribeRecord(rec, u)
}

// DescribeRecord is the sandbox of record r as the API describes it
// (usage u, when known).
func DescribeRecord(r store.Sandbox, u *lifecycle.Usage) *api.Sandbox {
	var sp spec.Spec
	_ = json.Unmarshal([]byte(r.Spec), &sp)
	out := &api.Sandbox{
		ID: r.ID, Tenant: r.TenantName, TenantID: r.Tenant, State: r.State, Isolation: sp.Wall(), Image: sp.Image, Created: r.Created, Expires: r.Expires,
		LastActive: r.LastActive, EndReason: r.EndReason, Pool: sp.Pool, OnTTL: sp.OnTTL, ExternalID: r.ExternalID,
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

// NewID is a new sandbox or exec id.
func NewID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Auditable refuses work up front once the log cannot record it.
func (s *Core) Auditable() error { return s.Cfg.Audit.Failed() }

// Find finds sandbox id of tenant t. Another tenant's sandbox is not found,
// exactly as a missing one. It returns once what the sandbox's create
// left to finish is done (Box.Settle): no call acts on a sandbox before
// the record of its creation is durable.
func (s *Core) Find(t *tenant.Principal, id string) (*Box, error) {
	s.Mu.Lock()
	b, ok := s.Boxes[id]
	s.Mu.Unlock()
	if !ok || (!t.Admin && b.Rec.Tenant != t.ID) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+QuoteID(id))
	}
	if b.Settled() != nil {
		// Why is in its end reason (Get), once it has ended.
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+QuoteID(id)+" (it could not be made ready and is ending)")
	}
	return b, nil
}

// QuoteID quotes an id a caller gave, for a message, cut at 64 bytes.
func QuoteID(id string) string {
	if len(id) > 64 {
		id = id[:64] + "…"
	}
	return fmt.Sprintf("%q", id)
}

// Use finds a running sandbox for an operation and marks it active.
func (s *Core) Use(t *tenant.Principal, id string) (*Box, error) {
	b, err := s.Find(t, id)
	if err != nil {
		return nil, err
	}
	if err := s.Auditable(); err != nil {
		return nil, err
	}
	b.Mu.Lock()
	defer b.Mu.Unlock()
	switch {
	case b.Ending:
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+QuoteID(id)+" (it is ending)")
	case b.Rec.State == api.StatePaused:
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox "+id+" is paused: resume it first")
	}
	if err := b.Agent.Rate.Take(); err != nil {
		return nil, err
	}
	b.Rec.LastActive = s.Cfg.Now()
	return b, nil
}

// ValidUser refuses a user other than the sandbox's two.
func ValidUser(u string) error {
	switch u {
	case "", "user", "root":
		return nil
	}
	return errdefs.Invalid(fmt.Sprintf("user %q: want \"user\" or \"root\"", u))
}

// UserOr is the user a call acts as: "user" unless it says.
func UserOr(u string) string {
	if u == "" {
		return "user"
	}
	return u
}
