package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// wallCase is a wall the tests run on, the flags by which `airlock run`,
// `create` and `mcp` pick it, and those by which `airlock serve` makes it
// the wall of every create that names none.
type wallCase struct {
	name  string
	flags []string
	serve []string
}

// walls are every wall a one-shot run can have. Each isolation test runs
// on all of them; where a wall's expectation differs, the test's own table
// says so and why the difference is still safe.
var walls = []wallCase{
	{name: "container"},
	{name: "gvisor", flags: []string{"--isolation", "gvisor"}, serve: []string{"--default-isolation", "gvisor"}},
}

// forEachWall runs f as a subtest per wall. A gVisor subtest needs runsc
// (see needRunsc) and must leave nothing behind once everything it made
// is gone (its daemons too: the check is its first cleanup, so its last).
func forEachWall(t *testing.T, f func(t *testing.T, w wallCase)) {
	for _, w := range walls {
		t.Run(w.name, func(t *testing.T) {
			if w.name == "gvisor" {
				needRunsc(t)
				t.Cleanup(func() { noGVisorResidue(t) })
			}
			f(t, w)
		})
	}
}

// run is `airlock run` on w with args (flags, then -- and the command).
func (w wallCase) run(t *testing.T, args ...string) result {
	t.Helper()
	return airlock(t, "", append(append([]string{"run"}, w.flags...), args...)...)
}

// attackOn runs the helper's case on w like attack does, except that the
// VULNERABLE lines in allowed (exact lines, without the prefix) are the
// wall's expected answers: they alone do not fail the test.
func attackOn(t *testing.T, w wallCase, extra, allowed []string, args ...string) result {
	t.Helper()
	ws := workspace(t)
	full := append(append([]string{"run", "--workspace", ws}, w.flags...), extra...)
	r := airlock(t, "", append(append(full, "--", "/workspace/attack"), args...)...)
	found, wantCode := findings(r.stdout, allowed)
	if len(found) > 0 || r.code != wantCode {
		t.Errorf("attack %v on the %s wall (%v): %q\n%s", args, w.name, extra, found, r)
	}
	// Whatever the case did inside, the host's copy of the helper (the
	// workspace's lower layer) is as it was.
	want, _ := os.ReadFile(attackBin)
	if got, err := os.ReadFile(filepath.Join(ws, "attack")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("attack %v on the %s wall changed the host's copy of the helper (%v)", args, w.name, err)
	}
	return r
}

// findings are the helper's findings in out ("VULNERABLE: " lines) but
// those allowed, and the exit code the helper gives with out: 1 when it
// found anything, allowed or not.
func findings(out string, allowed []string) (found []string, code int) {
	for _, l := range strings.Split(out, "\n") {
		if f, ok := strings.CutPrefix(l, "VULNERABLE: "); ok && !slices.Contains(allowed, f) {
			found = append(found, f)
		}
	}
	if strings.Contains(out, "VULNERABLE") {
		code = 1
	}
	return found, code
}

// The sandbox's kernel is the wall's: the host's on the container wall;
// on the gVisor wall the Sentry, whose release, /proc/version and kernel
// log are not the host's, and whose log names gVisor (the container wall
// refuses the kernel log: syslog is outside its seccomp profile).
func TestKernelIsTheWalls(t *testing.T) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	host := unix.ByteSliceToString(u.Release[:])
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := w.run(t, "--", "sh", "-c", "uname -r; cat /proc/version; dmesg 2>&1 | head -n 1")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.code != 0 || len(lines) != 3 {
			t.Fatalf("%s", r)
		}
		release, version, klog := lines[0], lines[1], lines[2]
		switch w.name {
		case "container":
			if release != host || !strings.Contains(version, host) || !strings.Contains(klog, "Operation not permitted") {
				t.Errorf("want the host's kernel %s and no kernel log:\n%s", host, r)
			}
		case "gvisor":
			if release == host || strings.Contains(version, host) || !strings.Contains(klog, "Starting gVisor") {
				t.Errorf("want gVisor's kernel, not the host's %s:\n%s", host, r)
			}
		}
	})
}

// primitives are the host-kernel exploit primitives the helper's
// "primitives" case calls, each by its syscalls tracepoint name.
var primitives = map[string]string{
	"io_uring_setup":     "io_uring_setup",
	"userfaultfd":        "userfaultfd",
	"perf_event_open":    "perf_event_open",
	"bpf(BPF_PROG_LOAD)": "bpf",
}

// No host-kernel exploit primitive called inside a sandbox reaches the
// host kernel: the host's own count of entries into those system calls
// by the run's processes (airlock, and on the gVisor wall runsc, the
// Sentry and its stubs, which run the sandbox's code) stays zero. The
// same helper run directly on the host is counted, which proves the count
// sees what it is meant to. The container wall's seccomp filter refuses
// each one (EPERM, before the kernel enters it); on the gVisor wall the
// Sentry answers, with what it answers recorded in the log.
func TestHostKernelPrimitivesNeverReachTheHost(t *testing.T) {
	// execve is the witness: the count must reach the wall's processes
	// (on the gVisor wall, runsc re-executes itself as the Gofer and the
	// Sentry).
	names := []string{"execve"}
	for _, n := range primitives {
		names = append(names, n)
	}
	slices.Sort(names)
	ids, err := syscallTracepoints(names)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("the host cannot count system calls (under CI=true this fails): %v", err)
	}
	run := func(t *testing.T, argv ...string) (result, map[string]uint64) {
		t.Helper()
		r, counts, err := countSyscalls(ids, argv...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%v: host kernel entries %v\n%s", argv[len(argv)-1], counts, r.stdout)
		return r, counts
	}
	t.Run("host", func(t *testing.T) {
		r, counts := run(t, attackBin, "primitives")
		for line, n := range primitives {
			if !strings.Contains(r.stdout, "PRIMITIVE "+line+" made\n") || counts[n] == 0 {
				t.Errorf("%s on the host: the count must see it (%d entries):\n%s", line, counts[n], r)
			}
		}
	})
	forEachWall(t, func(t *testing.T, w wallCase) {
		for _, user := range []string{"user", "root"} {
			t.Run(user, func(t *testing.T) {
				args := append(append([]string{airlockBin, "--state-dir", stateDir, "--data-dir", dataDir, "run", "--workspace", workspace(t), "--user", user}, w.flags...), "--", "/workspace/attack", "primitives")
				r, counts := run(t, args...)
				if r.code != 0 {
					t.Fatalf("%s", r)
				}
				if counts["execve"] < 3 {
					t.Errorf("the count did not follow the wall's processes: %d execve", counts["execve"])
				}
				for line, n := range primitives {
					if counts[n] != 0 {
						t.Errorf("%s reached the host kernel %d times", line, counts[n])
					}
					if !strings.Contains(r.stdout, "PRIMITIVE "+line+" ") {
						t.Errorf("%s was not called:\n%s", line, r)
					}
					// The container wall's seccomp profile refuses each one.
					if w.name == "container" && !strings.Contains(r.stdout, "PRIMITIVE "+line+" refused EPERM\n") {
						t.Errorf("%s: want refused EPERM:\n%s", line, r)
					}
				}
			})
		}
	})
}

// syscallTracepoints returns the ids of the syscalls:sys_enter_NAME
// tracepoints, read from a tracefs mounted in a mount namespace of a
// thread of its own (which ends with it: the host's mounts are untouched).
func syscallTracepoints(names []string) (map[string]uint64, error) {
	type answer struct {
		ids map[string]uint64
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its namespace
		ids, err := func() (map[string]uint64, error) {
			if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
				return nil, fmt.Errorf("unshare: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return nil, fmt.Errorf("make / private: %w", err)
			}
			dir, err := os.MkdirTemp("", "airlock-e2e-tracefs-")
			if err != nil {
				return nil, err
			}
			defer os.Remove(dir)
			if err := unix.Mount("tracefs", dir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
				return nil, fmt.Errorf("mount tracefs: %w", err)
			}
			defer unix.Unmount(dir, unix.MNT_DETACH)
			ids := map[string]uint64{}
			for _, n := range names {
				b, err := os.ReadFile(filepath.Join(dir, "events", "syscalls", "sys_enter_"+n, "id"))
				if err != nil {
					return nil, err
				}
				var id uint64
				if _, err := fmt.Sscan(string(b), &id); err != nil {
					return nil, fmt.Errorf("tracepoint %s: %q", n, b)
				}
				ids[n] = id
			}
			return ids, nil
		}()
		ch <- answer{ids, err}
	}()
	a := <-ch
	return a.ids, a.err
}

// countSyscalls runs argv and returns, per name of ids, how many times the
// host kernel entered that system call in argv's process and everything
// it started (perf counters on the tracepoints, inherited by every task
// forked after they open; a call a seccomp filter refuses is never
// entered, so never counted).
func countSyscalls(ids map[string]uint64, argv ...string) (result, map[string]uint64, error) {
	type answer struct {
		r      result
		counts map[string]uint64
		err    error
	}
	ch := make(chan answer, 1)
	go func() {
		// The counters are the thread's, and inherited by what it forks:
		// the command must be started from this thread.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var a answer
		defer func() { ch <- a }()
		fds := map[string]int{}
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
		for n, id := range ids {
			// Opened disabled: the opening of the others is not counted.
			attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_TRACEPOINT, Config: id, Bits: unix.PerfBitInherit | unix.PerfBitDisabled}
			attr.Size = uint32(unsafe.Sizeof(attr))
			fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
			if err != nil {
				a.err = fmt.Errorf("perf_event_open(%s): %w", n, err)
				return
			}
			fds[n] = fd
		}
		for n, fd := range fds {
			if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
				a.err = fmt.Errorf("enable the %s counter: %w", n, err)
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		a.r = result{stdout: out.String(), stderr: errb.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			a.r.code = ee.ExitCode()
		} else if err != nil {
			a.err = err
			return
		}
		a.counts = map[string]uint64{}
		for n, fd := range fds {
			var b [8]byte
			if _, err := unix.Read(fd, b[:]); err != nil {
				a.err = fmt.Errorf("read the %s counter: %w", n, err)
				return
			}
			a.counts[n] = binary.NativeEndian.Uint64(b[:])
		}
	}()
	a := <-ch
	return a.r, a.counts, a.err
}
