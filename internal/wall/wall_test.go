package wall

import (
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// WaitPidfd returns once the process has exited (waiting in the poller:
// a closed pidfd ends the wait too), and at once for a process that has
// exited already.
func TestWaitPidfdReturnsOnExit(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	f, fd, err := OpenPidfd(cmd.Process.Pid)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer f.Close()
	done := make(chan struct{})
	go func() { WaitPidfd(f); close(done) }()
	select {
	case <-done:
		t.Fatal("WaitPidfd returned while the process runs")
	default:
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	<-done
	WaitPidfd(f) // exited already

	other := exec.Command("sleep", "600")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Wait()
	defer other.Process.Kill()
	g, _, err := OpenPidfd(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	WaitPidfd(g) // closed: returns
}

// Waiting for many processes holds no thread each (a blocking wait did: a
// host task and a thread's stacks per sandbox).
func TestWaitPidfdHoldsNoThread(t *testing.T) {
	const n = 64
	threads := pprof.Lookup("threadcreate").Count()
	for range n {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		f, fd, err := OpenPidfd(cmd.Process.Pid)
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Skipf("pidfd_open: %v", err)
		}
		go WaitPidfd(f)
		t.Cleanup(func() {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			cmd.Wait()
			f.Close()
		})
	}
	// Every waiter has reached its wait once its goroutine shows parked in
	// the poller (IO wait) or in a system call.
	for !allWaiting(n) {
		runtime.Gosched()
	}
	if grown := pprof.Lookup("threadcreate").Count() - threads; grown >= n/2 {
		t.Errorf("%d waits made %d threads", n, grown)
	}
}

// allWaiting says whether n goroutines wait in WaitPidfd.
func allWaiting(n int) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	waiting := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if (strings.Contains(g, "[IO wait") || strings.Contains(g, "[syscall")) && strings.Contains(g, "wall.WaitPidfd") {
			waiting++
		}
	}
	return waiting >= n
}
