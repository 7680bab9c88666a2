// Package container is airlock's default wall (internal/wall): its own
// namespace launcher. It leases a uid range, creates the cgroup, clones
// `airlock-init init` from a sealed copy of airlock-init
// (internal/wall/container/sealedexe of internal/wall/initexe) into fresh
// namespaces, hands it idmapped mount trees and a Config over the sync
// socket, and tears everything down again. It makes the syscalls; policy
// (what to run, with which limits) arrives already validated, as
// wall.Options. It imports internal/wall, internal/wall/container/sealedexe,
// internal/wall/initexe, internal/wall/uidlease, internal/linux/*,
// internal/errdefs, internal/cleanup and nsinit (for the wire types),
// nothing above.
package container

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/cleanup"
	"github.com/airlock-sandbox/airlock/internal/confined/nsinit"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/linux/cgroup"
	"github.com/airlock-sandbox/airlock/internal/linux/landlock"
	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
	"github.com/airlock-sandbox/airlock/internal/linux/mount"
	"github.com/airlock-sandbox/airlock/internal/linux/seccomp/filter"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/wall/container/sealedexe"
	"github.com/airlock-sandbox/airlock/internal/wall/initexe"
	"github.com/airlock-sandbox/airlock/internal/wall/uidlease"
	"golang.org/x/sys/unix"
)

// Paths under the state directory (default /run/airlock).
const (
	scratchDir = "scratch"   // empty; each sandbox mounts its tmpfs here in its own namespace
	exeDir     = "exe"       // the immutable copy of the binary init runs from
	sandboxDir = "sandboxes" // one lock file per live sandbox
	initArgv0  = initexe.Name
)

// SandboxUID is the unprivileged user a command runs as by default.
const SandboxUID = wall.SandboxUID

// Scope names what a state directory owns outside it (its cgroup parent,
// its nftables tables): "airlock" for the default /run/airlock, and
// "airlock-<hash>" for any other, so that two airlocks with different state
// directories never take each other's sandboxes for dead.
func Scope(stateDir string) string {
	if filepath.Clean(stateDir) == "/run/airlock" {
		return "airlock"
	}
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return "airlock-" + hex.EncodeToString(sum[:4])
}

// Wall creates sandboxes on this host (wall.Wall).
type Wall struct {
	stateDir string
	log      *slog.Logger
	cgroups  *cgroup.Host
	leases   *uidlease.Pool
	exe      *sealedexe.Exe
	seccomp  []byte
}

// New checks the host's controls and prepares the state directory; its
// sandboxes run init from a sealed copy of bin. Missing cgroup
// controllers or seccomp are errors classed errdefs.ErrUnavailable; a
// missing or wrong airlock-init fails every create, saying why.
func New(stateDir string, bin *initexe.Init, log *slog.Logger) (*Wall, error) {
	rt := &Wall{
		stateDir: stateDir,
		log:      log,
		leases:   uidlease.Of(stateDir),
	}
	// Checking airlock-init and sealing a copy of it are the most
	// expensive steps of a cold start; begin them first, alongside the
	// rest of the set-up.
	rt.exe = sealedexe.New(filepath.Join(stateDir, exeDir), source(bin))
	go func() { _, _ = rt.exe.Get() }()
	cg, err := cgroup.Detect()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	if !filter.Supported() {
		return nil, errdefs.Unavailable("the kernel has no seccomp filter support")
	}
	prog, err := filter.Program()
	if err != nil {
		return nil, err
	}
	for _, d := range []struct {
		p    string
		mode os.FileMode
	}{{stateDir, 0o711}, {filepath.Join(stateDir, scratchDir), 0o755}, {filepath.Join(stateDir, uidlease.Dir), 0o700}, {filepath.Join(stateDir, sandboxDir), 0o700}} {
		if err := os.MkdirAll(d.p, d.mode); err != nil {
			return nil, fmt.Errorf("create state directory: %w", err)
		}
		if err := os.Chmod(d.p, d.mode); err != nil {
			return nil, err
		}
	}
	cg.Parent = Scope(stateDir)
	rt.cgroups = cg
	rt.seccomp = prog
	return rt, nil
}

// Sandbox is one live sandbox of this wall (wall.Sandbox).
type Sandbox struct {
	id  string
	rt  *Wall
	cmd *exec.Cmd
	cg  *cgroup.Cgroup
	uid *uidlease.Range

	lock      *lockfile.Lock
	sock      int
	oomStop   func()
	oom       chan struct{}
	killed    sync.Once
	closeOnce sync.Once

	// layers stay valid after the sandbox is gone, until CloseFiles.
	layers wall.Layers
	// initPid is init's pid on the host.
	initPid int

	pidfd  int           // init's pidfd, pidf's number
	pidf   *os.File      // init's pidfd (wall.OpenPidfd)
	exited chan struct{} // closed when init has exited
	agent  bool
}

// Reservation holds a sandbox id's lock from before anything is made for
// it (a workspace checkout, say) until the sandbox is destroyed; gc treats
// every locked id as alive.
type Reservation struct {
	id   string
	lock *lockfile.Lock
	used bool
}

// Reserve takes the lock of a new sandbox id.
func (rt *Wall) Reserve(id string) (wall.Reservation, error) {
	l, err := lockfile.TryLock(filepath.Join(rt.stateDir, sandboxDir, id+".lock"))
	if err != nil {
		return nil, err
	}
	if l == nil {
		return nil, fmt.Errorf("sandbox id %s is in use", id)
	}
	return &Reservation{id: id, lock: l}, nil
}

// ID is the reserved id.
func (r *Reservation) ID() string { return r.id }

// Release gives the id up unless a sandbox was created with it (the
// sandbox's Close releases it then).
func (r *Reservation) Release() {
	if !r.used {
		r.lock.Release()
		r.used = true
	}
}

// Live reports whether sandbox id is held by a live process.
func (rt *Wall) Live(id string) bool {
	l, err := lockfile.TryLock(filepath.Join(rt.stateDir, sandboxDir, id+".lock"))
	if err != nil || l == nil {
		return true
	}
	l.Release()
	return false
}

// Create builds and starts a sandbox. On any error every step already taken
// is undone and the reservation released.
func (rt *Wall) Create(wr wall.Reservation, o *wall.Options) (_ wall.Sandbox, err error) {
	r, ok := wr.(*Reservation)
	if !ok {
		return nil, fmt.Errorf("container wall: a reservation of another wall")
	}
	if o.Restore != nil {
		r.Release()
		return nil, errdefs.Invalid("a sandbox's memory is restored on the gvisor wall only")
	}
	id := r.id
	var undo cleanup.Stack
	defer undo.RunUnless(&err)
	sb := &Sandbox{id: id, rt: rt, oom: make(chan struct{}), sock: -1, pidfd: -1, exited: make(chan struct{}), agent: o.AgentSocket != ""}
	t0 := time.Now()
	lap := func(step string) { rt.log.Debug("create", "id", id, "step", step, "at", time.Since(t0)) }

	exe, err := rt.exe.Get()
	if err != nil {
		return nil, err
	}
	lap("sealed")
	if r.used {
		return nil, fmt.Errorf("reservation %s already used", id)
	}
	sb.lock = r.lock
	undo.Do(r.Release)
	// What must come before the sandbox (a one-shot run's start record,
	// scanned, signed and fsynced) is done while init is cloned and starts
	// its runtime: init is sent its Config, and with it leave to build the
	// root and start anything, only once BeforeStart returned nil (before
	// that it is a process of ours waiting on the sync socket). Create
	// never returns while BeforeStart runs.
	before := func() error { return nil }
	if o.BeforeStart != nil {
		done := make(chan error, 1)
		go func() { done <- o.BeforeStart() }()
		var once sync.Once
		var berr error
		before = func() error {
			once.Do(func() { berr = <-done })
			return berr
		}
		defer func() { _ = before() }()
	}
	if sb.uid, err = rt.leases.Acquire(); err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrResourceExhausted, err)
	}
	undo.Do(sb.uid.Lock.Release)
	limits := cgroup.Limits{MemoryBytes: o.MemoryBytes, CPUs: o.CPUs, Pids: o.Pids}
	if sb.agent && o.CommandPids > 0 {
		limits.Commands = &cgroup.CommandLimits{MemoryBytes: o.CommandMemoryBytes, Pids: o.CommandPids}
	}
	sb.cg, err = rt.cgroups.Create(id, limits)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	undo.Push(sb.cg.Remove)
	lap("cgroup")

	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	sb.sock = fds[0]
	child := os.NewFile(uintptr(fds[1]), "sync")
	undo.Do(func() { unix.Close(sb.sock) })
	if err := nsinit.MakeRoom(sb.sock); err != nil {
		return nil, fmt.Errorf("sync socket: %w", err)
	}

	cmd := &exec.Cmd{
		Path: fmt.Sprintf("/proc/self/fd/%d", exe.Fd()),
		Args: []string{initArgv0, "init"},
		// One P from the start: init's commands get the sandbox's
		// environment, never its own, and an idle agent with one P runs
		// fewer threads (each with its stacks) and hands work between
		// them less (BenchmarkServeIdleMemory: PSS 0.29 MiB less a
		// sandbox; setting it from inside, once running, saves nothing).
		Env: []string{"GOMAXPROCS=1"},
		Dir: "/",
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
				unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(sb.uid.Base), Size: int(sb.uid.Size)}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(sb.uid.Base), Size: int(sb.uid.Size)}},
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
			// If this process dies, so does init, and with it every process
			// of the sandbox's pid namespace.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if sb.agent && !o.DieWithCreator {
		// A long-lived sandbox outlives its creator (a daemon restart).
		cmd.SysProcAttr.Pdeathsig = 0
	}
	cmd.ExtraFiles = []*os.File{child, nil, nil, nil, sb.uid.Lock.File, sb.lock.File}
	if len(cmd.ExtraFiles)+3 > sealedexe.MinFD {
		return nil, fmt.Errorf("%w: too many descriptors for init", errdefs.ErrInternal)
	}
	if !o.TTY {
		cmd.ExtraFiles[1], cmd.ExtraFiles[2], cmd.ExtraFiles[3] = o.Stdio[0], o.Stdio[1], o.Stdio[2]
	}
	if o.NetNS != nil {
		cmd.SysProcAttr.Cloneflags &^= unix.CLONE_NEWNET
	}
	if err := rt.start(cmd, sb.cg, o.NetNS); err != nil {
		child.Close()
		return nil, fmt.Errorf("start init: %w", err)
	}
	child.Close()
	sb.cmd = cmd
	sb.initPid = cmd.Process.Pid
	lap("cloned")
	undo.Do(func() { sb.kill(); _ = cmd.Wait() })
	if sb.pidf, sb.pidfd, err = wall.OpenPidfd(sb.initPid); err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	// Closed and forgotten: a kill after this (an earlier undo step) must
	// not signal whatever file the number names next.
	undo.Do(func() { sb.pidf.Close(); sb.pidfd = -1 })

	if !sb.agent {
		// An OOM anywhere ends a one-shot sandbox: its command is the
		// sandbox. A long-lived sandbox's commands meet their own limit
		// and it lives on (the kernel kills the one process it picks).
		if sb.oomStop, err = sb.cg.WatchOOM(func() { close(sb.oom); sb.kill() }); err != nil {
			return nil, err
		}
		undo.Do(sb.oomStop)
	}

	if err := rt.configure(sb, o, limits.Commands != nil, before); err != nil {
		return nil, err
	}
	if sb.agent {
		// init is done with the sync socket; reap it when it ends.
		unix.Close(sb.sock)
		sb.sock = -1
		// Waited for in the poller, then reaped (at once: it has exited).
		go func() { wall.WaitPidfd(sb.pidf); _ = cmd.Wait(); close(sb.exited) }()
	}
	r.used = true
	lap("ready")
	return sb, nil
}

// start clones init into the sandbox's cgroup (and network namespace, when
// the host made one). With cgroup v2 the kernel places it in the cgroup
// atomically (CLONE_INTO_CGROUP); with v1 the calling thread steps into the
// cgroup for the clone, so that the child is born inside it and its cgroup
// namespace is rooted there. Likewise the thread steps into the host-made
// network namespace, which the child inherits, and steps back.
func (rt *Wall) start(cmd *exec.Cmd, cg *cgroup.Cgroup, netns *os.File) error {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	if netns != nil {
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			return err
		}
		defer orig.Close()
		if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns(net): %w", err)
		}
		defer func() {
			if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
				// The thread must not return to the pool in the wrong namespace.
				panic(fmt.Sprintf("runtime: cannot return to the host network namespace: %v", err))
			}
		}()
	}
	if cg.Version() == cgroup.V2 {
		dir, err := cg.OpenV2()
		if err != nil {
			return err
		}
		defer dir.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(dir.Fd())
		return cmd.Start()
	}
	restore, err := cg.EnterThread(unix.Gettid())
	if err != nil {
		return err
	}
	startErr := cmd.Start()
	if err := restore(); err != nil {
		if startErr == nil { // init exists but nobody will configure it
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return fmt.Errorf("leave sandbox cgroup: %w", err)
	}
	return startErr
}

// configure builds the idmapped trees with init's user namespace, waits
// for before, sends the Config, and waits for init to report ready.
func (rt *Wall) configure(sb *Sandbox, o *wall.Options, commands bool, before func() error) error {
	pid := sb.cmd.Process.Pid
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return fmt.Errorf("open init's user namespace: %w", err)
	}
	defer userns.Close()

	var trees []int
	defer func() {
		for _, fd := range trees {
			unix.Close(fd)
		}
	}()
	cfg := nsinit.Config{
		Version:   nsinit.ProtocolVersion,
		Hostname:  o.Hostname,
		Scratch:   filepath.Join(rt.stateDir, scratchDir),
		DiskBytes: o.DiskBytes,
		Writable:  o.Writable,
		Files:     files(o.Files),
		Home:      o.Home,
		Argv:      o.Argv,
		Env:       o.Env,
		Cwd:       o.Cwd,
		TTY:       o.TTY,
		Rows:      o.Rows,
		Cols:      o.Cols,
		NoFile:    o.NoFile,
		Landlock:  o.Landlock,
		NProc:     o.NProc,
		Agent:     o.AgentSocket != "",
		HostNet:   o.NetNS != nil,
		Seccomp:   rt.seccomp,
		UID:       SandboxUID,
		GID:       SandboxUID,
	}
	cfg.KeepCaps = o.KeepCaps
	if o.Root {
		cfg.UID, cfg.GID = 0, 0
	}
	for _, t := range o.Trees {
		fd, err := mount.IdmappedTree(t.HostPath, int(userns.Fd()), true)
		if err != nil {
			return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
		}
		trees = append(trees, fd)
		cfg.TreeTargets = append(cfg.TreeTargets, t.Target)
	}
	if o.Workspace != "" {
		fd, err := rt.workspaceTree(o.Workspace, sb.uid.Base+SandboxUID)
		if err != nil {
			return err
		}
		trees = append(trees, fd)
		cfg.Workspace = true
	}
	if o.AgentSocket != "" {
		fd, err := listenUnix(o.AgentSocket)
		if err != nil {
			return err
		}
		trees = append(trees, fd)
	}
	// The commands' cgroup's placement descriptors go last (closed here
	// by place.Close once init has its copies).
	var placeFDs []int
	if commands {
		place, err := sb.cg.CommandPlacement()
		if err != nil {
			return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
		}
		defer place.Close()
		cfg.Commands = "thread"
		if place.Procs != nil {
			cfg.Commands = "process"
		}
		for _, f := range place.Files() {
			placeFDs = append(placeFDs, int(f.Fd()))
		}
		cfg.CommandFDs = len(placeFDs)
	}
	if err := before(); err != nil {
		return err
	}
	if err := nsinit.Send(sb.sock, cfg, append(append([]int{}, trees...), placeFDs...)); err != nil {
		return fmt.Errorf("send config to init: %w", err)
	}
	var rep nsinit.Report
	fds, err := nsinit.Recv(sb.sock, &rep)
	if err != nil {
		return fmt.Errorf("init died during setup: %w", err)
	}
	if rep.Kind == "error" {
		return fmt.Errorf("%w: sandbox setup failed at %s: %s", errdefs.ErrUnavailable, rep.Step, rep.Error)
	}
	if rep.Kind != "ready" || len(fds) < 2 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return fmt.Errorf("%w: init sent %q with %d descriptors", errdefs.ErrInternal, rep.Kind, len(fds))
	}
	sb.layers.WorkspaceUpper = os.NewFile(uintptr(fds[0]), "ws-upper")
	sb.layers.Workspace = os.NewFile(uintptr(fds[1]), "ws")
	switch {
	case len(fds) > 2 && sb.agent:
		sb.layers.RootUpper = os.NewFile(uintptr(fds[2]), "root-upper")
	case len(fds) > 2:
		sb.layers.PTY = os.NewFile(uintptr(fds[2]), "pty")
	}
	rt.log.Debug("init steps", "id", sb.id, "steps", rep.Steps)
	return nil
}

// workspaceTree returns an idmapped clone of dir in which dir's owner (uid
// and gid) appears as hostID, the sandbox user; other owners stay unmapped.
// The mapping needs a user namespace of its own (mount.UserNS).
func (rt *Wall) workspaceTree(dir string, hostID uint32) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return -1, fmt.Errorf("%w: --workspace %s: %v", errdefs.ErrNotFound, dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return -1, errdefs.Invalid(fmt.Sprintf("--workspace %s: not a directory", dir))
	}
	ns, err := mount.UserNS(
		[]syscall.SysProcIDMap{{ContainerID: int(st.Uid), HostID: int(hostID), Size: 1}},
		[]syscall.SysProcIDMap{{ContainerID: int(st.Gid), HostID: int(hostID), Size: 1}})
	if err != nil {
		return -1, err
	}
	defer ns.Close()
	fd, err := mount.IdmappedTree(dir, int(ns.Fd()), true)
	if err != nil {
		return -1, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return fd, nil
}

// Wait blocks until the command exits (or init dies) and returns how.
func (sb *Sandbox) Wait() wall.Exit {
	var rep nsinit.Report
	fds, err := nsinit.Recv(sb.sock, &rep)
	for _, fd := range fds {
		unix.Close(fd)
	}
	ex := wall.Exit{}
	if err != nil || rep.Kind != "exit" {
		ex.InitDied = true
		ex.Code, ex.Signal = 128+int(unix.SIGKILL), int(unix.SIGKILL)
	} else {
		ex.Code, ex.Signal, ex.Error = rep.Code, rep.Signal, rep.Error
	}
	select {
	case <-sb.oom:
		ex.OOM = true
	default:
		if sb.cg.Stats().OOMKills > 0 {
			ex.OOM = true
		}
	}
	return ex
}

// Signal forwards sig to the command through init.
func (sb *Sandbox) Signal(sig unix.Signal) error {
	return unix.Kill(sb.cmd.Process.Pid, sig)
}

// Kill ends every process of the sandbox: SIGKILL to init takes its whole
// pid namespace with it.
func (sb *Sandbox) Kill() { sb.kill() }

func (sb *Sandbox) kill() {
	sb.killed.Do(func() {
		if sb.pidfd >= 0 {
			_ = unix.PidfdSendSignal(sb.pidfd, unix.SIGKILL, nil, 0)
			return
		}
		if sb.cmd != nil && sb.cmd.Process != nil {
			_ = sb.cmd.Process.Signal(unix.SIGKILL)
		}
	})
}

// Stats returns the kernel's accounting for the sandbox so far.
func (sb *Sandbox) Stats() wall.Stats {
	st := sb.cg.Stats()
	return wall.Stats{CPUTime: st.CPUTime, MemoryPeak: st.MemoryPeak, OOMKills: st.OOMKills, PidsLimited: st.PidsLimited}
}

// LimitEvents are the sandbox's OOM kills and refused forks so far.
func (sb *Sandbox) LimitEvents() (oomKills, pidsLimited int64) { return sb.cg.LimitEvents() }

// CPUTime is the CPU time the sandbox used so far.
func (sb *Sandbox) CPUTime() time.Duration { return sb.cg.CPUTime() }

// ID is the sandbox's id.
func (sb *Sandbox) ID() string { return sb.id }

// InitPid is init's pid on the host.
func (sb *Sandbox) InitPid() int { return sb.initPid }

// Layers are the descriptors of what the sandbox wrote, and its terminal.
func (sb *Sandbox) Layers() wall.Layers { return sb.layers }

// Destroy kills what is left, waits for init, removes the cgroup and
// releases the leases. The layers' descriptors stay valid until CloseFiles.
func (sb *Sandbox) Destroy() error {
	var err error
	sb.closeOnce.Do(func() {
		sb.kill()
		if sb.agent {
			// Frozen tasks do not die until thawed.
			if sb.cg.Frozen() {
				_ = sb.cg.Thaw()
			}
			<-sb.exited
		} else {
			_ = sb.cmd.Wait()
			close(sb.exited)
		}
		if sb.oomStop != nil {
			sb.oomStop()
		}
		if sb.sock >= 0 {
			unix.Close(sb.sock)
		}
		if sb.pidf != nil {
			sb.pidf.Close()
		}
		// The pid namespace is torn down asynchronously; Remove retries
		// while the cgroup is still busy.
		err = sb.cg.Remove()
		sb.releaseLocks()
	})
	return err
}

// CloseFiles closes the descriptors the sandbox handed out.
func (sb *Sandbox) CloseFiles() {
	l := sb.layers
	for _, f := range []*os.File{l.WorkspaceUpper, l.Workspace, l.PTY, l.RootUpper} {
		if f != nil {
			f.Close()
		}
	}
}

// GC removes what dead sandboxes left behind: cgroups and lock files of
// sandboxes whose holder is gone (an `airlock run` killed with SIGKILL). It
// never touches a live sandbox: liveness is the flock its init holds.
func (rt *Wall) GC() (removed []string, err error) {
	seen := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(rt.stateDir, sandboxDir))
	for _, e := range ents {
		if id, ok := cutSuffix(e.Name(), ".lock"); ok {
			seen[id] = true
		}
	}
	for _, id := range rt.cgroups.List() {
		seen[id] = true
	}
	var errs []error
	// uid leases of dead holders: their files stay behind (nobody unlinked
	// them); a lease nobody holds is free and its file can go.
	rt.leases.Reap()
	rt.exe.Reap()
	for id := range seen {
		l, lerr := lockfile.TryLock(filepath.Join(rt.stateDir, sandboxDir, id+".lock"))
		if lerr != nil {
			errs = append(errs, lerr)
			continue
		}
		if l == nil {
			continue // alive
		}
		cg := rt.cgroups.Open(id)
		for _, p := range cg.Procs() {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		if err := cg.Remove(); err != nil {
			errs = append(errs, err)
		}
		l.Release()
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

func cutSuffix(s, suf string) (string, bool) {
	if len(s) > len(suf) && s[len(s)-len(suf):] == suf {
		return s[:len(s)-len(suf)], true
	}
	return "", false
}

// source is what the sealed copy is made from: bin, opened and checked.
func source(bin *initexe.Init) func() (*os.File, error) {
	return func() (*os.File, error) {
		b, err := bin.Open()
		if err != nil {
			return nil, err
		}
		return b.File, nil
	}
}

// ProbeIdmap checks that an idmapped mount of dir can be made here, with a
// throwaway user namespace (for `airlock doctor`).
func ProbeIdmap(dir string) error {
	fd, err := (&Wall{}).workspaceTree(dir, uidlease.First)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// files are o's files as init's wire type.
func files(in []wall.File) []nsinit.File {
	out := make([]nsinit.File, len(in))
	for i, f := range in {
		out[i] = nsinit.File{Path: f.Path, Mode: f.Mode, UID: f.UID, GID: f.GID, Data: f.Data, Link: f.Link}
	}
	return out
}

// Name is "container" (wall.Wall).
func (rt *Wall) Name() string { return "container" }

// Version is "": the container wall is airlock's own code (wall.Wall).
func (rt *Wall) Version() string { return "" }

// Missing lists the controls this host lacks that a sandbox may run
// without when its spec says so (wall.Wall).
func (rt *Wall) Missing() []wall.Missing { return Missing() }

// Missing lists the controls this host lacks that a container sandbox may
// run without when its spec says so: Landlock. The gate (internal/lifecycle)
// and airlock doctor both read it.
func Missing() []wall.Missing {
	if abi := landlock.ABI(); abi < landlock.MinABI {
		return []wall.Missing{{Control: "landlock", Detail: fmt.Sprintf("Landlock is unavailable (kernel ABI %d, need %d): writes are confined by the read-only mounts only", abi, landlock.MinABI)}}
	}
	return nil
}

var _ wall.Wall = (*Wall)(nil)
var _ wall.Sandbox = (*Sandbox)(nil)
