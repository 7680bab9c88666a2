package container

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/confined/nsinit"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/linux/cgroup"
	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"golang.org/x/sys/unix"
)

// Long-lived sandboxes (Options.AgentSocket) outlive the process that made
// them: init holds the leases and the liveness lock, the agent socket stays
// bound, and a restarted daemon adopts them again by init's pid.

// listenUnix binds a root-only listening socket at path for init to serve
// on; the host's copy is closed once init has it.
func listenUnix(path string) (int, error) {
	if len(path) >= 108 {
		return -1, fmt.Errorf("agent socket path %s is too long", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return -1, err
	}
	_ = os.Remove(path)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", path, err)
	}
	if err := unix.Chmod(path, 0o600); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen: %w", err)
	}
	return fd, nil
}

// Done is closed when the sandbox's init has exited (long-lived sandboxes).
func (sb *Sandbox) Done() <-chan struct{} { return sb.exited }

// Freeze stops every process of the sandbox; Thaw resumes them.
func (sb *Sandbox) Freeze() error { return sb.cg.Freeze() }

// Thaw resumes a frozen sandbox.
func (sb *Sandbox) Thaw() error { return sb.cg.Thaw() }

// Frozen reports whether the sandbox is frozen.
func (sb *Sandbox) Frozen() bool { return sb.cg.Frozen() }

// MemoryCurrent is what the sandbox's cgroup uses now.
func (sb *Sandbox) MemoryCurrent() int64 { return sb.cg.MemoryCurrent() }

func (sb *Sandbox) releaseLocks() {
	if sb.uid != nil {
		sb.uid.Lock.Release()
	} else {
		// Adopted: init held the lease; its file is free now.
		sb.rt.leases.Reap()
	}
	if sb.lock != nil {
		sb.lock.Release()
	} else if l, err := lockfile.TryLock(filepath.Join(sb.rt.stateDir, sandboxDir, sb.id+".lock")); err == nil && l != nil {
		l.Release()
	}
}

// Adopt takes over the long-lived sandbox id whose init has host pid pid,
// made by an earlier daemon. It checks that pid is that sandbox's init
// (alive, in the sandbox's cgroup, holding its lock) and returns
// errdefs.ErrNotFound when it is not.
func (rt *Wall) Adopt(id string, pid int) (_ wall.Sandbox, err error) {
	gone := func(why string) error { return fmt.Errorf("%w: sandbox %s: %s", errdefs.ErrNotFound, id, why) }
	if !rt.Live(id) {
		return nil, gone("its lock is free (init is gone)")
	}
	pidf, pidfd, err := wall.OpenPidfd(pid)
	if err != nil {
		return nil, gone(fmt.Sprintf("init pid %d: %v", pid, err))
	}
	defer func() {
		if err != nil {
			pidf.Close()
		}
	}()
	// The pid is init's only if it sits in the sandbox's own cgroup (on
	// v2 its init leaf) and is the first process of a child pid namespace
	// (NSpid has two levels).
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	own := "/" + rt.cgroups.Parent + "/" + id
	if err != nil || !strings.Contains(string(b), own+"\n") && !strings.Contains(string(b), own+"/"+cgroup.InitDir+"\n") {
		return nil, gone(fmt.Sprintf("pid %d is not in its cgroup", pid))
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil || !strings.Contains(string(st), "\nNSpid:\t"+fmt.Sprint(pid)+"\t1\n") {
		return nil, gone(fmt.Sprintf("pid %d is not a sandbox's init", pid))
	}
	sb := &Sandbox{id: id, rt: rt, oom: make(chan struct{}), sock: -1, pidfd: pidfd, pidf: pidf, exited: make(chan struct{}), agent: true, initPid: pid}
	sb.cg = rt.cgroups.Open(id)
	// From here on the pid is the sandbox's init: a failure kills it, so
	// that nothing unadopted runs on.
	defer func() {
		if err != nil {
			_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		}
	}()
	// Still ours after the checks above: the pidfd pins the pid.
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return nil, gone("init exited while being adopted")
	}
	sb.layers.WorkspaceUpper, err = reopen(pid, nsinit.AgentWorkspaceUpperFD)
	if err != nil {
		return nil, err
	}
	sb.layers.Workspace, err = reopen(pid, nsinit.AgentWorkspaceFD)
	if err != nil {
		sb.layers.WorkspaceUpper.Close()
		return nil, err
	}
	sb.layers.RootUpper, err = reopen(pid, nsinit.AgentRootUpperFD)
	if err != nil {
		sb.CloseFiles()
		return nil, err
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		sb.CloseFiles()
		return nil, gone("init exited while being adopted")
	}
	go func() { wall.WaitPidfd(pidf); close(sb.exited) }()
	return sb, nil
}

// reopen opens (O_PATH) the directory init keeps at descriptor fd. The
// link is followed only by the host, to a directory of the sandbox's own
// scratch; what is read through it later obeys the safe-access rules.
func reopen(pid, fd int) (*os.File, error) {
	p := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	f, err := os.OpenFile(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: reopen the workspace layer of init %d: %v", errdefs.ErrNotFound, pid, err)
	}
	return f, nil
}

// UIDBase is the host uid that root inside the sandbox maps to.
func (sb *Sandbox) UIDBase() (uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", sb.initPid))
	if err != nil {
		return 0, err
	}
	var inside, outside, size uint32
	if _, err := fmt.Sscan(string(b), &inside, &outside, &size); err != nil || inside != 0 {
		return 0, fmt.Errorf("init's uid map %q", b)
	}
	if err := unix.PidfdSendSignal(sb.pidfd, 0, nil, 0); err != nil {
		return 0, fmt.Errorf("init exited: %w", err)
	}
	return outside, nil
}

// Discard ends whatever is left of sandbox id that could not be adopted:
// every process in its cgroup is killed, and once its lock is free its
// cgroup and lock files are removed. It waits a few seconds at most.
func (rt *Wall) Discard(id string) error {
	rt.cgroups.Open(id).KillUntil(func() bool { return !rt.Live(id) })
	_, err := rt.GC()
	return err
}
