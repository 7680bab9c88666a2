package nsinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The placement writes what the kernel needs, in the order it needs it:
// with "thread", "0" into the commands' files before the fork and into the
// sandbox's after (whether or not the fork worked); with "process", the
// child's pid once it runs. A command that cannot be placed does not run on.
func TestPlacementOrder(t *testing.T) {
	pipe := func() (r, w int) {
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fds[0]) })
		return fds[0], fds[1]
	}
	// read returns what was written so far (the writes come before it).
	read := func(r int) string {
		b := make([]byte, 64)
		n, err := unix.Read(r, b)
		if err != nil {
			return ""
		}
		return string(b[:n])
	}
	if _, err := newPlacement("thread", []int{1, 2, 3}); err == nil {
		t.Error("thread placement took an odd number of descriptors")
	}
	if _, err := newPlacement("process", nil); err == nil {
		t.Error("process placement took no descriptor")
	}
	if p, err := newPlacement("", nil); err != nil || p.procs != -1 {
		t.Errorf("no placement: %+v %v", p, err)
	}

	inR, in := pipe()
	outR, out := pipe()
	p, err := newPlacement("thread", []int{in, out})
	if err != nil {
		t.Fatal(err)
	}
	for _, forkErr := range []error{nil, errors.New("fork failed")} {
		pid, err := p.fork(func() (int, error) {
			if got := read(inR); got != "0" {
				t.Errorf("before the fork the commands' file got %q", got)
			}
			if got := read(outR); got != "" {
				t.Errorf("before the fork the sandbox's file got %q", got)
			}
			return 42, forkErr
		})
		if pid != 42 || err != forkErr {
			t.Errorf("fork = %d, %v", pid, err)
		}
		if got := read(outR); got != "0" {
			t.Errorf("after the fork the sandbox's file got %q", got)
		}
	}

	procsR, procs := pipe()
	p, _ = newPlacement("process", []int{procs})
	if pid, err := p.fork(func() (int, error) { return 4242, nil }); pid != 4242 || err != nil || read(procsR) != "4242" {
		t.Errorf("process placement: %d, %v", pid, err)
	}
	// A descriptor that refuses the write: the child is killed, the start
	// fails. (A pipe without its reader: EPIPE, and Go ignores SIGPIPE on
	// descriptors other than 1 and 2.)
	var broken [2]int
	if err := unix.Pipe2(broken[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	unix.Close(broken[0])
	defer unix.Close(broken[1])
	p, _ = newPlacement("process", []int{broken[1]})
	child, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := p.fork(func() (int, error) { return child.Pid, nil }); pid != 0 || err == nil {
		t.Errorf("an unplaced command started: %d, %v", pid, err)
	}
	if st, _ := child.Wait(); st == nil || !st.Sys().(syscall.WaitStatus).Signaled() {
		t.Errorf("the unplaced command was not killed: %v", st)
	}
}

// A command that exits at once may be reaped (init's reaper waits for any
// child, outside the launcher's lock) before init writes its pid to the
// commands' cgroup.procs: the kernel answers ESRCH. The command ran and
// ended; its start must not fail (its exit status is still delivered),
// and nothing is killed in its name.
func TestPlacementOfACommandAlreadyReaped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a cgroup)")
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	v2 := ""
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
			v2 = f[1]
			break
		}
	}
	if v2 == "" {
		t.Skip("no cgroup2 mount")
	}
	dir := filepath.Join(v2, fmt.Sprintf("airlock-placement-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { _ = unix.Rmdir(dir) })
	procs, err := os.OpenFile(filepath.Join(dir, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer procs.Close()
	p, err := newPlacement("process", []int{int(procs.Fd())})
	if err != nil {
		t.Fatal(err)
	}
	child, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := child.Wait(); err != nil { // reaped before it is placed
		t.Fatal(err)
	}
	if pid, err := p.fork(func() (int, error) { return child.Pid, nil }); pid != child.Pid || err != nil {
		t.Errorf("a command that ran and was reaped before its placement: start = %d, %v", pid, err)
	}
}
