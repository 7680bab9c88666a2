// Package nodes is the controller's view of the cluster's airlock daemons:
// the node tracker.
//
// A Tracker follows every AirlockNode (k8s/api/v1alpha1). For each it keeps
// a daemon client with the node's admin key and the daemon's event stream
// (GET /v1/node/events), reconnecting with backoff and resyncing (GET
// /v1/sandboxes?all=true) on every reconnect. From the stream it knows each
// node's state (Ready, Unreachable, Lost, Fencing), capacity, allocation,
// pools and sandboxes, with no apiserver read. It writes AirlockNode status
// (at most every 10 s, or at once on a Ready transition).
//
// The API other packages use:
//
//   - Place(Request) chooses a node for a new sandbox and reserves its
//     request there (an assume cache) until the node reports the sandbox,
//     so concurrent reconciles never oversubscribe a node between two
//     events. Its error says why no node fits ("0/3 airlock nodes are
//     available: 2 insufficient cpu, 1 not ready").
//   - Tenant(ctx, node, ns) is a daemon client for namespace ns on node,
//     with the tenant key TenantKey(master, node, ns); the tenant is made
//     (or its key set) on the node on first use.
//   - Node, Nodes and ReadyNodes give snapshots of the nodes' states, with
//     each node's pools keyed by PoolKey{tenant, daemon pool name}.
//   - DaemonSandbox looks up what a node holds for an external id; Locate
//     finds a live one on any node.
//   - SandboxEvents, ClaimEvents and PoolEvents are channels for
//     controller-runtime's source.Channel: the Sandboxes and SandboxClaims
//     a node change or a daemon sandbox's end affects, those waiting for
//     capacity when it frees (Request.Waiter, Wait), and per-namespace pool
//     changes (see PoolEvents).
//
// Fencing and orphans: on every (re)connect and every sweep interval the
// tracker lists the node's sandboxes; one whose external id is no live
// Sandbox's or SandboxClaim's UID in two consecutive sweeps (at once when
// the node returns from Lost), or whose Sandbox is NodeLost or placed on
// another node, is destroyed. Sandboxes without an external id are never
// touched.
package nodes

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"
)

// Annotations and metadata keys shared by the controller's parts.
const (
	// AnnotationNode names the AirlockNode a Sandbox runs on.
	AnnotationNode = "airlock.dev/node"
	// AnnotationSandboxID is the daemon's id of the Sandbox's sandbox.
	AnnotationSandboxID = "airlock.dev/sandbox-id"

	// MetaNamespace, MetaName, MetaClaim and MetaUID are the daemon
	// sandbox metadata keys that tie it to its Kubernetes object.
	MetaNamespace = "k8s.namespace"
	MetaName      = "k8s.name"
	MetaClaim     = "k8s.claim"
	MetaUID       = "k8s.uid"

	// ReasonNodeLost is the Sandbox condition reason of a sandbox whose
	// node was lost.
	ReasonNodeLost = "NodeLost"
	// ReasonNodeUnreachable is the Ready=False reason while its node
	// cannot be reached.
	ReasonNodeUnreachable = "NodeUnreachable"
)

// TenantKey is the key of tenant ns on node: "airlock_" and the hex of
// HMAC-SHA256(master, node + "/" + ns). The controller and the gateway
// derive it alike; no per-node key is stored anywhere.
func TenantKey(master []byte, node, ns string) string {
	m := hmac.New(sha256.New, master)
	m.Write([]byte(node + "/" + ns))
	return "airlock_" + hex.EncodeToString(m.Sum(nil))
}

// KeySHA256 is the lowercase hex SHA-256 of key, the form a daemon is given
// a tenant key in.
func KeySHA256(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// State is a node's state.
type State string

// The node states.
const (
	// StatePending: the node is known but has not been reached yet.
	StatePending State = "Pending"
	// StateReady: the event stream is up; sandboxes may be placed.
	StateReady State = "Ready"
	// StateUnreachable: the stream dropped and the daemon did not answer.
	StateUnreachable State = "Unreachable"
	// StateLost: unreachable for longer than the lost timeout; its
	// sandboxes are given up.
	StateLost State = "Lost"
	// StateFencing: the node is back and its given-up sandboxes are being
	// ended before it is Ready.
	StateFencing State = "Fencing"
)

// PoolKey names a daemon pool on a node: the tenant (namespace) and the
// daemon pool's name.
type PoolKey struct {
	Tenant string
	Name   string
}

// Snapshot is a copy of one node's state.
type Snapshot struct {
	Name           string
	State          State
	Message        string // why it is not Ready, if it is not
	Unschedulable  bool
	RuntimeClasses []string
	BootID         string
	Version        string
	Capacity       api.Resources
	Allocated      api.Resources // as last reported, plus sandboxes made since
	Assumed        api.Resources // reserved by Place, not reported yet
	Pools          map[PoolKey]api.NodePool
	// Since is when the node entered State.
	Since time.Time
}

// Serves reports whether the node serves runtime class class.
func (s *Snapshot) Serves(class string) bool {
	for _, c := range s.RuntimeClasses {
		if c == class {
			return true
		}
	}
	return false
}

// Free is what the node can still be given: capacity less allocated and
// assumed. A zero capacity of sandboxes means no cap (Sandboxes is then -1).
func (s *Snapshot) Free() api.Resources {
	f := api.Resources{
		CPUs:        s.Capacity.CPUs - s.Allocated.CPUs - s.Assumed.CPUs,
		MemoryBytes: s.Capacity.MemoryBytes - s.Allocated.MemoryBytes - s.Assumed.MemoryBytes,
		Sandboxes:   -1,
	}
	if s.Capacity.Sandboxes > 0 {
		f.Sandboxes = s.Capacity.Sandboxes - s.Allocated.Sandboxes - s.Assumed.Sandboxes
	}
	return f
}

// DaemonSandbox is what a node holds for one external id.
type DaemonSandbox struct {
	ID        string
	Tenant    string
	Ended     bool
	EndReason string
}

// Config configures a Tracker.
type Config struct {
	// Client reads Sandboxes and SandboxClaims (the manager's cached
	// client) and writes AirlockNode status.
	Client client.Client
	// Reader reads Secrets uncached (the manager's API reader): the master
	// Secret and each node's admin key Secret.
	Reader client.Reader
	// MasterSecret is the Secret (key "master") of the tenant key master;
	// it is made if missing.
	MasterSecret types.NamespacedName
	// LostTimeout is how long a node is Unreachable before it is Lost.
	LostTimeout time.Duration
	// SweepInterval is the time between two orphan sweeps of a node.
	SweepInterval time.Duration
	// Heartbeat is asked of each daemon's event stream; a stream silent
	// for three of them counts as dropped (default 2s).
	Heartbeat time.Duration
	Log       logr.Logger
}

// Tracker follows the cluster's airlock nodes. Make one with New and add it
// to a manager with SetupWithManager.
type Tracker struct {
	cfg Config
	log logr.Logger

	masterOnce sync.Mutex
	master     []byte

	mu      sync.Mutex
	nodes   map[string]*node
	waiters map[waiterKey]client.Object
	// statusKick wakes the status writer.
	statusKick chan struct{}

	sandboxes, claims, pools *feed

	// ctx is the tracker's run context, set by Start.
	ctxMu sync.Mutex
	ctx   context.Context
}

type waiterKey struct {
	kind string
	key  types.NamespacedName
}

// New returns a Tracker.
func New(cfg Config) *Tracker {
	if cfg.LostTimeout <= 0 {
		cfg.LostTimeout = 2 * time.Minute
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = time.Minute
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 2 * time.Second
	}
	return &Tracker{
		cfg:        cfg,
		log:        cfg.Log,
		nodes:      map[string]*node{},
		waiters:    map[waiterKey]client.Object{},
		statusKick: make(chan struct{}, 1),
		sandboxes:  newFeed(),
		claims:     newFeed(),
		pools:      newFeed(),
	}
}

// SandboxEvents carries the Sandboxes (namespace and name set) that a node
// change or a daemon sandbox's end affects, and those waiting for capacity
// when it frees. For source.Channel.
func (t *Tracker) SandboxEvents() <-chan event.GenericEvent { return t.sandboxes.out }

// ClaimEvents carries the SandboxClaims (namespace and name set) whose
// daemon sandbox ended, and those waiting for capacity when it frees.
func (t *Tracker) ClaimEvents() <-chan event.GenericEvent { return t.claims.out }

// PoolEvents carries objects whose namespace names a tenant one of whose
// daemon pools changed (ready count, size) on some node; an empty namespace
// means a node-level change (a node became Ready, Unreachable or Lost, was
// added or removed, or its capacity changed) that may affect every pool.
// Objects waiting through Wait that are not Sandboxes or SandboxClaims come
// here too, with their name set.
func (t *Tracker) PoolEvents() <-chan event.GenericEvent { return t.pools.out }

// Node returns a snapshot of one node.
func (t *Tracker) Node(name string) (Snapshot, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[name]
	if n == nil {
		return Snapshot{}, false
	}
	return n.snapshot(), true
}

// Nodes returns snapshots of every node, in name order.
func (t *Tracker) Nodes() []Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Snapshot, 0, len(t.nodes))
	for _, n := range t.sortedNodes() {
		out = append(out, n.snapshot())
	}
	return out
}

// ReadyNodes returns the Ready, schedulable nodes that serve runtime class
// class, in name order.
func (t *Tracker) ReadyNodes(class string) []Snapshot {
	var out []Snapshot
	for _, s := range t.Nodes() {
		if s.State == StateReady && !s.Unschedulable && s.Serves(class) {
			out = append(out, s)
		}
	}
	return out
}

// DaemonSandbox returns what node holds for externalID: ok is false when the
// node is unknown or has not been synced since it was last reached, or
// holds no sandbox (live or ended since) of that id.
func (t *Tracker) DaemonSandbox(node, externalID string) (DaemonSandbox, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[node]
	if n == nil || !n.synced {
		return DaemonSandbox{}, false
	}
	d, ok := n.byExternal[externalID]
	return d, ok
}

// Locate finds the live daemon sandbox of externalID on any synced node
// (a create whose answer was lost before it was recorded).
func (t *Tracker) Locate(externalID string) (node string, d DaemonSandbox, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.sortedNodes() {
		if d, ok := n.byExternal[externalID]; ok && n.synced && !d.Ended {
			return n.name, d, true
		}
	}
	return "", DaemonSandbox{}, false
}

// Synced reports whether node's sandboxes have been listed since it was
// last reached (so that DaemonSandbox's "not found" means the node holds
// no such sandbox, or only made it since).
func (t *Tracker) Synced(node string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[node]
	return n != nil && n.synced
}

// Wait asks for obj to be sent again (on SandboxEvents for a Sandbox,
// ClaimEvents for a SandboxClaim, PoolEvents otherwise) when capacity frees
// on some node or a node becomes Ready.
func (t *Tracker) Wait(obj client.Object) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.waiters[waiterKey{kindOf(obj), client.ObjectKeyFromObject(obj)}] = obj
}

// Admin returns the admin-key client of node.
func (t *Tracker) admin(name string) (*airlock.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[name]
	if n == nil || n.admin == nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "airlock node " + name + " is not connected"}
	}
	return n.admin, nil
}
