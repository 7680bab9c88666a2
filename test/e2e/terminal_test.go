package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// terminalRun is `airlock run -t` on a terminal of the test's own (its
// controlling terminal, as a user's shell would have it), whose master
// the test reads and types into.
type terminalRun struct {
	cmd    *exec.Cmd
	master *os.File
	mu     sync.Mutex
	out    bytes.Buffer
	more   chan struct{} // a token after each read
	eof    chan struct{} // closed once the terminal is read to its end
}

func startTerminalRun(t *testing.T, w wallCase, rows, cols uint16, argv ...string) *terminalRun {
	t.Helper()
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	master := os.NewFile(uintptr(mfd), "ptmx")
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	sfd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if e != 0 {
		t.Fatal(e)
	}
	slave := os.NewFile(sfd, "pts")
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	args := append(append([]string{"--state-dir", stateDir, "--data-dir", dataDir, "run"}, w.flags...), "-t", "--")
	cmd := exec.CommandContext(ctx, airlockBin, append(args, argv...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	r := &terminalRun{cmd: cmd, master: master, more: make(chan struct{}, 1), eof: make(chan struct{})}
	go func() {
		defer close(r.eof)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			r.mu.Lock()
			r.out.Write(buf[:n])
			r.mu.Unlock()
			select {
			case r.more <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		master.Close()
	})
	return r
}

func (r *terminalRun) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// waitFor waits until the terminal has shown s.
func (r *terminalRun) waitFor(t *testing.T, s string) {
	t.Helper()
	for {
		if strings.Contains(r.output(), s) {
			return
		}
		select {
		case <-r.more:
		case <-r.eof:
			if !strings.Contains(r.output(), s) {
				t.Fatalf("the terminal ended before it showed %q:\n%s", s, r.output())
			}
			return
		}
	}
}

// exit waits for airlock to end and returns its exit code.
func (r *terminalRun) exit(t *testing.T) int {
	t.Helper()
	err := r.cmd.Wait()
	<-r.eof
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("airlock run -t: %v\n%s", err, r.output())
	}
	return r.cmd.ProcessState.ExitCode()
}

// `airlock run -t` gives the command a terminal of the sandbox's
// (/dev/pts/N, as `tty` names it) of the user's terminal's size, which
// follows the user's terminal when it is resized, and relays the
// command's exit code. The resize reaches the terminal's foreground
// process group: here a job-control shell's job, not the command's own
// group.
func TestRunTerminalFollowsTheUsersTerminal(t *testing.T) {
	job := `trap 'echo "now $(stty size)"; exit 7' WINCH; [ "$(ps -o pgid= $$)" != "$(ps -o pgid= $PPID)" ] || echo "not a job"; tty; stty size; echo ready; sleep 1000 & wait`
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := startTerminalRun(t, w, 33, 101, "bash", "-mc", `sh -c "$1"; exit $?`, "bash", job)
		r.waitFor(t, "ready")
		if out := r.output(); !regexp.MustCompile(`(?m)^\s*/dev/pts/[0-9]+\r?$`).MatchString(out) || !strings.Contains(out, "33 101") || strings.Contains(out, "not a job") {
			t.Fatalf("want the sandbox's /dev/pts/N of 33 rows and 101 columns, the command a job of its own:\n%q", out)
		}
		if err := unix.IoctlSetWinsize(int(r.master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 40, Col: 120}); err != nil {
			t.Fatal(err)
		}
		r.waitFor(t, "now 40 120")
		if code := r.exit(t); code != 7 {
			t.Fatalf("exit %d, want the command's 7:\n%s", code, r.output())
		}
	})
}

// ^C typed on the user's terminal is the command's SIGINT (the sandbox's
// terminal's line discipline), and the run exits 130.
func TestRunTerminalCtrlCInterruptsTheCommand(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := startTerminalRun(t, w, 24, 80, "sh", "-c", "echo ready; exec sleep 1000")
		r.waitFor(t, "ready")
		if _, err := r.master.Write([]byte{3}); err != nil {
			t.Fatal(err)
		}
		if code := r.exit(t); code != 128+int(unix.SIGINT) {
			t.Fatalf("exit %d, want 130 (SIGINT):\n%s", code, r.output())
		}
	})
}
