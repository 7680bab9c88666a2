package controller

import (
	"maps"
	"regexp"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

func TestSplitReplicasSpreadsAndScales(t *testing.T) {
	nodes := []shareNode{{Name: "a", Fit: 100}, {Name: "b", Fit: 100}, {Name: "c", Fit: 100}}
	got, total := splitReplicas(6, nodes)
	if want := map[string]int{"a": 2, "b": 2, "c": 2}; !maps.Equal(got, want) || total != 6 {
		t.Fatalf("6 over 3 empty nodes = %v (%d), want %v", got, total, want)
	}
	// Scaling to 9 from 2/2/2 adds one to each.
	for i := range nodes {
		nodes[i].Current = got[nodes[i].Name]
	}
	got, total = splitReplicas(9, nodes)
	if want := map[string]int{"a": 3, "b": 3, "c": 3}; !maps.Equal(got, want) || total != 9 {
		t.Fatalf("9 from 2/2/2 = %v (%d), want %v", got, total, want)
	}
}

func TestSplitReplicasKeepsSharesItMay(t *testing.T) {
	// b was lost: its share moves to a and c, and a and c keep theirs.
	got, total := splitReplicas(6, []shareNode{{Name: "a", Current: 2, Fit: 100}, {Name: "c", Current: 2, Fit: 100}})
	if want := map[string]int{"a": 3, "c": 3}; !maps.Equal(got, want) || total != 6 {
		t.Fatalf("after a loss = %v (%d), want %v", got, total, want)
	}
	// A returning node with its old pool: the sum comes back to r, taken
	// from the largest shares.
	got, total = splitReplicas(6, []shareNode{{Name: "a", Current: 3, Fit: 100}, {Name: "b", Current: 2, Fit: 100}, {Name: "c", Current: 3, Fit: 100}})
	if total != 6 || got["a"]+got["c"] != 4 || got["b"] != 2 {
		t.Fatalf("with the old node back = %v (%d), want 6 with b's 2 kept", got, total)
	}
	// Scaling down to 0 empties every node.
	got, total = splitReplicas(0, []shareNode{{Name: "a", Current: 3, Fit: 100}})
	if got["a"] != 0 || total != 0 {
		t.Fatalf("scaled to 0 = %v (%d)", got, total)
	}
}

func TestSplitReplicasFillsByFreeCapacity(t *testing.T) {
	// a has the most room: it takes the most, up to ceil(6/3)+1 = 3.
	got, total := splitReplicas(6, []shareNode{{Name: "a", Fit: 10}, {Name: "b", Fit: 4}, {Name: "c", Fit: 2}})
	if total != 6 || got["a"] != 3 || got["b"]+got["c"] != 3 || got["c"] > 2 {
		t.Fatalf("= %v (%d), want a=3 and the rest on b, c within their room", got, total)
	}
}

func TestSplitReplicasCapsAtWhatNodesHold(t *testing.T) {
	// Two nodes, 200 replicas: ceil(200/2)+1 = 101 is past a daemon
	// pool's 64.
	got, total := splitReplicas(200, []shareNode{{Name: "a", Fit: 1000}, {Name: "b", Fit: 1000}})
	if total != 128 || got["a"] != 64 || got["b"] != 64 {
		t.Fatalf("= %v (%d), want 64 each", got, total)
	}
	// A node without room gets nothing.
	got, total = splitReplicas(3, []shareNode{{Name: "a", Fit: 0}, {Name: "b", Fit: 1}})
	if total != 1 || got["a"] != 0 || got["b"] != 1 {
		t.Fatalf("= %v (%d), want only b's 1", got, total)
	}
	if got, total := splitReplicas(3, nil); total != 0 || len(got) != 0 {
		t.Fatalf("no nodes = %v (%d)", got, total)
	}
}

func TestFitOnCountsFreeCapacity(t *testing.T) {
	req := api.Resources{CPUs: 0.25, MemoryBytes: 256 << 20}
	if got := fitOn(api.Resources{CPUs: 2, MemoryBytes: 4 << 30, Sandboxes: -1}, req, 0); got != 8 {
		t.Fatalf("2 CPUs free = %d, want 8 (by CPU)", got)
	}
	// The pool's 3 made entries are in allocated and counted back.
	if got := fitOn(api.Resources{CPUs: 1.25, MemoryBytes: 4 << 30, Sandboxes: -1}, req, 3); got != 8 {
		t.Fatalf("1.25 CPUs free with 3 made = %d, want 8", got)
	}
	if got := fitOn(api.Resources{CPUs: 2, MemoryBytes: 4 << 30, Sandboxes: 1}, req, 0); got != 1 {
		t.Fatalf("one sandbox slot = %d, want 1", got)
	}
	if got := fitOn(api.Resources{CPUs: 2, MemoryBytes: 300 << 20, Sandboxes: -1}, req, 0); got != 1 {
		t.Fatalf("300 MiB free = %d, want 1 (by memory)", got)
	}
	if got := fitOn(api.Resources{CPUs: -1, MemoryBytes: 4 << 30, Sandboxes: -1}, req, 0); got != 0 {
		t.Fatalf("over-allocated = %d, want 0", got)
	}
}

func TestDaemonPoolNameIsAValidPoolName(t *testing.T) {
	valid := regexp.MustCompile(`^swp-[0-9a-f]{16}$`)
	a, b := daemonPoolName("pool", "h1"), daemonPoolName("pool", "h2")
	if !valid.MatchString(a) || !valid.MatchString(b) || a == b {
		t.Fatalf("names %q %q", a, b)
	}
	if daemonPoolName("pool", "h1") != a {
		t.Fatal("the name is not stable")
	}
}
