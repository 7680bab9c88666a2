package gvisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/linux/cgroup"
	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/wall/uidlease"
	"golang.org/x/sys/unix"
)

// Sandbox is one gVisor sandbox (wall.Sandbox): a `runsc run` of a
// one-shot command, or of a long-lived sandbox's gvisor-init.
type Sandbox struct {
	id      string
	w       *Wall
	lock    *lockfile.Lock  // nil when adopted (runsc run holds it)
	uid     *uidlease.Range // the lease; nil when adopted (runsc run holds it)
	ids     idRange         // the sandbox's host ids
	cg      *cgroup.Cgroup
	cmd     *exec.Cmd // nil when adopted
	pid     int
	pidfd   int      // an adopted runsc run's (0: none), pidf's number
	pidf    *os.File // an adopted runsc run's pidfd (wall.OpenPidfd)
	agent   bool     // long-lived
	layers  wall.Layers
	oom     chan struct{}
	oomStop func()
	exited  chan struct{} // closed when runsc run has ended
	waitErr error         // runsc run's end (read after exited)
	stderr  chan string   // what runsc itself said

	killOnce, closeOnce sync.Once
}

// ID is the sandbox's id.
func (sb *Sandbox) ID() string { return sb.id }

// InitPid is `runsc run`'s pid on the host.
func (sb *Sandbox) InitPid() int { return sb.pid }

// Done is closed when runsc has ended (for a long-lived sandbox: when it
// died, of an OOM say, or was killed).
func (sb *Sandbox) Done() <-chan struct{} { return sb.exited }

// Wait blocks until the command has exited (or the sandbox died) and
// says how. runsc exits with the command's status (128+n for signal n);
// 128 alone, with a message of runsc's, is a sandbox that failed to run
// the command at all.
func (sb *Sandbox) Wait() wall.Exit {
	<-sb.exited
	said := strings.TrimSpace(<-sb.stderr)
	sb.stderr <- said
	var ex wall.Exit
	var ee *exec.ExitError
	switch {
	case sb.waitErr == nil:
	case errors.As(sb.waitErr, &ee) && ee.Exited():
		ex.Code = ee.ExitCode()
		if ex.Code > 128 && ex.Code < 128+65 {
			ex.Signal = ex.Code - 128
		}
	default:
		ex.InitDied = true
		ex.Code, ex.Signal = 128+int(unix.SIGKILL), int(unix.SIGKILL)
	}
	if ex.Code == 128 && said != "" {
		ex.Code, ex.Error = notStarted(said)
	}
	select {
	case <-sb.oom:
		ex.OOM = true
	default:
		if sb.cg.Stats().OOMKills > 0 {
			ex.OOM = true
		}
	}
	if ex.OOM {
		ex.Code, ex.Signal, ex.Error = 128+int(unix.SIGKILL), int(unix.SIGKILL), ""
	}
	return ex
}

// notStarted is how a command the Sentry could not start ends, from what
// runsc said (the pinned runsc's words), as on the container wall: 127
// and "NAME: command not found" when no such executable is in the PATH,
// or the path names nothing; 126 when the file is there but cannot be
// run (not executable, not a program); else 127 with runsc's error.
func notStarted(said string) (int, string) {
	msg := runscError(said)
	switch {
	case strings.Contains(msg, "error finding executable "):
		q, err := strconv.QuotedPrefix(msg[strings.Index(msg, "error finding executable ")+len("error finding executable "):])
		if err != nil {
			return 127, msg
		}
		name, _ := strconv.Unquote(q)
		return 127, fmt.Sprintf("%q: command not found", name)
	case strings.Contains(msg, "failed to load ") && !strings.HasSuffix(msg, "no such file or directory"):
		return 126, msg
	}
	return 127, msg
}

// runscError is the last line runsc wrote (its error), bounded.
func runscError(said string) string {
	lines := strings.Split(said, "\n")
	last := lines[len(lines)-1]
	if len(last) > 512 {
		last = last[:512]
	}
	return "runsc: " + last
}

// Signal sends sig to the command (runsc kill). A signal that comes while
// runsc is still making the sandbox (no container yet, or one not yet
// started) is sent again until the command runs, or until runsc has
// ended: the run's Ctrl-C in its first fraction of a second was lost.
func (sb *Sandbox) Signal(sig unix.Signal) error {
	for {
		out, err := exec.Command(sb.w.runsc, "--root", filepath.Join(sb.w.dir, runscRoot), "kill", sb.id, fmt.Sprint(int(sig))).CombinedOutput()
		if err == nil {
			return nil
		}
		err = fmt.Errorf("runsc kill: %v: %s", err, strings.TrimSpace(string(out)))
		if !notRunningYet(string(out)) {
			return err
		}
		select {
		case <-sb.exited:
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// notRunningYet tells whether runsc kill said (in the pinned runsc's
// words) that the container is not there yet or not yet started.
func notRunningYet(said string) bool {
	return strings.Contains(said, "loading container: ") ||
		strings.Contains(said, " in state creating") || strings.Contains(said, " in state created")
}

// runscGrace is how long Kill lets runsc run end by itself once its
// sandbox is killed, before it kills runsc run too.
const runscGrace = 3 * time.Second

// Kill ends every process of the sandbox at once: runsc, the Sentry and
// the gofer all live in its cgroup. runsc run is killed last: its
// children (the Sentry, the gofer) are killed first, so that runsc run,
// their parent, reaps them and removes its record of the sandbox, as when
// a sandbox ends by itself. Killed first, runsc run would leave them to
// the host's init, which may reap their zombies seconds later, and the
// `runsc delete` that Destroy then needs waits until it has. runsc run
// itself is killed once it has had runscGrace to end.
func (sb *Sandbox) Kill() {
	sb.killOnce.Do(func() {
		sb.killProcs()
		go func() {
			select {
			case <-sb.exited:
			case <-time.After(runscGrace):
				sb.killProcs()
				if sb.cmd != nil && sb.cmd.Process != nil {
					_ = sb.cmd.Process.Signal(unix.SIGKILL)
				}
				if sb.pidfd > 0 {
					_ = unix.PidfdSendSignal(sb.pidfd, unix.SIGKILL, nil, 0)
				}
			}
		}()
	})
}

// killProcs kills every process of the cgroup but runsc run.
func (sb *Sandbox) killProcs() {
	for _, p := range sb.cg.Procs() {
		if p != sb.pid {
			_ = unix.Kill(p, unix.SIGKILL)
		}
	}
}

// Stats is the cgroup's accounting: the Sentry's, the gofer's and runsc's
// together, which is what the sandbox costs the host.
func (sb *Sandbox) Stats() wall.Stats {
	st := sb.cg.Stats()
	return wall.Stats{CPUTime: st.CPUTime, MemoryPeak: st.MemoryPeak, OOMKills: st.OOMKills, PidsLimited: st.PidsLimited}
}

// LimitEvents are the cgroup's OOM kills and refused forks so far.
func (sb *Sandbox) LimitEvents() (oomKills, pidsLimited int64) { return sb.cg.LimitEvents() }

// CPUTime is the CPU time runsc and the sandbox used so far.
func (sb *Sandbox) CPUTime() time.Duration { return sb.cg.CPUTime() }

// MemoryCurrent is what the cgroup uses now.
func (sb *Sandbox) MemoryCurrent() int64 { return sb.cg.MemoryCurrent() }

// Layers are the descriptors of what the sandbox wrote.
func (sb *Sandbox) Layers() wall.Layers { return sb.layers }

// UIDBase is the host uid the sandbox's root is: the first of its leased
// range, which the Sentry and the gofer run as and its files are owned in.
func (sb *Sandbox) UIDBase() (uint32, error) { return sb.ids.Base, nil }

// Destroy kills what is left, waits for runsc, and removes runsc's state,
// the bundle, the cgroup and the lock. The layers stay open until
// CloseFiles.
func (sb *Sandbox) Destroy() error {
	var err error
	sb.closeOnce.Do(func() {
		sb.Kill()
		if sb.cg.Frozen() {
			_ = sb.cg.Thaw() // frozen tasks do not die until thawed
		}
		<-sb.exited
		if sb.oomStop != nil {
			sb.oomStop()
		}
		if sb.pidf != nil {
			sb.pidf.Close()
		}
		// Processes runsc left (none once its sandbox is killed).
		err = sb.w.remove(sb.id, sb.cg)
		sb.releaseLock()
	})
	if err != nil {
		return fmt.Errorf("%w: destroy gvisor sandbox %s: %v", errdefs.ErrInternal, sb.id, err)
	}
	return nil
}

// CloseFiles closes the layers' descriptors and the terminal's.
func (sb *Sandbox) CloseFiles() {
	for _, f := range []*os.File{sb.layers.WorkspaceUpper, sb.layers.Workspace, sb.layers.RootUpper, sb.layers.PTY} {
		if f != nil {
			f.Close()
		}
	}
}

var _ wall.Sandbox = (*Sandbox)(nil)
