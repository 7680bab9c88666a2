package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/wall/gvisor"
	"github.com/airlock-sandbox/airlock/internal/wall/uidlease"
)

// The processes of a gVisor sandbox, as the host sees them: every process
// of its cgroup but runsc run itself (airlock's OCI runtime, which runs no
// code of the sandbox's: it starts the Sentry and the gofer, then waits)
// is the sandbox's leased host ids, in a user namespace of its own, so
// that whatever capabilities it has are that namespace's and none is the
// host's: not the Sentry (runsc-sandbox, with its stub processes), which
// answers the sandbox's system calls, nor the gofer. The files the sandbox
// sees are owned as they are meant to be inside (root's as root's, the
// sandbox user's as its own), through the same range.
func TestGVisorSandboxRunsAsItsLeasedIDs(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	// The host's user namespace: this test's, as the daemon's.
	initNS, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	const owners = "stat -c '%n %u:%g' / /usr/bin/su /etc/passwd /tmp /workspace /workspace/given.txt $HOME"
	wantOwners := func(t *testing.T, out, home string) {
		t.Helper()
		for _, w := range []string{"/ 0:0", "/usr/bin/su 0:0", "/etc/passwd 0:0", "/tmp 0:0", "/workspace 1000:1000", "/workspace/given.txt 1000:1000", home + " 1000:1000"} {
			if !strings.Contains(out, w+"\n") {
				t.Errorf("inside, want %q:\n%s", w, out)
			}
		}
	}
	ws := func(t *testing.T) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "given.txt"), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}

	t.Run("one-shot", func(t *testing.T) {
		cmd := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", dataDir, "run", "--isolation", "gvisor", "--workspace", ws(t), "--",
			"sh", "-c", owners+"; echo ready; read x; exit 0")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errb strings.Builder
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		var out strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() && sc.Text() != "ready" {
			out.WriteString(sc.Text() + "\n")
		}
		if sc.Err() != nil || !strings.Contains(out.String(), "/tmp ") {
			t.Fatalf("the run did not get ready: %v\n%s\n%s", sc.Err(), out.String(), errb.String())
		}
		wantOwners(t, out.String(), "/home/user")
		// The run's sandbox: the one whose runsc run is this run's child.
		runsc, id := 0, ""
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			var pid int
			if _, err := fmt.Sscan(p.Name(), &pid); err != nil || ppid(pid) != cmd.Process.Pid {
				continue
			}
			args := cmdline(pid)
			if n := len(args); n > 0 && slices.Contains(args, filepath.Join(stateDir, "gvisor", "bundles", args[n-1])) {
				runsc, id = pid, args[n-1]
			}
		}
		if runsc == 0 {
			t.Fatal("no runsc run under the airlock run")
		}
		hostIDs(t, initNS, id, runsc)
		_ = stdin.Close()
		_, _ = io.Copy(io.Discard, stdout)
		if err := cmd.Wait(); err != nil {
			t.Errorf("the run: %v\n%s", err, errb.String())
		}
	})

	t.Run("long-lived with the proxy", func(t *testing.T) {
		d := startDaemon(t, newDataDir(t))
		ctx := context.Background()
		alice := d.tenant(t, "alice", api.Quotas{})
		bases := map[uint32]string{}
		for i := 0; i < 2; i++ {
			sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", Workspace: ws(t), TTL: "10m",
				Network: api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = alice.Destroy(ctx, sb.ID) }()
			out, _, end := run(t, alice, sb.ID, sh(owners+" /.airlock/bin/airlock-init"))
			if end.ExitCode != 0 {
				t.Errorf("%s: %+v", out, end)
			}
			wantOwners(t, out, "/home/user")
			if !strings.Contains(out, "/.airlock/bin/airlock-init 0:0\n") {
				t.Errorf("gvisor-init's binary is not root's inside:\n%s", out)
			}
			base := hostIDs(t, initNS, sb.ID, gvisorPid(t, sb.ID))
			if other, ok := bases[base]; ok {
				t.Errorf("sandboxes %s and %s share host ids from %d", other, sb.ID, base)
			}
			bases[base] = sb.ID
		}
	})
}

// hostIDs checks every process of gVisor sandbox id's cgroup but its
// runsc run (pid runsc): each is in a user namespace other than the
// host's (initNS), whose map gives the sandbox's root one leased range,
// and all its uids and gids are in that range, none the host's root.
// There must be a gofer and a Sentry among them. It returns the range's
// first uid.
func hostIDs(t *testing.T, initNS, id string, runsc int) uint32 {
	t.Helper()
	var base uint32
	seen := map[string]bool{}
	for _, pid := range cgroupProcsOf(gvisor.Scope(stateDir), id) {
		if pid == runsc {
			continue
		}
		name := "?"
		if args := cmdline(pid); len(args) > 0 {
			name = args[0]
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		ns, nerr := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid))
		m, merr := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
		if err != nil || nerr != nil || merr != nil {
			continue // ended meanwhile (a stub of the Sentry's)
		}
		seen[name] = true
		if ns == initNS {
			t.Errorf("%s %d is in the host's user namespace (%s): its capabilities are the host's\n%s", name, pid, ns, st)
		}
		var inside, outside, size uint32
		if _, err := fmt.Sscan(string(m), &inside, &outside, &size); err != nil || inside != 0 || size != uidlease.Size || outside < uidlease.First {
			t.Errorf("%s %d: uid map %q, want 0 → a leased range", name, pid, m)
			continue
		}
		if base == 0 {
			base = outside
		} else if outside != base {
			t.Errorf("%s %d: mapped to %d, the sandbox's others to %d", name, pid, outside, base)
		}
		for _, field := range []string{"Uid:", "Gid:"} {
			for _, v := range statusField(st, field) {
				var n uint32
				if _, err := fmt.Sscan(v, &n); err != nil || n < outside || n >= outside+size {
					t.Errorf("%s %d: %s %v, outside its range %d+%d", name, pid, field, statusField(st, field), outside, size)
					break
				}
			}
		}
	}
	if !seen["runsc-gofer"] || !seen["runsc-sandbox"] {
		t.Errorf("sandbox %s: processes %v, want its gofer and Sentry", id, seen)
	}
	return base
}

func statusField(status []byte, field string) []string {
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, field); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

func ppid(pid int) int {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	var n int
	if f := statusField(st, "PPid:"); len(f) == 1 {
		_, _ = fmt.Sscan(f[0], &n)
	}
	return n
}
