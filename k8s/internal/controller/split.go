package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"sort"

	"github.com/airlock-sandbox/airlock/api"
)

// maxDaemonPoolSize is the most sandboxes one daemon pool holds
// (docs/api.md, PUT /v1/pools/{name}: size 1–64).
const maxDaemonPoolSize = 64

// daemonPoolName is the name of a SandboxWarmPool's pool on every node
// (in the tenant named as the warm pool's namespace): "swp-" and 16 hex
// digits of sha256(pool name + "/" + blueprint hash). A new template
// makes a new name, so a pool of the old spec is never taken by a claim
// of the new one. Daemon pool names are 1–63 of a-z0-9_-.
func daemonPoolName(pool, blueprintHash string) string {
	sum := sha256.Sum256([]byte(pool + "/" + blueprintHash))
	return "swp-" + hex.EncodeToString(sum[:])[:16]
}

// shareNode is one node a warm pool may hold entries on, as the split
// sees it.
type shareNode struct {
	Name string
	// Current is the size of the pool's daemon pool there now (0: none).
	Current int
	// Fit is how many of the pool's entries the node can hold: those it
	// holds now and those its free capacity takes.
	Fit int
}

// fitOn is how many entries of request req a node can hold: the whole
// entries its free capacity takes (free: capacity less allocated and
// assumed, Sandboxes < 0 meaning no cap), by CPU, memory and sandbox
// slots, and the made entries of the pool (ready and filling), which
// its allocation already counts.
func fitOn(free, req api.Resources, made int) int {
	n := math.MaxInt32
	if req.CPUs > 0 {
		n = min(n, int(math.Floor(free.CPUs/req.CPUs+1e-9)))
	}
	if req.MemoryBytes > 0 {
		n = min(n, int(free.MemoryBytes/req.MemoryBytes))
	}
	if free.Sandboxes >= 0 {
		n = min(n, free.Sandboxes)
	}
	return max(n, 0) + made
}

// splitReplicas shares r entries over nodes: each node at most
// min(Fit, ceil(r/N)+1, 64), the shares the nodes hold now kept where they
// may be (so a rescale or a lost node moves only what it must), then the
// rest water-filled: each next entry to the node with the most room left
// (Fit - share), ties to the smaller share, then the name. It returns the
// share of each node (0 for a node that gets none) and their sum, which
// is less than r when the nodes cannot hold r.
func splitReplicas(r int, nodes []shareNode) (map[string]int, int) {
	share := make(map[string]int, len(nodes))
	if len(nodes) == 0 || r <= 0 {
		for _, n := range nodes {
			share[n.Name] = 0
		}
		return share, 0
	}
	per := (r+len(nodes)-1)/len(nodes) + 1
	limit := make(map[string]int, len(nodes))
	total := 0
	for _, n := range nodes {
		limit[n.Name] = max(0, min(n.Fit, per, maxDaemonPoolSize))
		share[n.Name] = min(n.Current, limit[n.Name])
		total += share[n.Name]
	}
	order := make([]shareNode, len(nodes))
	copy(order, nodes)
	// Too many: take from the largest shares, the fullest node first.
	for total > r {
		sort.Slice(order, func(i, j int) bool {
			a, b := order[i], order[j]
			if share[a.Name] != share[b.Name] {
				return share[a.Name] > share[b.Name]
			}
			if ra, rb := a.Fit-share[a.Name], b.Fit-share[b.Name]; ra != rb {
				return ra < rb
			}
			return a.Name < b.Name
		})
		share[order[0].Name]--
		total--
	}
	// Too few: water-fill by the room left.
	for total < r {
		best := -1
		for i, n := range order {
			if share[n.Name] >= limit[n.Name] {
				continue
			}
			if best < 0 {
				best = i
				continue
			}
			b := order[best]
			ra, rb := n.Fit-share[n.Name], b.Fit-share[b.Name]
			switch {
			case ra != rb:
				if ra > rb {
					best = i
				}
			case share[n.Name] != share[b.Name]:
				if share[n.Name] < share[b.Name] {
					best = i
				}
			case n.Name < b.Name:
				best = i
			}
		}
		if best < 0 {
			break
		}
		share[order[best].Name]++
		total++
	}
	return share, total
}
