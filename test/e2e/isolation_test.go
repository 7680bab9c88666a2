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
	r := airlock(t, "", "run", "--", "echo", "hello")
	if r.code != 0 || r.stdout != "hello\n" {
		t.Fatalf("%s", r)
	}
}

func TestStdinRelayed(t *testing.T) {
	r := airlock(t, "from the host\n", "run", "--", "cat")
	if r.code != 0 || r.stdout != "from the host\n" {
		t.Fatalf("%s", r)
	}
}

func TestExitStatus(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"own code", []string{"run", "--", "sh", "-c", "exit 3"}, 3, ""},
		{"signal", []string{"run", "--", "sh", "-c", "kill -TERM $$"}, 128 + 15, ""},
		{"not found", []string{"run", "--", "no-such-command"}, 127, "command not found"},
		{"not executable", []string{"run", "--", "/etc/passwd"}, 126, ""},
		{"missing image", []string{"run", "--image", "/nonexistent", "--", "true"}, 125, "airlock:"},
		{"bad flag", []string{"run", "--no-such-flag", "--", "true"}, 125, "unknown flag"},
		{"bad size", []string{"run", "--memory", "lots", "--", "true"}, 125, "--memory"},
		{"no command", []string{"run"}, 125, "no command"},
		{"degrade seccomp", []string{"run", "--allow-degraded", "seccomp", "--", "true"}, 125, "no opt-out"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := airlock(t, "", c.args...)
			if r.code != c.code || !strings.Contains(r.stderr, c.err) {
				t.Fatalf("want exit %d with %q; got %s", c.code, c.err, r)
			}
			if c.code == 125 && strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Errorf("refusal should be one line: %q", r.stderr)
			}
		})
	}
}

func TestEnvironmentIsMinimal(t *testing.T) {
	t.Setenv("HOST_SECRET_TOKEN", "s3cr3t")
	r := airlock(t, "", "run", "-e", "FOO=bar", "--", "env")
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
	r := airlock(t, "", "run", "--", "sh", "-c", "id -u; cat /proc/1/cmdline | tr '\\0' ' '; echo; cat /proc/self/status | grep -E '^(CapEff|CapBnd|CapPrm|CapInh|CapAmb|NoNewPrivs|Seccomp):'")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	lines := strings.Split(r.stdout, "\n")
	if lines[0] != "1000" {
		t.Errorf("uid %q, want 1000", lines[0])
	}
	if strings.TrimSpace(lines[1]) != "airlock init" {
		t.Errorf("PID 1 is %q, want airlock init", lines[1])
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "CapPrm:\t0000000000000000", "CapInh:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in\n%s", want, r.stdout)
		}
	}
}

func TestAttacksFail(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("do not read"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"user", "root"} {
		for _, c := range [][]string{
			{"read-host", secret, "/etc/shadow", "/root/.bashrc", stateDir, dataDir, "/proc/1/root/etc/shadow"},
			{"write-outside"},
			{"host-procs", strconv.Itoa(os.Getpid()), strconv.Itoa(os.Getppid())},
			{"ptrace"},
			{"exe"},
			{"fds"},
			{"mount"},
			{"mknod"},
			{"raw-socket"},
			{"network"},
			{"userns"},
			{"keyctl"},
		} {
			t.Run(user+"/"+c[0], func(t *testing.T) { attack(t, []string{"--user", user}, c...) })
		}
	}
	// For root inside, setuid-root is nothing new; for the user it must not
	// raise privileges (nosuid mounts and no_new_privs).
	t.Run("user/setuid", func(t *testing.T) { attack(t, nil, "setuid") })
}

func TestLandlockConfinesWrites(t *testing.T) {
	// /proc is writable as far as the mounts go; only Landlock refuses.
	attack(t, nil, "landlock")
}

func TestForeignABIKilled(t *testing.T) {
	// Some hypervisors' guests fault on int 0x80 outright (SIGSEGV, even
	// outside any sandbox): there is no i386 gate for the filter to close.
	host := exec.Command(attackBin, "int80")
	if out, _ := host.CombinedOutput(); !strings.Contains(string(out), "VULNERABLE") {
		t.Skipf("this kernel does not deliver i386 system calls (int 0x80 outside a sandbox: %s)", strings.SplitN(string(out), "\n", 2)[0])
	}
	r := airlock(t, "", "run", "--workspace", workspace(t), "--", "/workspace/attack", "int80")
	if r.code != 128+31 || strings.Contains(r.stdout, "VULNERABLE") {
		t.Fatalf("an i386 syscall must kill the process with SIGSYS (exit 159): %s", r)
	}
}

func TestTIOCSTIDenied(t *testing.T) {
	attack(t, []string{"-t"}, "tiocsti")
}

func TestRootInsideIsConfined(t *testing.T) {
	r := airlock(t, "", "run", "--user", "root", "--", "sh", "-c", "id -u; grep CapEff /proc/self/status; cat /proc/self/uid_map")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "0\n") {
		t.Fatalf("%s", r)
	}
	// root inside maps to an unprivileged host uid.
	f := strings.Fields(strings.Split(r.stdout, "\n")[2])
	if len(f) != 3 || f[0] != "0" || f[1] == "0" {
		t.Fatalf("uid_map %q: root inside must not be host root", f)
	}
	if strings.Contains(r.stdout, "CapEff:\t000001ffffffffff") {
		t.Fatal("root inside has every capability")
	}
}

func TestReadOnlyRootAndWritablePaths(t *testing.T) {
	r := airlock(t, "", "run", "--", "sh", "-c", "for d in /workspace /tmp /dev/shm $HOME; do touch $d/f && echo ok $d; done; touch /usr/f 2>&1; touch /etc/f 2>&1; mount | grep -c nosuid >/dev/null; true")
	for _, d := range []string{"ok /workspace", "ok /tmp", "ok /dev/shm", "ok /home/user"} {
		if !strings.Contains(r.stdout, d) {
			t.Errorf("missing %q: %s", d, r)
		}
	}
	if strings.Count(r.stdout, "Read-only file system") != 2 {
		t.Errorf("/usr and /etc must be read-only: %s", r)
	}
	r = airlock(t, "", "run", "--", "sh", "-c", "grep -v nosuid /proc/self/mounts | grep -v -E ' /dev/(null|zero|full|random|urandom|tty) ' || true")
	if strings.TrimSpace(r.stdout) != "" {
		t.Errorf("mounts without nosuid (other than device nodes):\n%s", r.stdout)
	}
	r = airlock(t, "", "run", "--", "sh", "-c", "ls /dev | tr '\\n' ' '")
	if got := strings.TrimSpace(r.stdout); got != "core fd full null ptmx pts random shm stderr stdin stdout tty urandom zero" {
		t.Errorf("/dev holds %q", got)
	}
}

func TestWritableRootfs(t *testing.T) {
	r := airlock(t, "", "run", "--writable-rootfs", "--user", "root", "--", "sh", "-c", "echo x > /usr/local/airlock-test && cat /usr/local/airlock-test && echo y > /etc/new && cat /etc/new")
	if r.code != 0 || r.stdout != "x\ny\n" {
		t.Fatalf("%s", r)
	}
	if _, err := os.Stat("/usr/local/airlock-test"); err == nil {
		t.Fatal("--writable-rootfs wrote to the host's /usr")
	}
}

func TestImageOwnershipKept(t *testing.T) {
	r := airlock(t, "", "run", "--", "stat", "-c", "%u:%g", "/usr/bin/env", "/etc/passwd")
	if r.code != 0 || r.stdout != "0:0\n0:0\n" {
		t.Fatalf("host image files must stay root-owned inside: %s", r)
	}
}

func TestMaskedProc(t *testing.T) {
	r := airlock(t, "", "run", "--", "sh", "-c", "wc -c < /proc/kallsyms; wc -c < /proc/timer_list; test -e /proc/kcore && wc -c < /proc/kcore; echo c > /proc/sysrq-trigger && echo TRIGGERED; ls /proc/acpi 2>/dev/null | wc -l; true")
	if !strings.HasPrefix(r.stdout, "0\n0\n") || strings.Contains(r.stdout, "TRIGGERED") || strings.Contains(r.stdout, "\n1") {
		t.Fatalf("masked /proc entries must read empty and refuse writes: %s", r)
	}
}

// Regression: Landlock's REFER right was not granted, so every rename or
// hard link across directories failed with EXDEV (dpkg, git and pip broke).
func TestRenameAcrossDirectories(t *testing.T) {
	script := `set -e; for d in /workspace /tmp $HOME; do mkdir -p $d/a $d/b; echo x > $d/a/f; python3 -c "import os,sys; os.rename(sys.argv[1]+'/a/f', sys.argv[1]+'/b/f'); os.link(sys.argv[1]+'/b/f', sys.argv[1]+'/a/g')" $d; done; echo renamed`
	for _, extra := range [][]string{nil, {"--writable-rootfs", "--user", "root"}} {
		r := airlock(t, "", append(append([]string{"run"}, extra...), "--", "sh", "-c", script)...)
		if r.code != 0 || r.stdout != "renamed\n" {
			t.Fatalf("%v: %s", extra, r)
		}
	}
	r := airlock(t, "", "run", "--writable-rootfs", "--user", "root", "--", "python3", "-c", "import os; os.makedirs('/var/x/a'); os.makedirs('/var/x/b'); open('/var/x/a/f','w').close(); os.rename('/var/x/a/f','/var/x/b/f'); print('ok')")
	if r.code != 0 || r.stdout != "ok\n" {
		t.Fatalf("rename in the writable root: %s", r)
	}
}
