package sandbox

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// The node: what a cluster sees of this daemon (GET /v1/node) and hears
// from it (GET /v1/node/events). Allocated is the limits (CPUs, memory)
// and the number of every sandbox the daemon holds: live ones, creates in
// flight (admitted, not yet answered) and pooled ones; each is counted
// once. Every create and pool refill is held to the node's capacity
// where its tenant's quotas are checked (admit), under the same lock, so
// that no race of creates passes it.
//
// Events go to every watcher through a buffer of its own
// (nodeEventBuffer lines): the daemon never waits for a watcher, and one
// whose buffer is full is cut off, its stream ending with an error line
// after what it had been sent. sandbox.created and sandbox.ended go out
// where they happen; pool and capacity events are the differences
// between what was last sent and the state now, computed after each
// change (publishNodeChanges) and before a watcher's hello, so that no
// watcher misses a change its hello did not show. Every event, a
// watcher's heartbeats too, takes the next revision of one counter.

// nodeEventBuffer is the lines a watcher may leave unread before it is
// cut off.
const nodeEventBuffer = 4096

// nodeHub is the node's watchers and the events' revision (under its own
// lock, taken after Core.Mu when both are held).
type nodeHub struct {
	bootID string
	kick   chan struct{} // wakes publishNodeChanges
	mu     sync.Mutex
	rev    uint64
	subs   map[*NodeWatch]struct{}
	closed string     // why no watch is taken any more ("": open)
	sent   *nodeState // what the watchers were last told (nil: no watcher since)
}

func newNodeHub() *nodeHub {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &nodeHub{bootID: hex.EncodeToString(b[:]), kick: make(chan struct{}, 1), subs: map[*NodeWatch]struct{}{}}
}

// changed asks for the pool and capacity events of a change.
func (h *nodeHub) changed() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// nodeState is what pool and capacity events report.
type nodeState struct {
	alloc api.Resources
	pools []api.NodePool // by tenant, name
}

// NodeWatch is one watcher of the node's events.
type NodeWatch struct {
	hub *nodeHub
	c   chan api.NodeEvent
	err error  // why it was cut off (under hub.mu), set before c is closed
	cut uint64 // the revision of its cut
}

// Events are the watcher's events after its hello; closed when it is cut
// off (Cut says why).
func (w *NodeWatch) Events() <-chan api.NodeEvent { return w.c }

// Cut is why the watcher was cut off, once Events is closed, and the
// revision its stream's last line (which says so) takes.
func (w *NodeWatch) Cut() (uint64, error) {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	return w.cut, w.err
}

// Heartbeat queues a heartbeat among the watcher's events (it takes the
// next revision, as any event).
func (w *NodeWatch) Heartbeat() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[w]; ok {
		h.rev++
		w.send(api.NodeEvent{Rev: h.rev, Type: api.NodeEventHeartbeat})
	}
}

// Close stops the watcher.
func (w *NodeWatch) Close() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, w)
}

// send queues ev for w, or cuts w off when its buffer is full (hub.mu
// held).
func (w *NodeWatch) send(ev api.NodeEvent) {
	select {
	case w.c <- ev:
	default:
		w.cutOff(errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("node events: this watcher left %d events unread and was cut off; watch again (its hello is the node as it is then)", nodeEventBuffer)))
	}
}

// cutOff ends w for err (hub.mu held).
func (w *NodeWatch) cutOff(err error) {
	h := w.hub
	delete(h.subs, w)
	h.rev++
	w.err, w.cut = err, h.rev
	close(w.c)
}

// publish sends ev to every watcher with the next revision (hub.mu held).
func (h *nodeHub) publishLocked(ev api.NodeEvent) {
	h.rev++
	ev.Rev = h.rev
	for w := range h.subs {
		w.send(ev)
	}
}

// publishSandbox tells the watchers of a sandbox made or ended.
func (s *Service) publishSandbox(typ string, sb *api.Sandbox) {
	h := s.node
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) > 0 {
		h.publishLocked(api.NodeEvent{Type: typ, Sandbox: sb})
	}
}

// EndNodeWatches cuts every watcher off for reason and takes no more:
// the daemon is stopping.
func (s *Service) EndNodeWatches(reason string) {
	h := s.node
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = reason
	for w := range h.subs {
		w.cutOff(errdefs.Unavailable(reason))
	}
}

// Node describes the node (the admin key only).
func (s *Service) Node(t *tenant.Principal) (*api.Node, error) {
	if !t.Admin {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, "the node is described to the admin key only")
	}
	s.Mu.Lock()
	st := s.nodeStateLocked()
	s.Mu.Unlock()
	h := s.node
	h.mu.Lock()
	rev := h.rev
	h.mu.Unlock()
	return s.nodeOf(st, rev), nil
}

// WatchNode starts a watcher of the node's events (the admin key only):
// its hello, the node as it is, and the watcher, whose events follow it.
func (s *Service) WatchNode(t *tenant.Principal) (*api.NodeEvent, *NodeWatch, error) {
	if !t.Admin {
		return nil, nil, errdefs.New(errdefs.ErrPermissionDenied, "the node's events are for the admin key only")
	}
	s.Mu.Lock()
	defer s.Mu.Unlock()
	st := s.nodeStateLocked()
	h := s.node
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed != "" {
		return nil, nil, errdefs.Unavailable(h.closed)
	}
	// The watchers there hear of what changed before this hello.
	s.syncNodeLocked(st)
	w := &NodeWatch{hub: h, c: make(chan api.NodeEvent, nodeEventBuffer)}
	h.subs[w] = struct{}{}
	h.rev++
	return &api.NodeEvent{Rev: h.rev, Type: api.NodeEventHello, Node: s.nodeOf(st, h.rev)}, w, nil
}

// nodeOf is the node in state st at revision rev.
func (s *Service) nodeOf(st nodeState, rev uint64) *api.Node {
	n := s.Cfg.Node
	out := &api.Node{Name: n.Name, Version: n.Version, BootID: s.node.bootID, Capacity: n.Capacity, Allocated: st.alloc,
		Isolations: slices.Clone(n.Isolations), Pools: slices.Clone(st.pools), Rev: rev}
	if out.Isolations == nil {
		out.Isolations = []string{}
	}
	if n.AuditHead != nil {
		out.AuditHead = n.AuditHead()
	}
	return out
}

// nodeStateLocked is what the node's sandboxes hold and its pools (under
// Core.Mu).
func (s *Service) nodeStateLocked() nodeState {
	st := nodeState{alloc: s.allocatedLocked(), pools: []api.NodePool{}}
	// A sum of fractions differs in its last bits with the order it was
	// added in (a map's): reported to a millionth, it is the same sum
	// each time.
	st.alloc.CPUs = math.Round(st.alloc.CPUs*1e6) / 1e6
	for _, byName := range s.pools.by {
		for _, p := range byName {
			st.pools = append(st.pools, api.NodePool{Tenant: p.tenantName, Name: p.name, Size: p.size, Ready: len(p.idle), Filling: p.filling})
		}
	}
	slices.SortFunc(st.pools, func(a, b api.NodePool) int {
		return cmp.Or(strings.Compare(a.Tenant, b.Tenant), strings.Compare(a.Name, b.Name))
	})
	return st
}

// allocatedLocked adds up what the node's sandboxes hold (under Core.Mu):
// the live ones, the pooled ones, and the creates in flight that are
// neither yet (a create is still pending for a moment after its sandbox
// joined the live or the pooled ones).
func (s *Service) allocatedLocked() api.Resources {
	var r api.Resources
	add := func(cpus float64, mem int64) {
		r.CPUs += cpus
		r.MemoryBytes += mem
		r.Sandboxes++
	}
	for _, b := range s.Boxes {
		add(b.Spec.Limits.CPUs, b.Spec.Limits.Memory)
	}
	pooled := map[string]bool{}
	for _, byName := range s.pools.by {
		for _, p := range byName {
			for _, b := range p.idle {
				add(b.Spec.Limits.CPUs, b.Spec.Limits.Memory)
				pooled[b.Rec.ID] = true
			}
		}
	}
	for id, pc := range s.pending {
		if s.Boxes[id] == nil && !pooled[id] {
			add(pc.cpus, pc.mem)
		}
	}
	return r
}

// nodeRoom refuses k more sandboxes like sp that would take the node past
// the capacity it is held to (under Core.Mu).
func (s *Service) nodeRoom(k int, sp *spec.Spec) error {
	held := s.Cfg.Node.Held
	if held == (api.Resources{}) {
		return nil
	}
	a := s.allocatedLocked()
	these := "this one asks"
	if k > 1 {
		these = fmt.Sprintf("these %d ask", k)
	}
	refuse := ""
	switch {
	case held.Sandboxes > 0 && a.Sandboxes+k > held.Sandboxes:
		refuse = fmt.Sprintf("sandboxes: this node holds at most %d sandboxes and holds %d", held.Sandboxes, a.Sandboxes)
		if k > 1 {
			refuse += fmt.Sprintf("; %s", these)
		}
	case held.MemoryBytes > 0 && a.MemoryBytes+int64(k)*sp.Limits.Memory > held.MemoryBytes:
		refuse = fmt.Sprintf("memory: this node has %s for sandboxes; they hold %s and %s %s", spec.FormatSize(held.MemoryBytes), spec.FormatSize(a.MemoryBytes), these, spec.FormatSize(int64(k)*sp.Limits.Memory))
	case held.CPUs > 0 && a.CPUs+float64(k)*sp.Limits.CPUs > held.CPUs+1e-9:
		refuse = fmt.Sprintf("cpus: this node has %g CPUs for sandboxes; they hold %g and %s %g", held.CPUs, a.CPUs, these, float64(k)*sp.Limits.CPUs)
	}
	if refuse == "" {
		return nil
	}
	return errdefs.New(errdefs.ErrResourceExhausted, "node capacity: "+refuse)
}

// syncNodeLocked tells the watchers how state st differs from what they
// were last told — a pool event for each pool whose size, ready or filling
// count changed (size 0: removed), a capacity event when what the
// sandboxes hold changed — and keeps st as told (Core.Mu and hub.mu held).
func (s *Service) syncNodeLocked(st nodeState) {
	h := s.node
	if h.sent != nil && len(h.subs) > 0 {
		key := func(p api.NodePool) string { return p.Tenant + "/" + p.Name }
		was := map[string]api.NodePool{}
		for _, p := range h.sent.pools {
			was[key(p)] = p
		}
		for _, p := range st.pools {
			if old, ok := was[key(p)]; !ok || old != p {
				h.publishLocked(api.NodeEvent{Type: api.NodeEventPool, Pool: &p})
			}
			delete(was, key(p))
		}
		for _, k := range slices.Sorted(maps.Keys(was)) {
			gone := api.NodePool{Tenant: was[k].Tenant, Name: was[k].Name}
			h.publishLocked(api.NodeEvent{Type: api.NodeEventPool, Pool: &gone})
		}
		if st.alloc != h.sent.alloc {
			h.publishLocked(api.NodeEvent{Type: api.NodeEventCapacity, Node: s.nodeOf(st, h.rev+1)})
		}
	}
	h.sent = &st
}

// publishNodeChanges sends the pool and capacity events of every change
// (nodeHub.changed) until done is closed.
func (s *Service) publishNodeChanges(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-s.node.kick:
		}
		// No watcher can join meanwhile: WatchNode takes Core.Mu first.
		s.Mu.Lock()
		h := s.node
		h.mu.Lock()
		if len(h.subs) > 0 {
			s.syncNodeLocked(s.nodeStateLocked())
		} else {
			h.sent = nil // the next watcher's hello is the start
		}
		h.mu.Unlock()
		s.Mu.Unlock()
	}
}
