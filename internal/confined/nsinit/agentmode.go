package nsinit

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// In agent mode init keeps the workspace's upper layer and merged view, and
// the root's writable layer, open at these descriptor numbers for the
// sandbox's whole life (and sends them to the host in this order).
const (
	AgentWorkspaceUpperFD = 90
	AgentWorkspaceFD      = 91
	AgentRootUpperFD      = 92 // the root's writable layer
)

// Agent is what init hands the in-sandbox agent when it serves one
// (Config.Agent) instead of running a single command.
type Agent struct {
	// Listener is a listening unix socket bound in a host directory that
	// no sandbox can see: only the host connects to it.
	Listener *os.File
	// Net, when set, is the listener itself (gVisor's, which the host
	// can have closed and bound again: gvisorsave.go); Listener is nil.
	Net net.Listener
	// Launcher starts commands with init's confinement.
	Launcher *Launcher
	UID, GID uint32 // the sandbox user
	Home     string
	Env      []string // the sandbox's base environment
	Cwd      string   // the default working directory
	// SignalResize: the terminals this init opens send no SIGWINCH on a
	// change of size (gVisor's devpts): the agent must (agent.Options).
	SignalResize bool
}

// Launcher starts, signals and reaps the sandbox's commands. Commands are
// forked from init's locked main thread: it alone carries the dropped
// capabilities, the Landlock domain and the rlimits the commands must
// inherit, and under Landlock's signal scoping only a thread of that domain
// may signal them. Every other thread of init (the agent's) only queues work
// for it.
type Launcher struct {
	work  chan func()
	place placement
	// ptyByName opens a terminal's peer by its name (gVisor's devpts has
	// no TIOCGPTPEER).
	ptyByName bool

	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

func newLauncher(place placement) *Launcher {
	return &Launcher{work: make(chan func()), place: place, waiters: map[int]chan syscall.WaitStatus{}}
}

// placement puts each command into the commands' cgroup, through
// descriptors the host opened (Config.Commands): the kernel checks their
// writes against the opener's credentials, so init needs no access to any
// cgroup file of its own.
type placement struct {
	enter, leave []int // "thread": the commands' tasks files, the sandbox's
	procs        int   // "process": the commands' cgroup.procs; -1 if none
}

func newPlacement(mode string, fds []int) (placement, error) {
	p := placement{procs: -1}
	switch {
	case mode == "" && len(fds) == 0:
	case mode == "thread" && len(fds) > 0 && len(fds)%2 == 0:
		p.enter, p.leave = fds[:len(fds)/2], fds[len(fds)/2:]
	case mode == "process" && len(fds) == 1:
		p.procs = fds[0]
	default:
		return p, fmt.Errorf("commands' cgroup: %q with %d descriptors", mode, len(fds))
	}
	return p, nil
}

// fork runs forkExec with the child placed in the commands' cgroup. With
// "thread" the calling thread (init's main thread, locked) is in the
// commands' cgroups for the fork only, so the child is born there; with
// "process" the child is moved as soon as it runs (one already ended and
// reaped needs nothing), and killed if it cannot be. A command is never left in init's cgroup.
func (p placement) fork(forkExec func() (int, error)) (int, error) {
	write := func(fds []int, val string) error {
		for _, fd := range fds {
			if _, err := unix.Write(fd, []byte(val)); err != nil {
				return fmt.Errorf("commands' cgroup: %w", err)
			}
		}
		return nil
	}
	if err := write(p.enter, "0"); err != nil {
		_ = write(p.leave, "0")
		return 0, err
	}
	pid, err := forkExec()
	var placeErr error
	if len(p.leave) > 0 {
		placeErr = write(p.leave, "0")
	}
	if err == nil && p.procs >= 0 {
		placeErr = write([]int{p.procs}, strconv.Itoa(pid))
		if errors.Is(placeErr, unix.ESRCH) {
			// It ran and ended before it could be placed: nothing to
			// place (reap, on this same thread, has not collected it
			// yet, so its pid is still its own).
			placeErr = nil
		}
	}
	if err == nil && placeErr != nil {
		_ = unix.Kill(pid, unix.SIGKILL) // reaped, and dropped, by reap
		return 0, placeErr
	}
	return pid, err
}

// ErrNotFound means the command's program was not found (exit code 127);
// it matches os.ErrNotExist.
var ErrNotFound error = notFound{}

type notFound struct{}

func (notFound) Error() string        { return "command not found" }
func (notFound) Is(target error) bool { return target == os.ErrNotExist }

// Start forks and execs argv[0], looked up in attr.Env's PATH, from init's
// main thread. attr.Sys must name the credentials: nothing runs as init.
func (l *Launcher) Start(argv []string, attr *syscall.ProcAttr) (int, error) {
	if len(argv) == 0 || attr == nil || attr.Sys == nil || attr.Sys.Credential == nil {
		return 0, errors.New("launcher: argv and credentials are required")
	}
	path, _, err := lookPath(argv[0], attr.Env)
	if err != nil {
		return 0, fmt.Errorf("%w: %s", ErrNotFound, argv[0])
	}
	type result struct {
		pid int
		err error
	}
	done := make(chan result, 1)
	l.work <- func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		pid, err := l.place.fork(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
		if err == nil {
			l.waiters[pid] = make(chan syscall.WaitStatus, 1)
		}
		done <- result{pid, err}
	}
	r := <-done
	if errors.Is(r.err, unix.ENOENT) {
		return 0, fmt.Errorf("%w: %s", ErrNotFound, argv[0])
	}
	return r.pid, r.err
}

// ttyGID is the group of a command's terminal: tty's, as devpts makes it.
const ttyGID = 5

// OpenPTY opens a terminal pair on the sandbox's devpts for a command
// running as uid.
func (l *Launcher) OpenPTY(uid uint32, rows, cols uint16) (master, slave *os.File, err error) {
	if l.ptyByName {
		return openPTYByName(uid, ttyGID, rows, cols)
	}
	return OpenPTY("/dev/pts/ptmx", uid, rows, cols)
}

// Signal sends sig to the process group of pid (every command leads one).
func (l *Launcher) Signal(pid int, sig syscall.Signal) error {
	done := make(chan error, 1)
	l.work <- func() { done <- unix.Kill(-pid, sig) }
	return <-done
}

// Wait blocks until pid, started by Start, has exited and what it left in
// its process group has been sent SIGKILL (a shell's "cmd &", a fork bomb's
// children). Each pid is waited for once.
func (l *Launcher) Wait(pid int) (syscall.WaitStatus, error) {
	l.mu.Lock()
	ch, ok := l.waiters[pid]
	l.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("pid %d was not started by the launcher", pid)
	}
	ws := <-ch
	l.mu.Lock()
	delete(l.waiters, pid)
	l.mu.Unlock()
	return ws, nil
}

// reap collects every child of init that has ended, on init's main thread
// when SIGCHLD says some have: the commands, whose process group it kills
// (only this thread may signal them) before Wait learns the status, and
// the orphans re-parented to init (dropped). One pass per SIGCHLD collects
// all that have ended, however many signals the kernel merged.
func (l *Launcher) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD, or none has ended yet
		}
		l.mu.Lock()
		ch, ok := l.waiters[pid]
		l.mu.Unlock()
		if ok {
			_ = unix.Kill(-pid, unix.SIGKILL)
			ch <- syscall.WaitStatus(ws) // buffered; Wait removes the entry
		}
	}
}

// serveAgent reports ready, lets the host go, and runs the agent until it
// fails; init's main thread launches commands for it meanwhile.
func serveAgent(cfg *Config, listener int, readyFDs []int, place placement, serve func(Agent) error) error {
	if serve == nil {
		return errors.New("this init has no agent")
	}
	lap("agent")
	if err := Send(SyncFD, Report{Kind: "ready", Steps: steps}, readyFDs); err != nil {
		return err
	}
	// The host may restart and need the workspace layers again: init keeps
	// them at fixed numbers, where the host reopens them through /proc.
	for i, fd := range readyFDs {
		if err := unix.Dup3(fd, AgentWorkspaceUpperFD+i, unix.O_CLOEXEC); err != nil {
			return err
		}
		unix.Close(fd)
	}
	// From here on the host may come and go; init does not depend on it.
	unix.Close(SyncFD)
	return runAgent(Agent{
		Listener: os.NewFile(uintptr(listener), "agent"),
		UID:      cfg.UID, GID: cfg.GID, Home: cfg.Home, Env: cfg.Env, Cwd: cfg.Cwd,
	}, place, false, serve)
}

// runAgent serves a (its Launcher made here) until the agent fails, and
// runs the commands' starts, signals and reaping on this, init's locked
// main thread: no thread of its own waits for children, and a command's
// end reaches the agent in one hand-over.
func runAgent(a Agent, place placement, ptyByName bool, serve func(Agent) error) error {
	l := newLauncher(place)
	l.ptyByName = ptyByName
	children := make(chan os.Signal, 1)
	signal.Notify(children, unix.SIGCHLD)
	l.reap() // any that ended before the subscription
	a.Launcher = l
	failed := make(chan error, 1)
	go func() { failed <- serve(a) }()
	for {
		select {
		case f := <-l.work:
			f()
		case <-children:
			l.reap()
		case <-signals:
			// The sandbox ends by SIGKILL from the host; nothing to forward.
		case err := <-failed:
			os.Exit(agentFailed(err))
		}
	}
}

// agentFailed is init's exit code when the agent stops; the host sees the
// sandbox die and records it.
func agentFailed(err error) int {
	fmt.Fprintf(os.Stderr, "airlock-init init: agent stopped: %v\n", err)
	return 1
}
