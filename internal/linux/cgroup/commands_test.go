package cgroup

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// startPlaced starts argv the way a sandbox's init starts a command: into
// the commands' cgroup through the placement's descriptors. The test's
// thread steps into the sandbox's cgroup first (where init lives on v1)
// and back out after.
func startPlaced(t *testing.T, cg *Cgroup, p *Placement, argv ...string) *exec.Cmd {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(argv[0], argv[1:]...)
	if cg.Version() == V2 {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Procs.WriteString(strconv.Itoa(cmd.Process.Pid)); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	restore, err := cg.EnterThread(unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := restore(); err != nil {
			t.Fatal(err)
		}
	}()
	for _, f := range p.Enter {
		if _, err := f.WriteString("0"); err != nil {
			t.Fatal(err)
		}
	}
	startErr := cmd.Start()
	for _, f := range p.Leave {
		if _, err := f.WriteString("0"); err != nil {
			t.Fatal(err)
		}
	}
	if startErr != nil {
		t.Fatal(startErr)
	}
	return cmd
}

// A long-lived sandbox's commands have their own cgroup, a reserve below
// the sandbox's: a command that runs out of memory is the one the kernel
// kills, a fork bomb meets the commands' pids limit, and what lives beside
// them in the sandbox's cgroup (init, the agent) is untouched; the
// sandbox's accounting counts both.
func TestCommandsCgroupConfinesTheirLimits(t *testing.T) {
	h := testHost(t)
	cg, err := h.Create("commands-test-"+strconv.Itoa(os.Getpid()), Limits{MemoryBytes: 96 << 20, CPUs: 1, Pids: 64,
		Commands: &CommandLimits{MemoryBytes: 32 << 20, Pids: 8}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, p := range cg.Procs() {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		if err := cg.Remove(); err != nil {
			t.Error(err)
		}
		if !parentGone(h) {
			t.Error("cgroup directories left")
		}
	}()
	mem, pids := "memory.max", "pids.max"
	if h.Version == V1 {
		mem = "memory.limit_in_bytes"
	}
	for file, want := range map[string]string{filepath.Join(cg.Dir("memory"), CommandsDir, mem): "33554432", filepath.Join(cg.Dir("pids"), CommandsDir, pids): "8"} {
		if b, err := os.ReadFile(file); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q, %v; want %s", file, b, err, want)
		}
	}
	p, err := cg.CommandPlacement()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// The stand-in for init: a process of the sandbox's own cgroup (v2:
	// its init leaf) that must outlive the commands' limits.
	initDir := cg.Dir("pids")
	if h.Version == V2 {
		initDir = filepath.Join(initDir, InitDir)
	}
	stay := exec.Command("sleep", "60")
	if err := stay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stay.Process.Kill(); _ = stay.Wait() }()
	for _, d := range map[string]string{"memory": cg.Dir("memory"), "pids": initDir} {
		if h.Version == V2 {
			d = initDir
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(stay.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}

	hog := startPlaced(t, cg, p, "tail", "/dev/zero")
	if err := hog.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the memory hog ended with %v, want killed", err)
	}
	// Killed at the commands' limit, not the sandbox's.
	if st := cg.Stats(); st.OOMKills < 1 || st.MemoryPeak > 64<<20 {
		t.Errorf("OOM kills %d at a peak of %d bytes; want one at the commands' 32 MiB", st.OOMKills, st.MemoryPeak)
	}
	if err := unix.Kill(stay.Process.Pid, 0); err != nil {
		t.Errorf("the process beside the commands died with them: %v", err)
	}

	// Forks beyond the commands' pids limit are refused, and counted.
	bomb := startPlaced(t, cg, p, "sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 30 & done")
	_ = bomb.Wait()
	for _, pid := range cg.Procs() {
		if pid != stay.Process.Pid {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	if st := cg.Stats(); st.PidsLimited < 1 {
		t.Errorf("no refused fork counted: %+v", st)
	}
}
