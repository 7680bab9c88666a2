package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestRunEcho(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := w.run(t, "--", "echo", "hello")
		if r.code != 0 || r.stdout != "hello\n" {
			t.Fatalf("%s", r)
		}
	})
}

func TestStdinRelayed(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := airlock(t, "from the host\n", append(append([]string{"run"}, w.flags...), "--", "cat")...)
		if r.code != 0 || r.stdout != "from the host\n" {
			t.Fatalf("%s", r)
		}
	})
}

func TestExitStatus(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		for _, c := range []struct {
			name string
			args []string
			code int
			err  string
		}{
			{"own code", []string{"--", "sh", "-c", "exit 3"}, 3, ""},
			{"signal", []string{"--", "sh", "-c", "kill -TERM $$"}, 128 + 15, ""},
			{"not found", []string{"--", "no-such-command"}, 127, "command not found"},
			{"not executable", []string{"--", "/etc/passwd"}, 126, ""},
			{"missing image", []string{"--image", "/nonexistent", "--", "true"}, 125, "airlock:"},
			{"bad flag", []string{"--no-such-flag", "--", "true"}, 125, "unknown flag"},
			{"bad size", []string{"--memory", "lots", "--", "true"}, 125, "--memory"},
			{"no command", nil, 125, "no command"},
			{"degrade seccomp", []string{"--allow-degraded", "seccomp", "--", "true"}, 125, "no opt-out"},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := w.run(t, c.args...)
				if r.code != c.code || !strings.Contains(r.stderr, c.err) {
					t.Fatalf("want exit %d with %q; got %s", c.code, c.err, r)
				}
				if c.code == 125 && strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
					t.Errorf("refusal should be one line: %q", r.stderr)
				}
			})
		}
	})
}

func TestEnvironmentIsMinimal(t *testing.T) {
	t.Setenv("HOST_SECRET_TOKEN", "s3cr3t")
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := w.run(t, "-e", "FOO=bar", "--", "env")
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		var keys []string
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			k, _, _ := strings.Cut(l, "=")
			keys = append(keys, k)
		}
		want := "FOO HOME LANG PATH TERM"
		if got := strings.Join(sorted(keys), " "); got != want {
			t.Fatalf("environment keys %q, want %q", got, want)
		}
		if strings.Contains(r.stdout, "s3cr3t") {
			t.Fatal("host environment leaked")
		}
	})
}

func sorted(s []string) []string {
	out := append([]string{}, s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestIdentityAndPID1(t *testing.T) {
	noCaps := []string{"CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "CapPrm:\t0000000000000000", "CapInh:\t0000000000000000"}
	type want struct {
		pid1  string   // PID 1's command line
		lines []string // of /proc/self/status, and NNP=prctl(PR_GET_NO_NEW_PRIVS)
	}
	expect := map[string]want{
		"container": {"airlock-init init", append(noCaps, "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2", "NNP=1")},
		// gVisor has no init of ours: PID 1 is the command (sh) itself,
		// and the Sentry, outside, is what init is on the container
		// wall. Its /proc/self/status has no NoNewPrivs and no CapAmb
		// line, and shows "Seccomp: 0": the sandbox's system calls go to
		// the Sentry, not through a host filter of the process's own (the
		// Sentry itself runs under runsc's, see
		// TestHostKernelPrimitivesNeverReachTheHost); no_new_privs is
		// asked of the Sentry's kernel with prctl instead.
		"gvisor": {"sh -c " + identityScript, append(noCaps, "NNP=1")},
	}
	forEachWall(t, func(t *testing.T, w wallCase) {
		c := expect[w.name]
		r := w.run(t, "--", "sh", "-c", identityScript)
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		lines := strings.Split(r.stdout, "\n")
		if lines[0] != "1000" {
			t.Errorf("uid %q, want 1000", lines[0])
		}
		if c.pid1 == "" || strings.TrimSpace(lines[1]) != c.pid1 {
			t.Errorf("PID 1 is %q, want %q", lines[1], c.pid1)
		}
		for _, want := range c.lines {
			if !strings.Contains(r.stdout, want+"\n") {
				t.Errorf("missing %q in\n%s", want, r.stdout)
			}
		}
	})
}

const identityScript = `id -u; cat /proc/1/cmdline | tr '\0' ' '; echo; cat /proc/self/status | grep -E '^(CapEff|CapBnd|CapPrm|CapInh|CapAmb|NoNewPrivs|Seccomp):'; python3 -c 'import ctypes; print("NNP=%d" % ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'`

// Every attack of the helper fails on every wall, as the user and as root
// inside: nothing of the host or of another sandbox can be read, written,
// signalled or reached. Where the gVisor wall answers otherwise than the
// container wall, the findings it may print are listed with why they are
// still safe; any other finding fails.
func TestAttacksFail(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("do not read"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := attackCases(secret)
	forEachWall(t, func(t *testing.T, w wallCase) {
		for _, user := range []string{"user", "root"} {
			for _, c := range cases {
				var allowed []string
				if w.name == "gvisor" {
					allowed = c.gvisor
				}
				t.Run(user+"/"+c.args[0], func(t *testing.T) { attackOn(t, w, []string{"--user", user}, allowed, c.args...) })
			}
		}
		// For root inside, setuid-root is nothing new; for the user it
		// must not raise privileges (nosuid mounts and no_new_privs).
		t.Run("user/setuid", func(t *testing.T) { attackOn(t, w, nil, nil, "setuid") })
	})
}

func TestLandlockConfinesWrites(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		var allowed []string
		if w.name == "gvisor" {
			// Landlock does not exist inside gVisor. /proc is the
			// Sentry's: the write renames a task of the Sentry, no host
			// process; the host files Landlock guards on the container
			// wall are not in the sandbox's view (TestAttacksFail's
			// write-outside and read-host hold without it).
			allowed = []string{"write /proc/self/comm succeeded"}
		}
		// On the container wall, /proc is writable as far as the mounts
		// go; only Landlock refuses.
		attackOn(t, w, nil, allowed, "landlock")
	})
}

func TestForeignABIKilled(t *testing.T) {
	// Some hypervisors' guests fault on int 0x80 outright (SIGSEGV, even
	// outside any sandbox): there is no i386 gate for the filter to close.
	host := exec.Command(attackBin, "int80")
	if out, _ := host.CombinedOutput(); !strings.Contains(string(out), "VULNERABLE") {
		t.Skipf("this kernel does not deliver i386 system calls (int 0x80 outside a sandbox: %s)", strings.SplitN(string(out), "\n", 2)[0])
	}
	forEachWall(t, func(t *testing.T, w wallCase) {
		switch w.name {
		case "container":
			r := w.run(t, "--workspace", workspace(t), "--", "/workspace/attack", "int80")
			if r.code != 128+31 || strings.Contains(r.stdout, "VULNERABLE") {
				t.Fatalf("an i386 syscall must kill the process with SIGSYS (exit 159): %s", r)
			}
		case "gvisor":
			// The Sentry has no i386 ABI: the gate answers ENOSYS (the
			// host kernel would have answered getpid with a pid).
			r := attackOn(t, w, nil, nil, "int80")
			if !strings.Contains(r.stdout, "blocked: i386 syscall answered ENOSYS") {
				t.Fatalf("%s", r)
			}
		}
	})
}

func TestTIOCSTIDenied(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		attackOn(t, w, []string{"-t"}, nil, "tiocsti")
	})
}

func TestRootInsideIsConfined(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := w.run(t, "--user", "root", "--", "sh", "-c", "id -u; grep CapEff /proc/self/status; cat /proc/self/uid_map")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "0\n") {
			t.Fatalf("%s", r)
		}
		f := strings.Fields(strings.Split(r.stdout, "\n")[2])
		switch w.name {
		case "container":
			// root inside maps to an unprivileged host uid.
			if len(f) != 3 || f[0] != "0" || f[1] == "0" {
				t.Fatalf("uid_map %q: root inside must not be host root", f)
			}
		case "gvisor":
			// The uid map is the Sentry's own user namespace: its root
			// is no host identity, the sandbox's processes are tasks of
			// the Sentry, not host processes (TestAttacksFail, and
			// TestHostKernelPrimitivesNeverReachTheHost for the system
			// calls).
			if strings.Join(f, " ") != "0 0 4294967295" {
				t.Fatalf("uid_map %q: want the Sentry's identity map", f)
			}
		}
		if strings.Contains(r.stdout, "CapEff:\t000001ffffffffff") {
			t.Fatal("root inside has every capability")
		}
	})
}

func TestReadOnlyRootAndWritablePaths(t *testing.T) {
	expect := map[string]struct {
		readOnly string // the error of a write to /usr or /etc
		suid     string // the mounts without nosuid
		dev      string // what /dev holds
	}{
		"container": {readOnly: "Read-only file system", dev: "core fd full null ptmx pts random shm stderr stdin stdout tty urandom zero"},
		"gvisor": {
			// The user is refused by the files' modes before the
			// mount's flag is reached (root is refused by the flag,
			// TestAttacksFail's write-outside).
			readOnly: "Permission denied",
			// The root (the generated layer: passwd, group, mount
			// points), the Sentry's /proc and its devpts: setuid binaries
			// can come from none of them (the image's trees are nosuid),
			// and no_new_privs holds (TestIdentityAndPID1).
			suid: "none / none /proc none /dev/pts",
			// The Sentry's devices: fuse and net/tun are its own
			// implementations, no host device.
			dev: "fd full fuse net null ptmx pts random shm stderr stdin stdout tty urandom zero",
		},
	}
	forEachWall(t, func(t *testing.T, w wallCase) {
		want := expect[w.name]
		r := w.run(t, "--", "sh", "-c", "for d in /workspace /tmp /dev/shm $HOME; do touch $d/f && echo ok $d; done; touch /usr/f 2>&1; touch /etc/f 2>&1; true")
		for _, d := range []string{"ok /workspace", "ok /tmp", "ok /dev/shm", "ok /home/user"} {
			if !strings.Contains(r.stdout, d) {
				t.Errorf("missing %q: %s", d, r)
			}
		}
		if want.readOnly == "" || strings.Count(r.stdout, want.readOnly) != 2 {
			t.Errorf("/usr and /etc must be read-only: %s", r)
		}
		r = w.run(t, "--", "sh", "-c", "grep -v nosuid /proc/self/mounts | grep -v -E ' /dev/(null|zero|full|random|urandom|tty) ' | cut -d' ' -f1,2 | tr '\\n' ' '")
		if got := strings.TrimSpace(r.stdout); got != want.suid {
			t.Errorf("mounts without nosuid (other than device nodes): %q, want %q", got, want.suid)
		}
		r = w.run(t, "--", "sh", "-c", "ls /dev | tr '\\n' ' '")
		if got := strings.TrimSpace(r.stdout); got != want.dev {
			t.Errorf("/dev holds %q", got)
		}
	})
}

func TestWritableRootfs(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := w.run(t, "--writable-rootfs", "--user", "root", "--", "sh", "-c", "echo x > /usr/local/airlock-test && cat /usr/local/airlock-test && echo y > /etc/new && cat /etc/new")
		if r.code != 0 || r.stdout != "x\ny\n" {
			t.Fatalf("%s", r)
		}
		if _, err := os.Stat("/usr/local/airlock-test"); err == nil {
			t.Fatal("--writable-rootfs wrote to the host's /usr")
		}
	})
}

func TestImageOwnershipKept(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := w.run(t, "--", "stat", "-c", "%u:%g", "/usr/bin/env", "/etc/passwd")
		if r.code != 0 || r.stdout != "0:0\n0:0\n" {
			t.Fatalf("host image files must stay root-owned inside: %s", r)
		}
	})
}

func TestMaskedProc(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		for _, user := range []string{"user", "root"} {
			r := w.run(t, "--user", user, "--", "sh", "-c", "for f in kallsyms timer_list kcore; do test -e /proc/$f && echo $f $(wc -c < /proc/$f); done; echo c > /proc/sysrq-trigger && echo TRIGGERED; ls /proc/acpi 2>/dev/null | wc -l; true")
			want := "kallsyms 0\ntimer_list 0\n0\n"
			if w.name == "gvisor" {
				// The Sentry's /proc has none of the host kernel's
				// symbols, timers or memory: the entries do not exist.
				want = "0\n"
			}
			if r.stdout != want || strings.Contains(r.stdout, "TRIGGERED") {
				t.Errorf("%s: masked /proc entries must read empty or be absent, and refuse writes: want %q, %s", user, want, r)
			}
		}
	})
}

// Regression: Landlock's REFER right was not granted, so every rename or
// hard link across directories failed with EXDEV (dpkg, git and pip broke).
func TestRenameAcrossDirectories(t *testing.T) {
	script := `set -e; for d in /workspace /tmp $HOME; do mkdir -p $d/a $d/b; echo x > $d/a/f; python3 -c "import os,sys; os.rename(sys.argv[1]+'/a/f', sys.argv[1]+'/b/f'); os.link(sys.argv[1]+'/b/f', sys.argv[1]+'/a/g')" $d; done; echo renamed`
	forEachWall(t, func(t *testing.T, w wallCase) {
		for _, extra := range [][]string{nil, {"--writable-rootfs", "--user", "root"}} {
			r := w.run(t, append(extra, "--", "sh", "-c", script)...)
			if r.code != 0 || r.stdout != "renamed\n" {
				t.Fatalf("%v: %s", extra, r)
			}
		}
		r := w.run(t, "--writable-rootfs", "--user", "root", "--", "python3", "-c", "import os; os.makedirs('/var/x/a'); os.makedirs('/var/x/b'); open('/var/x/a/f','w').close(); os.rename('/var/x/a/f','/var/x/b/f'); print('ok')")
		if r.code != 0 || r.stdout != "ok\n" {
			t.Fatalf("rename in the writable root: %s", r)
		}
	})
}

// attackCase is one isolation case of the attack helper (its arguments),
// with the findings ("VULNERABLE: " lines) the gVisor wall may print:
// what the Sentry, not the host, serves.
type attackCase struct {
	args   []string
	gvisor []string
}

// attackCases are the attack helper's isolation cases, secret a host file
// no sandbox may read; a sandbox of either wall, one-shot (TestAttacksFail)
// or long-lived (TestServeSandboxLifecycle/isolation), answers them alike.
func attackCases(secret string) []attackCase {
	return []attackCase{
		{args: []string{"read-host", secret, "/etc/shadow", "/root/.bashrc", stateDir, dataDir, "/proc/1/root/etc/shadow"}},
		{args: []string{"write-outside"}, gvisor: []string{
			// Root inside may make a file in /dev: a tmpfs in the
			// Sentry's memory (charged to the sandbox's cgroup), not
			// the host's /dev; no device node can be made there (mknod).
			"write /dev/airlock-pwned succeeded",
		}},
		{args: []string{"host-procs", strconv.Itoa(os.Getpid()), strconv.Itoa(os.Getppid())}},
		{args: []string{"ptrace"}, gvisor: []string{
			// There is no init of ours in a gVisor sandbox: PID 1 is
			// the helper itself, so /proc/1 is its own environment,
			// binary and stdio (any other descriptor of PID 1 still
			// fails the test); ptrace is the Sentry's, over the
			// sandbox's own tasks only.
			"ptrace traceme succeeded",
			"read /proc/1/environ succeeded",
			"readlink /proc/1/exe succeeded",
			"opened /proc/1/fd/0", "opened /proc/1/fd/1", "opened /proc/1/fd/2",
		}},
		{args: []string{"exe"}, gvisor: []string{
			// PID 1 and self are the helper, a file of the sandbox's
			// copy-on-write /workspace (the Sentry has no ETXTBSY);
			// neither runsc nor airlock is in the sandbox's view, and
			// attackOn checks the host's copy is untouched.
			"open /proc/1/exe for writing succeeded",
			"open /proc/self/exe for writing succeeded",
		}},
		{args: []string{"fds"}},
		{args: []string{"mount"}},
		{args: []string{"mknod"}},
		{args: []string{"raw-socket"}},
		{args: []string{"network"}},
		{args: []string{"userns"}, gvisor: []string{
			// User namespaces are the Sentry's own: their capabilities
			// cover the Sentry's objects, never the host's.
			"clone(CLONE_NEWUSER) succeeded",
			// The container wall answers clone3 ENOSYS so that callers
			// fall back to clone, whose flags its seccomp filter can
			// read; the Sentry reads clone3's arguments itself (a null
			// one is EINVAL) and no host filter is involved.
			"clone3 answered invalid argument, want ENOSYS",
		}},
		{args: []string{"keyctl"}, gvisor: []string{
			// The session keyring is the Sentry's; the host's keyrings
			// are never reached (add_key, bpf, perf_event_open,
			// userfaultfd, io_uring_setup, finit_module stay refused,
			// see also TestHostKernelPrimitivesNeverReachTheHost).
			"keyctl succeeded",
		}},
	}
}

// allowedOn is what case name may print on w (attackCases).
func allowedOn(w wallCase, name string) []string {
	if w.name != "gvisor" {
		return nil
	}
	for _, c := range attackCases("") {
		if c.args[0] == name {
			return c.gvisor
		}
	}
	return nil
}
