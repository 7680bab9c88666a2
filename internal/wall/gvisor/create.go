package gvisor

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/cleanup"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/linux/cgroup"
	"github.com/airlock-sandbox/airlock/internal/linux/mount"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"golang.org/x/sys/unix"
)

// runscFlags are runsc's global flags for every sandbox: the cgroup the
// host made (runsc is born in it), and the host's own writable layers (no
// overlay of runsc's in memory, which the host could not read).
var runscFlags = []string{"--ignore-cgroups", "--overlay2=none"}

// networkFlag is runsc's network for sandbox o: none at all, or gVisor's
// own netstack on the veth of the namespace the host made (proxy mode).
func networkFlag(o *wall.Options) string {
	if o.NetNS != nil {
		return "--network=sandbox"
	}
	return "--network=none"
}

// netnsPath is where runsc opens the network namespace o.NetNS: this
// process's descriptor of it, held until the sandbox is destroyed.
func netnsPath(o *wall.Options) string {
	if o.NetNS == nil {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), o.NetNS.Fd())
}

// The Sentry's platform (no /dev/kvm on these hosts): systrap for a
// one-shot command. A long-lived sandbox runs on ptrace: with the pinned
// runsc, systrap loses the agent's address space (its stub subprocess is
// killed: "systrap corrupted memory: subprocess died") once the agent has
// started a few commands and then grows its heap, which ends the sandbox;
// ptrace does not, at a cost in system-call speed.
const (
	oneShotPlatform   = "--platform=systrap"
	longLivedPlatform = "--platform=ptrace"
)

// started is what the bundle goroutine reports once runsc runs (or not).
type started struct {
	err    error
	layers wall.Layers
	pid    int
}

// Create builds sandbox o under r and starts its command. On error every
// step taken is undone and r is released.
func (w *Wall) Create(wr wall.Reservation, o *wall.Options) (_ wall.Sandbox, err error) {
	r, ok := wr.(*Reservation)
	if !ok {
		return nil, fmt.Errorf("gvisor wall: a reservation of another wall")
	}
	if r.used {
		return nil, fmt.Errorf("reservation %s already used", r.id)
	}
	if err := supported(o); err != nil {
		return nil, errdefs.Invalid(err.Error())
	}
	if rs := w.Runsc(); rs.Err != nil {
		return nil, rs.Err
	}
	var undo cleanup.Stack
	defer undo.RunUnless(&err)
	undo.Do(r.Release)
	long := o.AgentSocket != ""
	sb := &Sandbox{id: r.id, w: w, lock: r.lock, oom: make(chan struct{}), exited: make(chan struct{}), agent: long}
	if sb.cg, err = w.cgroups.Create(r.id, cgroup.Limits{MemoryBytes: o.MemoryBytes, CPUs: o.CPUs, Pids: o.Pids}); err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	undo.Push(sb.cg.Remove)
	bundle := w.bundle(r.id)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	undo.Do(func() { _ = os.RemoveAll(bundle) })
	if !long {
		// An OOM anywhere in the cgroup (the Sentry's memory is the
		// sandbox's) ends a one-shot sandbox, as on the container wall.
		// A long-lived one dies of it by itself (the kernel kills the
		// Sentry, and runsc run ends): Done says so.
		if sb.oomStop, err = sb.cg.WatchOOM(func() { close(sb.oom); sb.Kill() }); err != nil {
			return nil, err
		}
		undo.Do(sb.oomStop)
	}
	var cmd *exec.Cmd
	var said io.ReadCloser // runsc's own diagnostics
	var saidW, readyW *os.File
	var readyR *os.File
	args := append(append([]string{"--root", filepath.Join(w.dir, runscRoot)}, runscFlags...), networkFlag(o))
	if long {
		// The agent binds its socket in the one host directory mounted
		// for it (agentDir); nothing else it may create or reach is a
		// host socket (see agentSocket).
		args = append(args, longLivedPlatform, "--host-uds=create", "run", "--bundle", bundle, r.id)
		if err := os.Mkdir(filepath.Join(bundle, "agent"), 0o700); err != nil {
			return nil, err
		}
		if readyR, readyW, err = os.Pipe(); err != nil {
			return nil, err
		}
		defer readyR.Close()
		// runsc outlives this process (a daemon restart): what it says
		// goes to a file, never to a pipe whose reader may be gone.
		if saidW, err = os.OpenFile(filepath.Join(bundle, runscLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND|unix.O_CLOEXEC, 0o600); err != nil {
			return nil, err
		}
	} else {
		args = append(args, oneShotPlatform, "run", "--bundle", bundle, "--pass-fd", "3:0", "--pass-fd", "4:1", "--pass-fd", "5:2", r.id)
		var errPipe *os.File
		if errPipe, saidW, err = os.Pipe(); err != nil {
			return nil, err
		}
		said = errPipe
	}
	cmd = exec.Command(w.runsc, args...)
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if long {
		// gvisor-init's stdout is the ready pipe; runsc run holds the
		// sandbox's lock for as long as it lives, and the sandbox lives as
		// long as runsc run (attached): one process to adopt.
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, readyW, saidW
		cmd.ExtraFiles = []*os.File{sb.lock.File}
		if !o.DieWithCreator {
			cmd.SysProcAttr.Pdeathsig = 0
		}
	} else {
		// runsc's own diagnostics are kept apart from the command's streams.
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, saidW
		cmd.ExtraFiles = []*os.File{o.Stdio[0], o.Stdio[1], o.Stdio[2]}
	}
	sb.cmd = cmd
	ready := make(chan started, 1)
	go sb.run(o, bundle, ready)
	st := <-ready
	saidW.Close()
	if readyW != nil {
		readyW.Close()
	}
	if st.err != nil {
		if said != nil {
			said.Close()
		}
		<-sb.exited
		return nil, st.err
	}
	sb.layers, sb.pid = st.layers, st.pid
	if long {
		undo.Do(func() { sb.Kill(); <-sb.exited; sb.CloseFiles() })
		if err := sb.agentReady(readyR, bundle, o.AgentSocket); err != nil {
			return nil, err
		}
	} else {
		sb.stderr = make(chan string, 1)
		go func() {
			b, _ := io.ReadAll(io.LimitReader(said, 64<<10))
			said.Close()
			sb.stderr <- string(b)
		}()
	}
	r.used = true
	return sb, nil
}

// run builds the bundle on a thread of its own that enters a new mount
// namespace (never to return to the host's: the thread ends with the
// goroutine), starts runsc from it in the sandbox's cgroup, reports on
// ready, and waits for runsc to end. Every mount it makes lives in that
// namespace and goes when runsc's last process does.
func (sb *Sandbox) run(o *wall.Options, bundle string, ready chan<- started) {
	runtime.LockOSThread() // not unlocked: the thread dies with the goroutine
	defer close(sb.exited)
	var layers wall.Layers
	fail := func(err error) {
		for _, f := range []*os.File{layers.WorkspaceUpper, layers.Workspace, layers.RootUpper} {
			if f != nil {
				f.Close()
			}
		}
		ready <- started{err: err}
	}
	// The workspace's idmapped tree is made in the host's namespace
	// (detached: nothing of it shows there) and attached in the new one.
	wsTree := -1
	if o.Workspace != "" {
		fd, err := workspaceTree(o.Workspace)
		if err != nil {
			fail(err)
			return
		}
		wsTree = fd
		defer unix.Close(wsTree)
	}
	// So is the binary gvisor-init runs from: this one, as it runs now
	// (whatever later replaces the file it came from).
	exeTree := -1
	if o.AgentSocket != "" {
		fd, err := mount.ReadOnlyClone("/proc/self/exe")
		if err != nil {
			fail(err)
			return
		}
		exeTree = fd
		defer unix.Close(exeTree)
	}
	// And the image's trees (cloneTrees).
	trees, err := cloneTrees(o.Trees)
	if err != nil {
		fail(err)
		return
	}
	defer closeTrees(trees)
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		fail(fmt.Errorf("unshare(CLONE_NEWNS): %w", err))
		return
	}
	// Nothing made here may propagate back to the host.
	if err := mount.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fail(err)
		return
	}
	l, err := prepare(o, filepath.Join(bundle, "scratch"), trees, wsTree, exeTree, &layers)
	if err != nil {
		fail(err)
		return
	}
	l.NetNS = netnsPath(o)
	l.Agent = filepath.Join(bundle, "agent")
	spec, err := bundleSpec(o, l)
	if err == nil {
		var b []byte
		b, _ = json.Marshal(spec)
		err = os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
	}
	if err != nil {
		fail(err)
		return
	}
	if err := sb.start(); err != nil {
		fail(fmt.Errorf("start runsc: %w", err))
		return
	}
	ready <- started{layers: layers, pid: sb.cmd.Process.Pid}
	err = sb.cmd.Wait()
	sb.waitErr = err
}

// start starts runsc in the sandbox's cgroup: v2 places it atomically
// (CLONE_INTO_CGROUP); on v1 the thread steps into the cgroup for the
// fork, so that runsc and all it starts are born inside.
func (sb *Sandbox) start() error {
	if sb.cg.Version() == cgroup.V2 {
		dir, err := sb.cg.OpenV2()
		if err != nil {
			return err
		}
		defer dir.Close()
		sb.cmd.SysProcAttr.UseCgroupFD = true
		sb.cmd.SysProcAttr.CgroupFD = int(dir.Fd())
		return sb.cmd.Start()
	}
	restore, err := sb.cg.EnterThread(unix.Gettid())
	if err != nil {
		return err
	}
	startErr := sb.cmd.Start()
	if err := restore(); err != nil && startErr == nil {
		_ = sb.cmd.Process.Kill()
		_ = sb.cmd.Wait()
		return fmt.Errorf("leave the sandbox's cgroup: %w", err)
	}
	return startErr
}

// prepare makes the sandbox's directories at scratch (in this thread's
// mount namespace): the size-capped tmpfs, the generated top layer, the
// root (the generated layer over the image, writable with
// --writable-rootfs), the trees' writable overlays, the workspace's
// overlay; it opens the layers the host reads (into layers) and returns
// where the bundle's mounts come from. trees are the clones of o.Trees
// (cloneTrees).
func prepare(o *wall.Options, scratch string, trees []int, wsTree, exeTree int, layers *wall.Layers) (layout, error) {
	var l layout
	p := func(parts ...string) string { return filepath.Join(append([]string{scratch}, parts...)...) }
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return l, err
	}
	if err := mount.Mount("tmpfs", scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=700", o.DiskBytes)); err != nil {
		return l, err
	}
	for _, d := range []string{"gen", "root", "rw/upper", "rw/work", "tmp", "home", "wsempty", "ws/upper", "ws/work", "ws/merged", "ws/lower", "bin", "trees"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			return l, err
		}
	}
	if err := unix.Chmod(p("tmp"), 0o1777); err != nil {
		return l, err
	}
	for _, d := range []string{"home", "wsempty", "ws/upper"} {
		if err := os.Chown(p(d), wall.SandboxUID, wall.SandboxUID); err != nil {
			return l, err
		}
	}
	if err := generate(p("gen"), o); err != nil {
		return l, err
	}
	l.Tmp, l.Home = p("tmp"), p("home")
	if o.AgentSocket != "" {
		// gvisor-init is this binary, read-only.
		if err := os.WriteFile(p("bin", "airlock"), nil, 0o500); err != nil {
			return l, err
		}
		if err := mount.MoveTo(exeTree, p("bin", "airlock")); err != nil {
			return l, err
		}
		l.Bin = p("bin")
	}
	src, err := attachTrees(trees, p("trees"))
	if err != nil {
		return l, err
	}
	// The root.
	full := len(o.Trees) > 0 && o.Trees[0].Target == "/"
	switch {
	case full && o.Writable:
		l.Root = p("root")
		if err := overlay(l.Root, p("gen")+":"+src[0], p("rw/upper"), p("rw/work")); err != nil {
			return l, err
		}
	case full:
		l.Root = p("root")
		if err := overlay(l.Root, p("gen")+":"+src[0], "", ""); err != nil {
			return l, err
		}
	case o.Writable:
		l.Root = p("root")
		if err := overlay(l.Root, p("gen"), p("rw/upper"), p("rw/work")); err != nil {
			return l, err
		}
	default:
		l.Root = p("gen")
	}
	for i, t := range o.Trees {
		if t.Target == "/" {
			continue
		}
		if !o.Writable {
			l.Trees = append(l.Trees, src[i])
			continue
		}
		l.TreesRW = true
		sub := p("sub", strconv.Itoa(i))
		for _, d := range []string{sub + "/merged", sub + "/upper", sub + "/work"} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return l, err
			}
		}
		if err := overlay(sub+"/merged", src[i], sub+"/upper", sub+"/work"); err != nil {
			return l, err
		}
		l.Trees = append(l.Trees, sub+"/merged")
	}
	// The workspace: the host's directory under a writable layer, or an
	// empty directory.
	changes, merged := p("wsempty"), p("wsempty")
	if o.Workspace != "" {
		if err := mount.MoveTo(wsTree, p("ws/lower")); err != nil {
			return l, err
		}
		if err := overlay(p("ws/merged"), p("ws/lower"), p("ws/upper"), p("ws/work")); err != nil {
			return l, err
		}
		changes, merged = p("ws/upper"), p("ws/merged")
	}
	l.Workspace = merged
	if layers.WorkspaceUpper, err = openPath(changes); err != nil {
		return l, err
	}
	if layers.Workspace, err = openPath(merged); err != nil {
		return l, err
	}
	if layers.RootUpper, err = openPath(p("rw/upper")); err != nil {
		return l, err
	}
	return l, nil
}

// overlay mounts an overlay at target: read-only over lower when upper is
// "", else writable into upper.
func overlay(target, lower, upper, work string) error {
	for _, d := range strings.Split(lower, ":") {
		if strings.ContainsAny(d, ",") {
			return fmt.Errorf("overlay: layer path %q", d)
		}
	}
	opts := "lowerdir=" + lower
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	}
	return mount.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts)
}

// workspaceTree is a detached, read-only, idmapped tree of the host's
// workspace directory in which its owner appears as the sandbox user
// (gVisor shows the host's ids: without the mapping the sandbox user could
// not write the files it was given).
func workspaceTree(dir string) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return -1, fmt.Errorf("%w: --workspace %s: %v", errdefs.ErrNotFound, dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return -1, errdefs.Invalid(fmt.Sprintf("--workspace %s: not a directory", dir))
	}
	ns, done, err := userns(st.Uid, st.Gid)
	if err != nil {
		return -1, err
	}
	defer done()
	fd, err := mount.IdmappedTree(dir, int(ns.Fd()), true)
	if err != nil {
		return -1, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return fd, nil
}

// userns starts a short-lived process (`airlock userns-hold`, this
// binary) owning a user namespace that maps uid and gid to the sandbox
// user, and returns the namespace; done ends the process.
func userns(uid, gid uint32) (*os.File, func(), error) {
	hold := exec.Command("/proc/self/exe", "userns-hold")
	hold.Args[0] = "airlock"
	hold.Env = []string{}
	hold.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(uid), HostID: wall.SandboxUID, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(gid), HostID: wall.SandboxUID, Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	stdin, err := hold.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := hold.Start(); err != nil {
		return nil, nil, fmt.Errorf("start userns helper: %w", err)
	}
	done := func() { stdin.Close(); _ = hold.Wait() }
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", hold.Process.Pid))
	if err != nil {
		done()
		return nil, nil, err
	}
	return ns, func() { ns.Close(); done() }, nil
}

func openPath(p string) (*os.File, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	return os.NewFile(uintptr(fd), p), nil
}

// generate writes the top layer: the mount points, then o.Files (passwd,
// group, hosts, the image's symlinks), owned as given: gVisor shows the
// host's ids as they are.
func generate(gen string, o *wall.Options) error {
	for _, d := range mountPoints(o) {
		if err := os.MkdirAll(filepath.Join(gen, d), 0o755); err != nil {
			return err
		}
	}
	for _, f := range o.Files {
		if !filepath.IsLocal(f.Path) {
			return fmt.Errorf("gvisor wall: file %q", f.Path)
		}
		p := filepath.Join(gen, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		_ = os.Remove(p)
		var err error
		switch {
		case f.Mode.IsDir():
			err = os.MkdirAll(p, f.Mode.Perm())
		case f.Link != "":
			err = os.Symlink(f.Link, p)
		default:
			err = os.WriteFile(p, []byte(f.Data), f.Mode.Perm())
		}
		if err != nil {
			return err
		}
		if f.Link == "" {
			if err := unix.Chmod(p, uint32(f.Mode.Perm())); err != nil {
				return err
			}
		}
		if err := unix.Lchown(p, int(f.UID), int(f.GID)); err != nil {
			return fmt.Errorf("lchown %s: %w", p, err)
		}
	}
	return nil
}
