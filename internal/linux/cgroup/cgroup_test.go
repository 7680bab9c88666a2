package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
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
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root")
	}
	h, err := Detect()
	if err != nil {
		t.Skipf("this host offers no usable cgroups: %v", err)
	}
	h.Parent = "airlock-unittest" // never under a live airlock's parent
	t.Cleanup(func() { removeParents(h) })
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
	if err := cg.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg.Dir("memory")); err == nil {
		t.Fatal("cgroup directory left")
	}
}

// removeParents deletes a test's (empty) parent directories.
func removeParents(h *Host) {
	if h.Version == V2 {
		_ = os.Remove(filepath.Join(h.V2Root, h.Parent))
		return
	}
	for _, root := range h.V1Roots {
		_ = os.Remove(filepath.Join(root, h.Parent))
	}
}
