package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	v1Line = "35 25 0:30 / /sys/fs/cgroup/%s rw,relatime shared:14 - cgroup cgroup rw,%s\n"
	v2Line = "26 25 0:23 / %s rw,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
)

func mi(lines ...string) string { return strings.Join(lines, "") }

func v1(ctl string) string { return fmt.Sprintf(v1Line, ctl, ctl) }

func TestDetect(t *testing.T) {
	allV1 := mi(v1("memory"), v1("cpu,cpuacct"), v1("pids"), v1("freezer"))
	cases := []struct {
		name        string
		mountinfo   string
		controllers string
		version     Version
		wantErr     bool
	}{
		{"pure v2 with controllers", fmt.Sprintf(v2Line, "/sys/fs/cgroup"), "cpuset cpu io memory pids", V2, false},
		{"hybrid: empty v2, full v1 (this project's CI)", mi(fmt.Sprintf(v2Line, "/sys/fs/cgroup/unified"), allV1), "", V1, false},
		{"v2 lacking pids falls back to v1", mi(fmt.Sprintf(v2Line, "/sys/fs/cgroup/unified"), allV1), "cpu memory", V1, false},
		{"v1 co-mounted cpu,cpuacct", allV1, "", V1, false},
		{"v1 without freezer", mi(v1("memory"), v1("cpu,cpuacct"), v1("pids")), "", 0, true},
		{"nothing", "", "", 0, true},
	}
	for _, c := range cases {
		h, err := detect(c.mountinfo, func(string) string { return c.controllers })
		if (err != nil) != c.wantErr {
			t.Errorf("%s: err = %v", c.name, err)
			continue
		}
		if err == nil && h.Version != c.version {
			t.Errorf("%s: version %d, want %d", c.name, h.Version, c.version)
		}
	}
	h, _ := detect(allV1, func(string) string { return "" })
	if h.V1Roots["cpu"] != h.V1Roots["cpuacct"] || h.V1Roots["cpu"] == "" {
		t.Errorf("co-mounted roots: %v", h.V1Roots)
	}
}

func TestCreateLimitsAndRemove(t *testing.T) {
	h := testHost(t)
	cg, err := h.Create("unit-test-"+strconv.Itoa(os.Getpid()), Limits{MemoryBytes: 64 << 20, CPUs: 0.5, Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	mem := "memory.max"
	if h.Version == V1 {
		mem = "memory.limit_in_bytes"
	}
	b, err := os.ReadFile(cg.Dir("memory") + "/" + mem)
	if err != nil || string(b) != "67108864\n" {
		t.Errorf("%s = %q, %v", mem, b, err)
	}
	if h.Version == V1 {
		if b, err := os.ReadFile(cg.Dir("memory") + "/memory.memsw.limit_in_bytes"); err == nil && string(b) != "67108864\n" {
			t.Errorf("memory+swap limit %q: swap would be a way past --memory", b)
		}
	}
	if err := cg.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg.Dir("memory")); err == nil {
		t.Fatal("cgroup directory left")
	}
	if !parentGone(h) {
		t.Fatal("the parent directory of the last cgroup was left")
	}
}

// The parent directory stays while any sandbox's cgroup is in it, and
// goes with the last.
func TestParentGoesWithTheLastCgroup(t *testing.T) {
	h := testHost(t)
	var cgs []*Cgroup
	t.Cleanup(func() {
		for _, cg := range cgs {
			_ = cg.Remove()
		}
	})
	for _, name := range []string{"first", "last"} {
		cg, err := h.Create(name+"-"+strconv.Itoa(os.Getpid()), Limits{MemoryBytes: 64 << 20, CPUs: 0.5, Pids: 16, Commands: &CommandLimits{MemoryBytes: 32 << 20, Pids: 8}})
		if err != nil {
			t.Fatal(err)
		}
		cgs = append(cgs, cg)
	}
	if err := cgs[0].Remove(); err != nil {
		t.Fatal(err)
	}
	if parentGone(h) {
		t.Fatal("the parent directory went while a cgroup was in it")
	}
	if _, err := os.Stat(cgs[1].Dir("memory")); err != nil {
		t.Fatalf("the other cgroup went: %v", err)
	}
	if err := cgs[1].Remove(); err != nil {
		t.Fatal(err)
	}
	if !parentGone(h) {
		t.Fatal("the parent directory of the last cgroup was left")
	}
}

// testHost is this host's cgroups under a parent of this test run's own
// (never a live airlock's, nor another run's), or a skip where creating
// cgroups is impossible.
func testHost(t *testing.T) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root")
	}
	h, err := Detect()
	if err != nil {
		t.Skipf("this host offers no usable cgroups: %v", err)
	}
	h.Parent = fmt.Sprintf("airlock-unittest-%d", os.Getpid())
	return h
}

// parentGone reports whether the tests' parent directories are all gone.
func parentGone(h *Host) bool {
	roots := []string{h.V2Root}
	if h.Version == V1 {
		roots = roots[:0]
		for _, r := range h.V1Roots {
			roots = append(roots, r)
		}
	}
	for _, r := range roots {
		if _, err := os.Stat(filepath.Join(r, h.Parent)); err == nil {
			return false
		}
	}
	return true
}

// parseKey reads one key of the kernel's flat-keyed files (memory.events,
// pids.events, memory.oom_control), whatever the other lines say.
func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		in, key string
		want    int64
	}{
		{"low 0\nhigh 0\nmax 3\noom 2\noom_kill 7\noom_group_kill 0\n", "oom_kill", 7},
		{"oom_kill_disable 0\nunder_oom 0\noom_kill 12\n", "oom_kill", 12},
		{"max 5\n", "max", 5},
		{"max 5", "max", 5},
		{"maxx 5\nmax 6\n", "max", 6},
		{"", "max", 0},
		{"max\n", "max", 0},
		{"oom_kill x\n", "oom_kill", 0},
	} {
		if got := parseKey([]byte(c.in), c.key); got != c.want {
			t.Errorf("parseKey(%q, %q) = %d, want %d", c.in, c.key, got, c.want)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	f.Add([]byte("oom_kill_disable 0\nunder_oom 0\noom_kill 12\n"), "oom_kill")
	f.Fuzz(func(t *testing.T, b []byte, key string) {
		parseKey(b, key)
	})
}

// children finds airlock's own child cgroups by name and any other by
// reading the directory, so that Remove of a cgroup found leaves none
// behind.
func TestChildrenFindsEveryChild(t *testing.T) {
	h := testHost(t)
	cg, err := h.Create("children-"+strconv.Itoa(os.Getpid()), Limits{MemoryBytes: 64 << 20, CPUs: 0.5, Pids: 16, Commands: &CommandLimits{MemoryBytes: 32 << 20, Pids: 8}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.Remove() })
	dir := cg.Dir("memory")
	want := []string{filepath.Join(dir, CommandsDir)}
	if h.Version == V2 {
		want = append(want, filepath.Join(dir, InitDir))
	}
	check := func() {
		t.Helper()
		got := children(dir)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("children = %q, want %q", got, want)
		}
	}
	check()
	other := filepath.Join(dir, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	want = append(want, other)
	check()
	// Remove of a cgroup found (gc's, an adopted sandbox's) looks for
	// every child; one Create made knows its own.
	if err := h.Open(filepath.Base(cg.Dir("memory"))).Remove(); err != nil {
		t.Fatal(err)
	}
	if !parentGone(h) {
		t.Fatal("the cgroup or its parent was left")
	}
}
