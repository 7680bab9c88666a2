package gvisor

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/cleanup"
	"github.com/airlock-sandbox/airlock/internal/confined/nsinit/rootfs"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/linux/cgroup"
	"github.com/airlock-sandbox/airlock/internal/linux/mount"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/wall/initexe"
	"golang.org/x/sys/unix"
)

// runscFlags are runsc's global flags for every sandbox: the cgroup the
// host made (runsc is born in it), and the host's own writable layers (no
// overlay of runsc's in memory, which the host could not read). The
// Sentry's platform (no /dev/kvm on these hosts) is systrap, one-shot or
// long-lived: its system calls cost a fraction of ptrace's. It holds as
// long as nothing freezes the Sentry's stubs under it (see Freeze).
var runscFlags = []string{"--ignore-cgroups", "--overlay2=none", "--platform=systrap"}

// networkFlags are runsc's network for sandbox o: none at all, or gVisor's
// own netstack on the veth of the namespace the host made (proxy mode).
// Either way the netstack is left out of a checkpoint: a restore builds a
// fresh one from the namespace it is given (the restored sandbox's own
// veth, address and routes; sockets open at the save are reset), so a
// sandbox is saved and restored alike whatever its network, and no copy
// ever holds its source's address.
func networkFlags(o *wall.Options) []string {
	if o.NetNS != nil {
		return []string{"--network=sandbox", "--save-restore-netstack=false"}
	}
	return []string{"--network=none", "--save-restore-netstack=false"}
}

// netnsPath is where runsc opens the network namespace o.NetNS: this
// process's descriptor of it, held until the sandbox is destroyed.
func netnsPath(o *wall.Options) string {
	if o.NetNS == nil {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), o.NetNS.Fd())
}

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
	// The sandbox's own host ids, from the pool the container wall
	// leases from too: no two sandboxes share one.
	if sb.uid, err = w.leases.Acquire(); err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrResourceExhausted, err)
	}
	undo.Do(sb.uid.Lock.Release)
	sb.ids = idRange{Base: sb.uid.Base, Size: sb.uid.Size}
	if sb.cg, err = w.cgroups.Create(r.id, cgroup.Limits{MemoryBytes: o.MemoryBytes, CPUs: o.CPUs, Pids: hostPids(o.Pids)}); err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	undo.Push(sb.cg.Remove)
	bundle := w.bundle(r.id)
	// Traversable (not readable) by the sandbox's root: the gofer opens
	// the bundle's root as it.
	if err := os.Mkdir(bundle, 0o711); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	undo.Do(func() { _ = os.RemoveAll(bundle) })
	if err := os.Chmod(bundle, 0o711); err != nil {
		return nil, err
	}
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
	var console *net.UnixListener // a terminal's (o.TTY)
	args := append(append([]string{"--root", filepath.Join(w.dir, runscRoot)}, runscFlags...), networkFlags(o)...)
	if long {
		// The agent binds its socket in the one host directory mounted
		// for it (agentDir); nothing else it may create or reach is a
		// host socket (see agentSocket).
		args = append(args, "--host-uds=create")
		if o.Restore != nil {
			// The restored sandbox has host ids of its own (a range
			// leased for it, not the checkpointed one's, which a fork's
			// source still holds): runsc would refuse a spec whose uid
			// maps differ from the checkpoint's, so it only says so, and
			// restoreMismatch refuses every other difference first.
			args = append(args, "--restore-spec-validation=warning", "restore", "--image-path", filepath.Join(o.Restore.Dir, checkpointImage), "--bundle", bundle, r.id)
		} else {
			args = append(args, "run", "--bundle", bundle, r.id)
		}
		// The gofer binds the agent's socket there as the sandbox's root.
		if err := os.Mkdir(filepath.Join(bundle, "agent"), 0o700); err != nil {
			return nil, err
		}
		if err := os.Chown(filepath.Join(bundle, "agent"), int(sb.ids.Base), int(sb.ids.Base)); err != nil {
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
		args = append(args, "run", "--bundle", bundle)
		if o.TTY {
			var sock string
			if console, sock, err = listenConsole(bundle); err != nil {
				return nil, err
			}
			defer console.Close()
			args = append(args, "--console-socket", sock, r.id)
		} else {
			args = append(args, "--pass-fd", "3:0", "--pass-fd", "4:1", "--pass-fd", "5:2", r.id)
		}
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
		// sandbox's lock and its uid lease for as long as it lives, and
		// the sandbox lives as long as runsc run (attached): one process
		// to adopt.
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, readyW, saidW
		cmd.ExtraFiles = []*os.File{sb.lock.File, sb.uid.Lock.File}
		if !o.DieWithCreator {
			cmd.SysProcAttr.Pdeathsig = 0
		}
	} else {
		// runsc's own diagnostics are kept apart from the command's streams.
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, saidW
		if !o.TTY {
			cmd.ExtraFiles = []*os.File{o.Stdio[0], o.Stdio[1], o.Stdio[2]}
		}
	}
	sb.cmd = cmd
	ready := make(chan started, 1)
	proceed := make(chan error, 1)
	go sb.run(o, bundle, ready, proceed)
	// What must come before the sandbox (the run's record) is done while
	// the bundle is built; runsc starts after it, or not at all.
	var before error
	if o.BeforeStart != nil {
		before = o.BeforeStart()
	}
	proceed <- before
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
		if o.Restore != nil {
			err = sb.restored(o.AgentSocket)
		} else {
			err = sb.agentReady(readyR, bundle, o.AgentSocket)
		}
		if err != nil {
			return nil, err
		}
	} else {
		sb.stderr = make(chan string, 1)
		go func() {
			b, _ := io.ReadAll(io.LimitReader(said, 64<<10))
			said.Close()
			sb.stderr <- string(b)
		}()
		if o.TTY {
			undo.Do(func() { sb.Kill(); <-sb.exited; sb.CloseFiles() })
			if sb.layers.PTY, err = sb.terminal(console, o.Rows, o.Cols); err != nil {
				return nil, err
			}
		}
	}
	r.used = true
	return sb, nil
}

// run builds the bundle on a thread of its own that enters a new mount
// namespace (never to return to the host's: the thread ends with the
// goroutine), starts runsc from it in the sandbox's cgroup once proceed
// says so (nil), reports on ready, and waits for runsc to end. Every mount
// it makes lives in that namespace and goes when runsc's last process
// does.
func (sb *Sandbox) run(o *wall.Options, bundle string, ready chan<- started, proceed <-chan error) {
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
	// The idmapped trees (the image's and, when it runs, the binary
	// gvisor-init runs from, shifted into the sandbox's ids; the
	// workspace, whose owner is the sandbox user) are made in the host's
	// namespace (detached: nothing of them shows there) and attached in
	// the new one.
	bin, err := sb.w.init.Open()
	if err != nil {
		fail(err)
		return
	}
	trees, exeTree, err := rangeTrees(bin, o, sb.ids)
	for _, fd := range append(trees, exeTree) {
		if fd >= 0 {
			defer unix.Close(fd)
		}
	}
	if err != nil {
		fail(err)
		return
	}
	wsTree := -1
	if o.Workspace != "" {
		fd, err := workspaceTree(o.Workspace, sb.ids)
		if err != nil {
			fail(err)
			return
		}
		wsTree = fd
		defer unix.Close(wsTree)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		fail(fmt.Errorf("unshare(CLONE_NEWNS): %w", err))
		return
	}
	// Nothing made here may propagate back to the host.
	if err := mount.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fail(err)
		return
	}
	l, err := sb.w.prepare(o, filepath.Join(bundle, "scratch"), sb.ids, trees, wsTree, exeTree, &layers)
	if err != nil {
		fail(err)
		return
	}
	l.NetNS = netnsPath(o)
	l.IDs = sb.ids
	l.Agent = filepath.Join(bundle, "agent")
	spec, err := bundleSpec(o, l)
	if err == nil && o.Restore != nil {
		var saved *ociSpec
		if saved, err = savedSpec(o.Restore.Dir); err == nil {
			err = restoreMismatch(saved, spec)
		}
	}
	if err == nil {
		var b []byte
		b, _ = json.Marshal(spec)
		err = os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
	}
	if err != nil {
		fail(err)
		return
	}
	if err := <-proceed; err != nil {
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
// where the bundle's mounts come from. trees are o.Trees' idmapped
// clones, one each. What the sandbox sees is owned in its host id range
// ids: its root's is ids.Base, as the Sentry and the gofer are.
func (w *Wall) prepare(o *wall.Options, scratch string, ids idRange, trees []int, wsTree, exeTree int, layers *wall.Layers) (layout, error) {
	var l layout
	p := func(parts ...string) string { return filepath.Join(append([]string{scratch}, parts...)...) }
	if len(trees) != len(o.Trees) {
		return l, fmt.Errorf("gvisor wall: %d trees for %d", len(trees), len(o.Trees))
	}
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return l, err
	}
	// Root's and traversable: the gofer opens the root and the mounts'
	// sources below as the sandbox's root.
	if err := mount.Mount("tmpfs", scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=711", o.DiskBytes)); err != nil {
		return l, err
	}
	for _, d := range []string{"gen", "root", "rw/upper", "rw/work", "tmp", "home", "wsempty", "ws/upper", "ws/work", "ws/merged", "ws/lower", "bin", "lower"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			return l, err
		}
	}
	if err := unix.Chmod(p("tmp"), 0o1777); err != nil {
		return l, err
	}
	user, _ := ids.host(wall.SandboxUID)
	for d, id := range map[string]uint32{"home": user, "wsempty": user, "ws/upper": user, "tmp": ids.Base, "rw/upper": ids.Base, "bin": ids.Base} {
		if err := os.Chown(p(d), int(id), int(id)); err != nil {
			return l, err
		}
	}
	if err := generate(p("gen"), o, ids); err != nil {
		return l, err
	}
	if o.Restore != nil {
		// /tmp and home as the checkpoint saved them.
		for _, d := range []string{"tmp", "home"} {
			if err := os.Remove(p(d)); err != nil {
				return l, err
			}
			if err := w.copyTree(filepath.Join(o.Restore.Dir, checkpointScratch, d), p(d)); err != nil {
				return l, fmt.Errorf("restore /%s: %w", d, err)
			}
			if err := shiftIDs(p(d), ids); err != nil {
				return l, fmt.Errorf("restore /%s: %w", d, err)
			}
		}
	}
	// The image's trees, as the sandbox's ids own them.
	lower := make([]string, len(trees))
	for i, fd := range trees {
		lower[i] = p("lower", strconv.Itoa(i))
		if err := os.Mkdir(lower[i], 0o755); err != nil {
			return l, err
		}
		if err := mount.MoveTo(fd, lower[i]); err != nil {
			return l, err
		}
	}
	l.Tmp, l.Home = p("tmp"), p("home")
	if runsInit(o) {
		// gvisor-init is airlock-init, read-only.
		if err := os.WriteFile(p("bin", initexe.Name), nil, 0o500); err != nil {
			return l, err
		}
		if err := mount.MoveTo(exeTree, p("bin", initexe.Name)); err != nil {
			return l, err
		}
		l.Bin = p("bin")
	}
	// The root.
	full := len(o.Trees) > 0 && o.Trees[0].Target == "/"
	switch {
	case full && o.Writable:
		l.Root = p("root")
		if err := overlay(l.Root, p("gen")+":"+lower[0], p("rw/upper"), p("rw/work")); err != nil {
			return l, err
		}
	case full:
		l.Root = p("root")
		if err := overlay(l.Root, p("gen")+":"+lower[0], "", ""); err != nil {
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
			l.Trees = append(l.Trees, lower[i])
			continue
		}
		l.TreesRW = true
		sub := p("sub", strconv.Itoa(i))
		for _, d := range []string{sub + "/merged", sub + "/upper", sub + "/work"} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return l, err
			}
		}
		if err := os.Chown(sub+"/upper", int(ids.Base), int(ids.Base)); err != nil {
			return l, err
		}
		if err := overlay(sub+"/merged", lower[i], sub+"/upper", sub+"/work"); err != nil {
			return l, err
		}
		l.Trees = append(l.Trees, sub+"/merged")
	}
	// The workspace: the host's directory, or an empty one, under a
	// writable layer. Always an overlay: runsc marks a bind mount of one
	// (overlayfs_stale_read), and a checkpoint restores only into the
	// mounts it was taken with, whichever workspace the restored sandbox
	// has.
	wsLower := p("wsempty")
	if o.Workspace != "" {
		if err := mount.MoveTo(wsTree, p("ws/lower")); err != nil {
			return l, err
		}
		wsLower = p("ws/lower")
	}
	if err := overlay(p("ws/merged"), wsLower, p("ws/upper"), p("ws/work")); err != nil {
		return l, err
	}
	changes, merged := p("ws/upper"), p("ws/merged")
	l.Workspace = merged
	var err error
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

// rangeTrees are detached, read-only, idmapped clones in which host id n
// appears as ids' n (root's files as the sandbox's root's): one per tree
// of o's image, and, when gvisor-init runs (runsInit), one of the binary
// it runs from (bin, the file that was checked, whatever later replaces it
// at its path; -1 for a one-shot command). The Sentry sees its
// files' owners through its user namespace, which maps ids alone.
func rangeTrees(bin *initexe.Binary, o *wall.Options, ids idRange) (trees []int, exe int, err error) {
	exe = -1
	if len(o.Trees) == 0 && !runsInit(o) {
		return nil, exe, nil
	}
	ns, err := mount.UserNS([]syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ids.Base), Size: int(ids.Size)}}, nil)
	if err != nil {
		return nil, exe, err
	}
	defer ns.Close()
	for _, t := range o.Trees {
		fd, err := mount.IdmappedTree(t.HostPath, int(ns.Fd()), true)
		if err != nil {
			return trees, exe, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
		}
		trees = append(trees, fd)
	}
	if runsInit(o) {
		if exe, err = mount.IdmappedTree(fmt.Sprintf("/proc/self/fd/%d", bin.File.Fd()), int(ns.Fd()), true); err != nil {
			return trees, -1, fmt.Errorf("%w: the binary gvisor-init runs from: %v", errdefs.ErrUnavailable, err)
		}
	}
	return trees, exe, nil
}

// workspaceTree is a detached, read-only, idmapped tree of the host's
// workspace directory in which its owner appears as the sandbox user of
// ids (so that the sandbox user may write the files it was given); other
// owners stay unmapped.
func workspaceTree(dir string, ids idRange) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return -1, fmt.Errorf("%w: --workspace %s: %v", errdefs.ErrNotFound, dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return -1, errdefs.Invalid(fmt.Sprintf("--workspace %s: not a directory", dir))
	}
	user, _ := ids.host(wall.SandboxUID)
	ns, err := mount.UserNS(
		[]syscall.SysProcIDMap{{ContainerID: int(st.Uid), HostID: int(user), Size: 1}},
		[]syscall.SysProcIDMap{{ContainerID: int(st.Gid), HostID: int(user), Size: 1}})
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

func openPath(p string) (*os.File, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	return os.NewFile(uintptr(fd), p), nil
}

// generate writes the top layer: the mount points, then o.Files (passwd,
// group, hosts, the image's symlinks), owned as given inside the sandbox's
// ids (the Sentry sees host id ids.Base+n as n); what it makes for itself
// is the sandbox root's.
func generate(gen string, o *wall.Options, ids idRange) error {
	for _, d := range mountPoints(o) {
		if err := os.MkdirAll(filepath.Join(gen, d), 0o755); err != nil {
			return err
		}
	}
	for _, f := range o.Files {
		if !filepath.IsLocal(f.Path) {
			return fmt.Errorf("gvisor wall: file %q", f.Path)
		}
		uid, uok := ids.host(f.UID)
		gid, gok := ids.host(f.GID)
		if !uok || !gok {
			return fmt.Errorf("gvisor wall: file %q owned by %d:%d, outside the sandbox's ids", f.Path, f.UID, f.GID)
		}
		if err := rootfs.Write(gen, rootfs.File(f), uid, gid); err != nil {
			return err
		}
	}
	// The directories made above (mount points, files' parents).
	return filepath.WalkDir(gen, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Uid != 0 {
			return nil
		}
		return unix.Lchown(p, int(ids.Base), int(ids.Base))
	})
}
