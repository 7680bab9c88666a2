package gvisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/confined/nsinit"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"golang.org/x/sys/unix"
)

// A long-lived gVisor sandbox (Options.AgentSocket) is one `runsc run`
// that outlives the process that started it: runsc run holds the
// sandbox's lock, lives in the mount namespace that holds the bundle's
// mounts, and takes the Sentry and the gofer with it when it dies
// (runsc's attached mode). Inside, gvisor-init (internal/confined/nsinit)
// serves the agent on a socket it binds in agentDir, the one host
// directory shown to the sandbox for it: runsc's --host-uds=create lets
// the gofer bind sockets the sandbox asks for in its mounts (and never
// connect to one: that is --host-uds=open, not given). Once gvisor-init
// says it listens, the host moves the socket out of that directory to
// Options.AgentSocket, where no sandbox can reach it or put anything in
// its place.

const (
	runscLog = "runsc.log" // what runsc (and gvisor-init before ready) said, in the bundle
	// agentStart bounds how long runsc may take to start the agent.
	agentStart = 2 * time.Minute
)

func (w *Wall) bundle(id string) string { return filepath.Join(w.dir, bundleDir, id) }

// agentReady waits for gvisor-init's ready line on r, then moves the
// agent's socket out of the directory shared with the sandbox to path.
func (sb *Sandbox) agentReady(r *os.File, bundle, path string) error {
	got := make(chan error, 1)
	go func() {
		b := make([]byte, len(nsinit.GVisorReady))
		_, err := io.ReadFull(r, b)
		if err == nil && string(b) != nsinit.GVisorReady {
			err = fmt.Errorf("it said %q", b)
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			return fmt.Errorf("%w: the gvisor sandbox did not start its agent: %s", errdefs.ErrUnavailable, saidIn(bundle, err))
		}
	case <-time.After(agentStart):
		return fmt.Errorf("%w: the gvisor sandbox did not start its agent within %s", errdefs.ErrUnavailable, agentStart)
	}
	return moveSocket(filepath.Join(bundle, "agent", agentSockOut), path)
}

// saidIn is the last line runsc wrote to the bundle's log, or err.
func saidIn(bundle string, err error) string {
	b, _ := os.ReadFile(filepath.Join(bundle, runscLog))
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return err.Error()
	}
	return runscError(string(b))
}

// moveSocket links the socket at src (in the directory the sandbox
// shares) to dst (in a root-only host directory). What arrives must be a
// socket: anything else the sandbox could have put there is removed. The
// name in the shared directory stays the sandbox's: gVisor remembers the
// socket there, and removes it before a checkpoint (a restored sandbox
// looks again for every name it remembers).
// The gofer bound it as the sandbox's root: it becomes root's.
func moveSocket(src, dst string) error {
	if len(dst) >= 108 {
		return fmt.Errorf("agent socket path %s is too long", dst)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	_ = os.Remove(dst)
	if err := unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, 0); err != nil {
		return fmt.Errorf("%w: the agent's socket: %v", errdefs.ErrUnavailable, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dst, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		_ = os.Remove(dst)
		return fmt.Errorf("%w: the agent's socket is not a socket", errdefs.ErrUnavailable)
	}
	if err := unix.Lchown(dst, 0, 0); err != nil {
		_ = os.Remove(dst)
		return err
	}
	return unix.Chmod(dst, 0o600)
}

// Adopt takes over long-lived sandbox id, whose runsc run has host pid
// pid, made by an earlier process. It checks that pid is that sandbox's
// runsc run (alive, in the sandbox's cgroup, running its bundle, holding
// its lock) and reopens the layers through the mount namespace runsc run
// lives in; errdefs.ErrNotFound when it is not.
func (w *Wall) Adopt(id string, pid int) (_ wall.Sandbox, err error) {
	gone := func(why string) error { return fmt.Errorf("%w: sandbox %s: %s", errdefs.ErrNotFound, id, why) }
	if !w.Live(id) {
		return nil, gone("its lock is free (runsc is gone)")
	}
	pidf, pidfd, err := wall.OpenPidfd(pid)
	if err != nil {
		return nil, gone(fmt.Sprintf("runsc pid %d: %v", pid, err))
	}
	defer func() {
		if err != nil {
			pidf.Close()
		}
	}()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil || !strings.Contains(string(b), "/"+w.cgroups.Parent+"/"+id+"\n") {
		return nil, gone(fmt.Sprintf("pid %d is not in its cgroup", pid))
	}
	if !isRunscRun(pid, w.bundle(id), id) {
		return nil, gone(fmt.Sprintf("pid %d is not its runsc run", pid))
	}
	sb := &Sandbox{id: id, w: w, pid: pid, pidfd: pidfd, pidf: pidf, agent: true, oom: make(chan struct{}), exited: make(chan struct{})}
	sb.cg = w.cgroups.Open(id)
	// From here on the pid is the sandbox's: a failure kills it, so that
	// nothing unadopted runs on.
	defer func() {
		if err != nil {
			_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		}
	}()
	if sb.ids, err = bundleIDs(w.bundle(id)); err != nil {
		return nil, gone(err.Error())
	}
	if sb.layers, err = reopenLayers(pid, filepath.Join(w.bundle(id), "scratch")); err != nil {
		return nil, err
	}
	// Still ours after the reads above: the pidfd pins the pid.
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		sb.CloseFiles()
		return nil, gone("runsc exited while being adopted")
	}
	go func() { wall.WaitPidfd(pidf); close(sb.exited) }()
	return sb, nil
}

// bundleIDs is the host id range the bundle at bundle (root's, written by
// Create) maps the sandbox's user namespace to.
func bundleIDs(bundle string) (idRange, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return idRange{}, err
	}
	var s ociSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return idRange{}, fmt.Errorf("its bundle: %v", err)
	}
	if len(s.Linux.UIDMappings) != 1 || s.Linux.UIDMappings[0].ContainerID != 0 || s.Linux.UIDMappings[0].HostID == 0 {
		return idRange{}, fmt.Errorf("its bundle maps uids %+v", s.Linux.UIDMappings)
	}
	m := s.Linux.UIDMappings[0]
	return idRange{Base: m.HostID, Size: m.Size}, nil
}

// isRunscRun reports whether pid runs `runsc ... run --bundle bundle id`
// (or `restore --image-path DIR --bundle bundle id`).
func isRunscRun(pid int, bundle, id string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	n := len(args)
	if n < 4 || args[n-1] != id || args[n-2] != bundle || args[n-3] != "--bundle" {
		return false
	}
	// run, or restore from a checkpoint (restore --image-path DIR).
	return args[n-4] == "run" || (n >= 6 && args[n-5] == "--image-path" && args[n-6] == "restore")
}

// reopenLayers opens (O_PATH) the layers of the sandbox whose scratch is
// at scratch in the mount namespace of pid. The workspace's are its
// overlay's when one is mounted there, else the empty directory's.
func reopenLayers(pid int, scratch string) (l wall.Layers, err error) {
	at := func(p string) string { return fmt.Sprintf("/proc/%d/root%s", pid, filepath.Join(scratch, p)) }
	open := func(p string) (*os.File, error) {
		fd, err := unix.Open(at(p), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: reopen the sandbox's layer %s: %v", errdefs.ErrNotFound, p, err)
		}
		return os.NewFile(uintptr(fd), p), nil
	}
	defer func() {
		if err != nil {
			for _, f := range []*os.File{l.WorkspaceUpper, l.Workspace, l.RootUpper} {
				if f != nil {
					f.Close()
				}
			}
		}
	}()
	var ws, merged unix.Stat_t
	if err := unix.Stat(at("ws"), &ws); err != nil {
		return l, fmt.Errorf("%w: the sandbox's scratch: %v", errdefs.ErrNotFound, err)
	}
	if err := unix.Stat(at("ws/merged"), &merged); err != nil {
		return l, fmt.Errorf("%w: the sandbox's scratch: %v", errdefs.ErrNotFound, err)
	}
	changes, view := "wsempty", "wsempty"
	if merged.Dev != ws.Dev {
		changes, view = "ws/upper", "ws/merged"
	}
	if l.WorkspaceUpper, err = open(changes); err != nil {
		return l, err
	}
	if l.Workspace, err = open(view); err != nil {
		return l, err
	}
	l.RootUpper, err = open("rw/upper")
	return l, err
}

// Discard ends whatever is left of sandbox id that could not be adopted:
// every process of its cgroup (runsc run, which holds its lock, among
// them) is killed, and once its lock is free, gc removes the rest. It
// waits a few seconds at most.
func (w *Wall) Discard(id string) error {
	w.cgroups.Open(id).KillUntil(func() bool { return !w.Live(id) })
	_, err := w.GC()
	return err
}

// releaseLock gives up the sandbox's lock and uid lease: its own, or
// (adopted) the ones runsc run held, free once it is gone.
func (sb *Sandbox) releaseLock() {
	if sb.uid != nil {
		sb.uid.Lock.Release()
	} else {
		sb.w.leases.Reap()
	}
	if sb.lock != nil {
		sb.lock.Release()
	} else if l, err := lockfile.TryLock(sb.w.lockPath(sb.id)); err == nil && l != nil {
		l.Release()
	}
}
