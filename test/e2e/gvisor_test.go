package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/wall/gvisor"
)

// needRunsc returns the installed runsc (scripts/runsc.sh builds it before
// the tests). Without it the gvisor tests fail under CI=true, and are
// skipped, saying so, elsewhere.
func needRunsc(t *testing.T) gvisor.Runsc {
	t.Helper()
	r := gvisor.Check(gvisor.DefaultRunsc)
	if r.Err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("runsc: %v", r.Err)
		}
		t.Skipf("no usable runsc (run scripts/runsc.sh; under CI=true this fails): %v", r.Err)
	}
	return r
}

// gvisorResidue is what a gVisor sandbox of the suite may leave: its lock,
// bundle and runsc state under the state directory, its uid lease (in the
// pool both walls share), its cgroup, a mount, a runsc process.
func gvisorResidue() error {
	var left []string
	for _, d := range []string{"gvisor/sandboxes", "gvisor/bundles", "gvisor/runsc", "uids"} {
		ents, _ := os.ReadDir(filepath.Join(stateDir, d))
		for _, e := range ents {
			left = append(left, filepath.Join(d, e.Name()))
		}
	}
	sc := gvisor.Scope(stateDir)
	for _, ctl := range []string{"memory", "cpu", "cpuacct", "pids", "freezer", "unified", ""} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctl, sc)); err == nil {
			left = append(left, "cgroup "+filepath.Join(ctl, sc))
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), filepath.Join(stateDir, "gvisor")) {
		left = append(left, "a mount under the state directory")
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, _ := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if strings.Contains(string(b), filepath.Join(stateDir, "gvisor")) {
			left = append(left, "process "+p.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if len(left) > 0 {
		return errors.New(strings.Join(left, "; "))
	}
	return nil
}

func noGVisorResidue(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := gvisorResidue()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left behind: %v", err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The sandbox's kernel is gVisor's Sentry: uname and /proc/version are not
// the host's.
func TestGVisorRunIsNotTheHostKernel(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	host := unix.ByteSliceToString(u.Release[:])
	r := airlock(t, "", "run", "--isolation", "gvisor", "--", "sh", "-c", "uname -r; cat /proc/version")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || lines[0] == host || strings.Contains(lines[1], host) {
		t.Errorf("the sandbox sees the host's kernel %s:\n%s", host, r)
	}
	// The same command on the container wall sees the host's.
	if c := airlock(t, "", "run", "--", "uname", "-r"); strings.TrimSpace(c.stdout) != host {
		t.Errorf("container wall: %s", c)
	}
}

// Exit codes pass through; what the command writes in /workspace is in
// --diff and never in the host's directory; the run's record names the
// wall and runsc's version.
func TestGVisorRunExitCodeDiffAndRecord(t *testing.T) {
	rs := needRunsc(t)
	defer noGVisorResidue(t)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "given.txt"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "run.audit")
	r := airlock(t, "", "run", "--isolation", "gvisor", "--audit", logFile, "--workspace", ws, "--diff", "--",
		"sh", "-c", "echo two >> given.txt && echo new > made.txt && echo out && echo err >&2; exit 7")
	if r.code != 7 || !strings.HasPrefix(r.stdout, "out\n") || !strings.Contains(r.stderr, "err") {
		t.Fatalf("%s", r)
	}
	for _, want := range []string{"+++ b/made.txt", "+new", "+two"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--diff lacks %q:\n%s", want, r)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "given.txt")); string(b) != "one\n" {
		t.Errorf("the host's file was written: %q", b)
	}
	if _, err := os.Stat(filepath.Join(ws, "made.txt")); err == nil {
		t.Error("the sandbox's file reached the host's directory")
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`"controls":{"wall":"gvisor","runsc":%q`, rs.Version); !strings.Contains(string(b), want) {
		t.Errorf("sandbox.created lacks %s:\n%s", want, b)
	}
	for _, c := range []struct {
		argv []string
		code int
	}{{[]string{"true"}, 0}, {[]string{"sh", "-c", "exit 42"}, 42}, {[]string{"sh", "-c", "kill -TERM $$"}, 128 + 15}} {
		if r := airlock(t, "", append([]string{"run", "--isolation", "gvisor", "--"}, c.argv...)...); r.code != c.code {
			t.Errorf("%v: want %d, %s", c.argv, c.code, r)
		}
	}
}

// The memory limit is the cgroup's around runsc: past it the sandbox is
// killed, 137, and the run says so.
func TestGVisorRunOOMIs137(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	r := airlock(t, "", "run", "--isolation", "gvisor", "--memory", "96M", "--json", "--",
		"python3", "-c", "x = []\nwhile True: x.append(bytearray(1 << 20))")
	if r.code != 137 || !strings.Contains(strings.ToLower(r.stdout+r.stderr), "memory") {
		t.Fatalf("%s", r)
	}
}

// A missing or wrong runsc fails a gvisor run with a clear error, and the
// command never runs on the container wall instead.
func TestGVisorWithoutRunscRefusesAndNeverFallsBack(t *testing.T) {
	defer noGVisorResidue(t)
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'runsc version v0.0.0-not-the-pin'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(t.TempDir(), "absent"), fake} {
		r := airlock(t, "", "--runsc", path, "run", "--isolation", "gvisor", "--", "sh", "-c", "echo RAN")
		if r.code != 125 || strings.Contains(r.stdout, "RAN") || !strings.Contains(r.stderr, "--isolation gvisor needs runsc") {
			t.Errorf("runsc %s: %s", path, r)
		}
	}
	if r := airlock(t, "", "--runsc", fake, "doctor"); !strings.Contains(r.stdout, "gvisor") || !strings.Contains(r.stdout, "not-the-pin") {
		t.Errorf("doctor: %s", r)
	}
}

// A runsc remembered as checked (the state directory keeps the identity
// of the one last found at the pinned version, so that a create need not
// run it) is checked again once it is replaced or written: a wrong one
// then fails the run as if never seen.
func TestGVisorRunscChangedSinceItsCheckIsCheckedAgain(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	dir := t.TempDir()
	runsc := filepath.Join(dir, "runsc")
	copyRunsc := func() {
		b, err := os.ReadFile(gvisor.DefaultRunsc)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(runsc+".new", b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(runsc+".new", runsc); err != nil {
			t.Fatal(err)
		}
	}
	ran := func() {
		t.Helper()
		if r := airlock(t, "", "--runsc", runsc, "run", "--isolation", "gvisor", "--", "sh", "-c", "echo RAN"); r.code != 0 || !strings.Contains(r.stdout, "RAN") {
			t.Fatalf("pinned runsc: %s", r)
		}
	}
	refused := func(how string) {
		t.Helper()
		r := airlock(t, "", "--runsc", runsc, "run", "--isolation", "gvisor", "--", "sh", "-c", "echo RAN")
		if r.code != 125 || strings.Contains(r.stdout, "RAN") || !strings.Contains(r.stderr, "--isolation gvisor needs runsc") || !strings.Contains(r.stderr, "not-the-pin") {
			t.Errorf("runsc %s after its check: %s", how, r)
		}
	}
	wrong := []byte("#!/bin/sh\necho 'runsc version v0.0.0-not-the-pin'\n")
	copyRunsc()
	ran()
	ran() // remembered
	// Replaced: another file renamed over it.
	if err := os.WriteFile(runsc+".new", wrong, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(runsc+".new", runsc); err != nil {
		t.Fatal(err)
	}
	refused("replaced")
	// Written in place.
	copyRunsc()
	ran()
	if err := os.WriteFile(runsc, wrong, 0o755); err != nil {
		t.Fatal(err)
	}
	refused("written in place")
}

// The agent's socket is the only host socket a gVisor sandbox has to do
// with: a host socket in the sandbox's own workspace is not reachable from
// inside (runsc's --host-uds=create binds, never connects), and the
// sandbox user's commands cannot reach the agent's. A root command can (the
// socket keeps its name inside, which a memory checkpoint's restore needs):
// the agent runs as root inside with a root command's capabilities, so it
// gives such a command nothing it lacks, and the host reaches the agent
// through its own link to the socket, which no command can replace.
func TestGVisorSandboxReachesNoHostSocket(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	ws := workspace(t)
	ln, err := net.Listen("unix", filepath.Join(ws, "host.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("REACHED\n"))
			c.Close()
		}
	}()
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", Workspace: ws, TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, sb.ID) }()
	// The host reaches its own socket.
	if c, err := net.Dial("unix", filepath.Join(ws, "host.sock")); err != nil {
		t.Fatal(err)
	} else {
		c.Close()
	}
	script := `import socket, sys
for p in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p); print(p, "REACHED", s.recv(16))
    except OSError as e:
        print(p, "refused", e.errno)`
	out, errOut, end := run(t, alice, sb.ID, &api.Exec{Cmd: []string{"python3", "-c", script, "/workspace/host.sock", "/.airlock/agent/agent.sock"}})
	if end.ExitCode != 0 || strings.Contains(out, "REACHED") || strings.Count(out, "refused") != 2 {
		t.Errorf("the sandbox user: %q %q %+v", out, errOut, end)
	}
	out, errOut, end = run(t, alice, sb.ID, &api.Exec{User: "root", Cmd: []string{"python3", "-c", script, "/workspace/host.sock"}})
	if end.ExitCode != 0 || strings.Contains(out, "REACHED") || !strings.Contains(out, "refused") {
		t.Errorf("root: %q %q %+v", out, errOut, end)
	}
}

// Through the daemon: the API takes and echoes isolation, and refuses a
// wall it has none of.
func TestGVisorServeIsolationIsValidated(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	_, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "vm", TTL: "5m"})
	wantCode(t, "isolation vm", err, api.CodeInvalidArgument)
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, sb.ID) }()
	got, err := alice.Sandbox(ctx, sb.ID)
	if err != nil || sb.Isolation != "container" || got.Isolation != "container" {
		t.Errorf("isolation: created %q, got %+v (%v)", sb.Isolation, got, err)
	}
}

// After kill -9 of the daemon, the next one adopts a live gVisor sandbox
// (its files, /tmp and workspace changes, exec), destroys one whose runsc
// died meanwhile and one whose record names another pid, and leaves
// nothing of them.
func TestGVisorServeRestartAdopts(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	data := newDataDir(t)
	d := startDaemon(t, data)
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "alice", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	alice := d.client(t, tn.Key)
	mk := func() string {
		sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", Workspace: workspace(t), TTL: "10m"})
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID
	}
	keep, lost, stray := mk(), mk(), mk()
	if err := alice.WriteFile(ctx, keep, "/tmp/state", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, alice, keep, sh("echo changed > /workspace/made.txt"))
	d.kill9()
	// While no daemon runs, one sandbox's runsc dies, and another's record
	// names a pid of its cgroup that is not its runsc run (its Sentry, say).
	_ = unix.Kill(gvisorPid(t, lost), unix.SIGKILL)
	other := 0
	for _, p := range cgroupProcsOf(gvisor.Scope(stateDir), stray) {
		if p != gvisorPid(t, stray) {
			other = p
		}
	}
	db, err := store.Open(filepath.Join(data, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := db.Sandboxes(ctx, api.StateRunning)
	for _, r := range recs {
		if r.ID == stray {
			r.InitPid = other
			if err := db.PutSandbox(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	db.Close()
	d2 := startDaemon(t, data)
	c := d2.client(t, tn.Key)
	if b, err := c.ReadFile(ctx, keep, "/tmp/state"); err != nil || string(b) != "kept" {
		t.Fatalf("adopted sandbox lost its state: %q %v", b, err)
	}
	if o, _, end := run(t, c, keep, sh("echo after; cat /workspace/made.txt")); o != "after\nchanged\n" || end.ExitCode != 0 {
		t.Errorf("exec after restart: %q %+v", o, end)
	}
	if diff, err := c.Diff(ctx, keep); err != nil || !strings.Contains(diff, "+changed") {
		t.Errorf("diff after restart: %v\n%s", err, diff)
	}
	for id, why := range map[string]string{lost: "not adopted", stray: "not its runsc run"} {
		got, err := c.Sandbox(ctx, id)
		if err != nil || got.State != api.StateEnded || !strings.Contains(got.EndReason, why) {
			t.Errorf("%s: %+v %v", why, got, err)
		}
	}
	if err := c.Destroy(ctx, keep); err != nil {
		t.Fatal(err)
	}
}

// cgroupProcsOf lists the processes of sandbox id's cgroup under scope.
func cgroupProcsOf(scope, id string) []int {
	for _, ctl := range []string{"pids", ""} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctl, scope, id, "cgroup.procs"))
		if err != nil {
			continue
		}
		var out []int
		for _, f := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil {
				out = append(out, pid)
			}
		}
		return out
	}
	return nil
}

// gvisorPid is the host pid of gVisor sandbox id's runsc run: the process
// of its cgroup whose command line ends in "run --bundle ... id".
func gvisorPid(t *testing.T, id string) int {
	t.Helper()
	for _, pid := range cgroupProcsOf(gvisor.Scope(stateDir), id) {
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.HasSuffix(string(cl), "\x00run\x00--bundle\x00"+filepath.Join(stateDir, "gvisor", "bundles", id)+"\x00"+id+"\x00") {
			return pid
		}
	}
	t.Fatalf("no runsc run for %s", id)
	return 0
}

// A tenant held to gvisor (airlock tenant update --isolation gvisor) has a
// create asking for less refused, by name, with a sandbox.refused record;
// its gvisor creates go on; --isolation container lifts the hold.
func TestGVisorTenantHoldRefusesLess(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	admin := d.adminKey(t)
	if r := cliAs(t, d, admin, nil, nil, "tenant", "update", "alice", "--isolation", "gvisor"); r.code != 0 || !strings.Contains(r.stderr, "isolation gvisor") {
		t.Fatalf("tenant update: %s", r)
	}
	if r := cliAs(t, d, admin, nil, nil, "tenant", "ls"); !strings.Contains(r.stdout, "gvisor") {
		t.Errorf("tenant ls: %s", r)
	}
	_, err := alice.CreateSandbox(ctx, &api.CreateSandbox{TTL: "5m"})
	wantCode(t, "a container create of a tenant held to gvisor", err, api.CodePermissionDenied)
	if err == nil || !strings.Contains(err.Error(), "held to --isolation gvisor") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	recs, err := alice.Audit(ctx, "", "sandbox.refused")
	if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Data), `"isolation":"container","required":"gvisor"`) {
		t.Errorf("sandbox.refused: %+v %v", recs, err)
	}
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.admin.UpdateTenant(ctx, "alice", &api.UpdateTenant{Isolation: "container"}); err != nil {
		t.Fatal(err)
	}
	sb, err = alice.CreateSandbox(ctx, &api.CreateSandbox{TTL: "5m"})
	if err != nil {
		t.Fatalf("after the lift: %v", err)
	}
	_ = alice.Destroy(ctx, sb.ID)
}
