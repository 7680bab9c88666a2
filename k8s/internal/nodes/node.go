package nodes

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"
	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
)

// node is the tracker's state of one AirlockNode; guarded by Tracker.mu.
type node struct {
	name   string
	spec   v1alpha1.AirlockNodeSpec
	cancel context.CancelFunc
	admin  *airlock.Client

	state   State
	message string
	since   time.Time
	// wasLost: the node was Lost since it was last Ready; fencing then
	// ends every sandbox the cluster has no object for at once.
	wasLost bool

	bootID, version     string
	capacity, allocated api.Resources
	pools               map[PoolKey]api.NodePool
	auditHead           *api.AuditHead
	lastEvent           time.Time

	reservations map[string]*reservation
	// byExternal: the node's sandboxes by external id, live and ended
	// since the last sync; valid while synced.
	byExternal map[string]DaemonSandbox
	synced     bool

	tenants map[string]*tenant
	// candidates are the orphans of the last sweep.
	candidates map[string]bool

	// status writing
	statusDirty     bool
	statusNow       bool // a Ready transition: write at once
	lastStatusWrite time.Time
}

type tenant struct {
	mu sync.Mutex
	cl *airlock.Client
}

func newNode(name string, spec v1alpha1.AirlockNodeSpec) *node {
	return &node{
		name:         name,
		spec:         spec,
		state:        StatePending,
		message:      "not reached yet",
		since:        time.Now(),
		pools:        map[PoolKey]api.NodePool{},
		reservations: map[string]*reservation{},
		byExternal:   map[string]DaemonSandbox{},
		tenants:      map[string]*tenant{},
		candidates:   map[string]bool{},
	}
}

func (n *node) snapshot() Snapshot {
	s := Snapshot{
		Name:           n.name,
		State:          n.state,
		Unschedulable:  n.spec.Unschedulable,
		RuntimeClasses: append([]string(nil), n.spec.Classes()...),
		BootID:         n.bootID,
		Version:        n.version,
		Capacity:       n.capacity,
		Allocated:      n.allocated,
		Pools:          make(map[PoolKey]api.NodePool, len(n.pools)),
		Since:          n.since,
	}
	if n.state != StateReady {
		s.Message = n.message
	}
	for k, p := range n.pools {
		s.Pools[k] = p
	}
	now := time.Now()
	for _, r := range n.reservations {
		if now.Before(r.expires) {
			s.Assumed = add(s.Assumed, r.req)
		}
	}
	return s
}

// expire drops the reservations past their time.
func (n *node) expire(now time.Time) {
	for k, r := range n.reservations {
		if !now.Before(r.expires) {
			delete(n.reservations, k)
		}
	}
}

// setState moves the node to s; a change of readiness marks the status to
// be written at once.
func (n *node) setState(s State, msg string) bool {
	if n.state == s && n.message == msg {
		return false
	}
	wasReady := n.state == StateReady
	if n.state != s {
		n.since = time.Now()
	}
	n.state, n.message = s, msg
	if s == StateLost {
		n.wasLost = true
	}
	n.statusDirty = true
	if wasReady != (s == StateReady) || s == StateLost || s == StateFencing {
		n.statusNow = true
	}
	return true
}

// setNode takes what the daemon reported of itself.
func (n *node) setNode(d *api.Node) {
	n.version = d.Version
	n.capacity, n.allocated = d.Capacity, d.Allocated
	n.auditHead = d.AuditHead
	n.pools = make(map[PoolKey]api.NodePool, len(d.Pools))
	for _, p := range d.Pools {
		n.pools[PoolKey{p.Tenant, p.Name}] = p
	}
	n.statusDirty = true
}

func add(a, b api.Resources) api.Resources {
	return api.Resources{CPUs: a.CPUs + b.CPUs, MemoryBytes: a.MemoryBytes + b.MemoryBytes, Sandboxes: a.Sandboxes + b.Sandboxes}
}

// sortedNodes returns the nodes in name order; t.mu held.
func (t *Tracker) sortedNodes() []*node {
	out := make([]*node, 0, len(t.nodes))
	for _, n := range t.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}
