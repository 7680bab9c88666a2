package nodes

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/api"
)

// assumeTTL is how long a reservation holds when its node never reports the
// sandbox (a create that failed unseen, or a replayed create the node had
// counted already).
const assumeTTL = 30 * time.Second

// Request asks Place for a node.
type Request struct {
	// Key is the external id the create will carry (the object's UID): the
	// reservation ends when the node reports a sandbox of this id. A new
	// Place with the same Key replaces its earlier reservation.
	Key          string
	RuntimeClass string
	CPUs         float64
	MemoryBytes  int64
	// Exclude names nodes not to choose (tried already).
	Exclude []string
	// Waiter, when set and no node fits, is sent again (see Wait) when
	// capacity frees.
	Waiter client.Object
}

// Reservation is a request assumed on a node until the node reports it.
type Reservation struct {
	Node string
	t    *Tracker
	key  string
	res  *reservation
}

type reservation struct {
	req     api.Resources
	expires time.Time
}

// Release gives the reservation up (the create failed or was abandoned).
func (r *Reservation) Release() {
	r.t.mu.Lock()
	defer r.t.mu.Unlock()
	if n := r.t.nodes[r.Node]; n != nil && n.reservations[r.key] == r.res {
		delete(n.reservations, r.key)
		r.t.wakeLocked()
	}
}

// UnschedulableError is Place's answer when no node fits; its message says
// why, per node.
type UnschedulableError struct{ Message string }

func (e *UnschedulableError) Error() string { return e.Message }

// Place chooses a node for req among the Ready, schedulable nodes serving
// its runtime class that have room for it (capacity less allocated less
// reserved), preferring the least allocated (or, for a retry of the same
// Key, the node of its earlier reservation), and reserves req there. With
// no such node it answers an *UnschedulableError and remembers req.Waiter.
func (t *Tracker) Place(req Request) (*Reservation, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	want := api.Resources{CPUs: req.CPUs, MemoryBytes: req.MemoryBytes, Sandboxes: 1}
	reasons := map[string]int{}
	var best []*node
	fits := map[*node]bool{}
	bestScore := 0.0
	nodes := t.sortedNodes()
	var prev *node
	for _, n := range nodes {
		n.expire(now)
		if _, ok := n.reservations[req.Key]; ok && req.Key != "" {
			// a retry of the same object: its earlier reservation is
			// not counted against it, and its node is kept if it fits
			// (its create may have been made there).
			delete(n.reservations, req.Key)
			prev = n
		}
		s := n.snapshot()
		var why []string
		switch {
		case contains(req.Exclude, n.name):
			why = append(why, "tried already")
		case s.State != StateReady:
			why = append(why, "not ready")
		case s.Unschedulable:
			why = append(why, "unschedulable")
		case !s.Serves(req.RuntimeClass):
			why = append(why, fmt.Sprintf("runtime class %q not served", req.RuntimeClass))
		default:
			free := s.Free()
			if free.CPUs+1e-9 < want.CPUs {
				why = append(why, "insufficient cpu")
			}
			if free.MemoryBytes < want.MemoryBytes {
				why = append(why, "insufficient memory")
			}
			if free.Sandboxes == 0 {
				why = append(why, "too many sandboxes")
			}
		}
		if len(why) > 0 {
			for _, w := range why {
				reasons[w]++
			}
			continue
		}
		fits[n] = true
		sc := score(&s, want)
		switch {
		case len(best) == 0 || sc < bestScore-1e-9:
			best, bestScore = []*node{n}, sc
		case sc <= bestScore+1e-9:
			best = append(best, n)
		}
	}
	if len(best) == 0 {
		if req.Waiter != nil {
			t.waiters[waiterKey{kindOf(req.Waiter), client.ObjectKeyFromObject(req.Waiter)}] = req.Waiter
		}
		return nil, &UnschedulableError{Message: unschedulable(len(nodes), reasons)}
	}
	n := best[rand.IntN(len(best))]
	if prev != nil && fits[prev] {
		n = prev
	}
	r := &reservation{req: want, expires: now.Add(assumeTTL)}
	key := req.Key
	if key == "" {
		key = fmt.Sprintf("anon-%p", r)
	}
	n.reservations[key] = r
	return &Reservation{Node: n.name, t: t, key: key, res: r}, nil
}

// expireReservations drops the reservations past their time, and sends
// the waiters again if any was.
func (t *Tracker) expireReservations() {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	expired := false
	for _, n := range t.nodes {
		before := len(n.reservations)
		n.expire(now)
		expired = expired || len(n.reservations) < before
	}
	if expired {
		t.wakeLocked()
	}
}

// score is how allocated the node would be with want on it: the mean of its
// CPU and memory fractions (lower is better).
func score(s *Snapshot, want api.Resources) float64 {
	frac := func(used, c float64) float64 {
		if c <= 0 {
			return 1
		}
		return used / c
	}
	cpu := frac(s.Allocated.CPUs+s.Assumed.CPUs+want.CPUs, s.Capacity.CPUs)
	mem := frac(float64(s.Allocated.MemoryBytes+s.Assumed.MemoryBytes+want.MemoryBytes), float64(s.Capacity.MemoryBytes))
	return (cpu + mem) / 2
}

func unschedulable(total int, reasons map[string]int) string {
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if reasons[keys[i]] != reasons[keys[j]] {
			return reasons[keys[i]] > reasons[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", reasons[k], k)
	}
	msg := fmt.Sprintf("0/%d airlock nodes are available", total)
	if len(parts) > 0 {
		msg += ": " + strings.Join(parts, ", ")
	}
	return msg
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
