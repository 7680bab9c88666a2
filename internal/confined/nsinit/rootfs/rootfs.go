// Package rootfs assembles a sandbox's root filesystem inside airlock
// init's mount namespace, before init confines itself: the size-capped
// scratch tmpfs, the generated top layer, the image's trees under their
// overlays, the writable places (workspace, /tmp, home), a minimal /dev,
// a masked /proc and /sys, and pivot_root into it. Only
// internal/confined/nsinit uses it; like init it imports nothing of airlock
// but internal/linux/mount.
package rootfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/linux/mount"
	"golang.org/x/sys/unix"
)

// Layout is what the host decided about the root (from nsinit.Config).
type Layout struct {
	Scratch     string // empty host directory the scratch tmpfs is mounted on
	DiskBytes   int64
	TreeTargets []string // where each image tree goes: "/" or a directory such as "/usr"
	Writable    bool     // the image under a writable layer (--writable-rootfs)
	Workspace   bool     // a workspace tree follows the image's
	Agent       bool     // long-lived: hand back the root's writable layer too
	HostNet     bool     // the host made the network namespace: no sysfs
	Files       []File   // generated into the top layer
	UID, GID    uint32   // the sandbox user
	Home        string
}

// File is one generated file (or directory, or symlink) of the top layer.
type File struct {
	Path     string // relative to the root, clean
	Mode     os.FileMode
	UID, GID uint32
	Data     string
	Link     string
}

// Root is a sandbox's root, assembled on one tmpfs owned by this mount
// namespace. Everything writable lives on that tmpfs, so --disk caps all of
// it and the kernel frees it when the sandbox's last reference goes.
type Root struct {
	cfg Layout
	s   string
	// ReadyFDs are the layers init hands the host (O_PATH): the workspace's
	// changes and its merged view, then, with Layout.Agent, the root's
	// writable layer.
	ReadyFDs []int
}

func (r *Root) p(parts ...string) string { return filepath.Join(append([]string{r.s}, parts...)...) }

// Assemble builds the sandbox's root at root/ of the scratch directory
// from the host's detached trees (fds: the image's, one per
// Layout.TreeTargets, then the workspace's when Layout.Workspace), in this
// order: the scratch, the image, the writable places, /dev, /proc and
// /sys, the layers handed back.
func Assemble(cfg Layout, fds []int) (*Root, error) {
	r := &Root{cfg: cfg, s: cfg.Scratch}
	return r, r.assemble(fds)
}

func (r *Root) assemble(fds []int) error {
	if err := r.scratch(); err != nil {
		return err
	}
	trees, ws := fds[:len(r.cfg.TreeTargets)], -1
	if r.cfg.Workspace {
		ws = fds[len(fds)-1]
	}
	root := r.p("root")
	if err := r.image(root, trees); err != nil {
		return err
	}
	if err := r.writable(root, ws); err != nil {
		return err
	}
	if err := r.kernelFS(root); err != nil {
		return err
	}
	if err := r.openLayers(root, ws); err != nil {
		return err
	}
	if !r.cfg.Writable {
		return mount.Remount(root, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV)
	}
	return nil
}

// scratch mounts the size-capped tmpfs everything writable lives on, makes
// its directories, and generates the top layer.
func (r *Root) scratch() error {
	cfg := r.cfg
	if err := mount.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := mount.Mount("tmpfs", r.s, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=755", cfg.DiskBytes)); err != nil {
		return err
	}
	for _, d := range []string{"gen", "image", "root", "rw/upper", "rw/work", "tmp", "home", "shm", "wsempty", "ws/lower", "ws/upper", "ws/work"} {
		if err := os.MkdirAll(r.p(d), 0o755); err != nil {
			return err
		}
	}
	user := func(p string, mode uint32) error {
		if err := unix.Chown(p, int(cfg.UID), int(cfg.GID)); err != nil {
			return fmt.Errorf("chown %s: %w", p, err)
		}
		return unix.Chmod(p, mode)
	}
	for p, mode := range map[string]uint32{r.p("tmp"): 0o1777, r.p("shm"): 0o1777} {
		if err := unix.Chmod(p, mode); err != nil {
			return err
		}
	}
	for _, p := range []string{r.p("home"), r.p("wsempty"), r.p("ws/upper")} {
		if err := user(p, 0o755); err != nil {
			return err
		}
	}
	return r.generate()
}

// overlayOpts are an overlay's mount options: read-only over lower when
// upper is "", else writable into upper (with work as its work directory).
func overlayOpts(lower, upper, work string) string {
	o := "lowerdir=" + lower
	if upper != "" {
		o += ",upperdir=" + upper + ",workdir=" + work
	}
	return o + ",userxattr"
}

// image mounts the root at root: the generated layer over the image's
// trees (the detached mounts in trees, one per Config.TreeTargets), each
// under a writable layer of its own with --writable-rootfs.
func (r *Root) image(root string, trees []int) error {
	cfg := r.cfg
	full := len(cfg.TreeTargets) > 0 && cfg.TreeTargets[0] == "/"
	switch {
	case full:
		if err := mount.MoveTo(trees[0], r.p("image")); err != nil {
			return err
		}
		opts := overlayOpts(r.p("gen")+":"+r.p("image"), "", "")
		if cfg.Writable {
			opts = overlayOpts(r.p("gen")+":"+r.p("image"), r.p("rw/upper"), r.p("rw/work"))
		}
		if err := mount.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return err
		}
		trees = trees[1:]
	case cfg.Writable:
		if err := mount.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, overlayOpts(r.p("gen"), r.p("rw/upper"), r.p("rw/work"))); err != nil {
			return err
		}
	default:
		if err := mount.Bind(r.p("gen"), root, 0); err != nil {
			return err
		}
	}
	for i, t := range cfg.TreeTargets {
		if full && i == 0 {
			continue
		}
		target := filepath.Join(root, t)
		fd := trees[0]
		trees = trees[1:]
		if !cfg.Writable {
			if err := mount.MoveTo(fd, target); err != nil {
				return err
			}
			continue
		}
		lower, up := r.p("sub", strconv.Itoa(i)), r.p("subrw", strconv.Itoa(i))
		for _, d := range []string{lower, up + "/upper", up + "/work"} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := mount.MoveTo(fd, lower); err != nil {
			return err
		}
		if err := mount.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, overlayOpts(lower, up+"/upper", up+"/work")); err != nil {
			return err
		}
	}
	return nil
}

// writable mounts the writable places, all on the scratch tmpfs: the
// workspace (the host's layer ws under a writable one, or an empty
// directory when ws < 0), /tmp and the home directory.
func (r *Root) writable(root string, ws int) error {
	if ws >= 0 {
		if err := mount.MoveTo(ws, r.p("ws/lower")); err != nil {
			return err
		}
		if err := mount.Mount("overlay", filepath.Join(root, "workspace"), "overlay", unix.MS_NOSUID|unix.MS_NODEV, overlayOpts(r.p("ws/lower"), r.p("ws/upper"), r.p("ws/work"))); err != nil {
			return err
		}
	} else if err := mount.Bind(r.p("wsempty"), filepath.Join(root, "workspace"), unix.MS_NOSUID|unix.MS_NODEV); err != nil {
		return err
	}
	for src, dst := range map[string]string{"tmp": "tmp", "home": r.cfg.Home} {
		if err := mount.Bind(r.p(src), filepath.Join(root, dst), unix.MS_NOSUID|unix.MS_NODEV); err != nil {
			return err
		}
	}
	return nil
}

// kernelFS mounts /dev, /proc and /sys, masking what of them a sandbox
// must not see.
func (r *Root) kernelFS(root string) error {
	if err := r.dev(root); err != nil {
		return err
	}
	if err := r.proc(root); err != nil {
		return err
	}
	// sysfs can be mounted only for a network namespace this user
	// namespace owns; in a host-made one /sys is an empty directory.
	if r.cfg.HostNet {
		if err := mount.MaskDir(filepath.Join(root, "sys")); err != nil {
			return err
		}
	} else if err := mount.Mount("sysfs", filepath.Join(root, "sys"), "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	for _, d := range []string{"sys/firmware", "sys/kernel/security", "sys/kernel/debug"} {
		if err := mount.MaskDir(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	return nil
}

// openLayers opens what init hands the host (readyFDs). The host reads
// the sandbox's changes through these, after it is gone: the layer
// holding every change (the overlay's upper layer, or the whole directory
// when the workspace started empty) and the merged view.
func (r *Root) openLayers(root string, ws int) error {
	changes := r.p("ws/upper")
	if ws < 0 {
		changes = r.p("wsempty")
	}
	for _, p := range []string{changes, filepath.Join(root, "workspace")} {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", p, err)
		}
		r.ReadyFDs = append(r.ReadyFDs, fd)
	}
	// A long-lived sandbox's root layer, for snapshots: every change to a
	// whole-root image's root (with --writable-rootfs) lands here.
	if r.cfg.Agent {
		fd, err := unix.Open(r.p("rw/upper"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open the root layer: %w", err)
		}
		r.ReadyFDs = append(r.ReadyFDs, fd)
	}
	return nil
}

// generate writes the top layer: mount points, /etc files, host copies.
func (r *Root) generate() error {
	gen := r.p("gen")
	for _, d := range []string{"proc", "sys", "dev", "tmp", "workspace", "etc", strings.TrimPrefix(r.cfg.Home, "/")} {
		if err := os.MkdirAll(filepath.Join(gen, d), 0o755); err != nil {
			return err
		}
	}
	for _, t := range r.cfg.TreeTargets {
		if err := os.MkdirAll(filepath.Join(gen, t), 0o755); err != nil {
			return err
		}
	}
	for _, f := range r.cfg.Files {
		if err := Write(gen, f, f.UID, f.GID); err != nil {
			return err
		}
	}
	return nil
}

// Write makes f below the directory gen (a file, a directory or a
// symlink, replacing what is there, its parents made), its permissions
// exactly f's and owned by uid:gid (a symlink itself, never its target).
// Both walls write their generated layer with it.
func Write(gen string, f File, uid, gid uint32) error {
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
	if err := unix.Lchown(p, int(uid), int(gid)); err != nil {
		return fmt.Errorf("lchown %s: %w", p, err)
	}
	return nil
}

// dev builds a minimal /dev: a few safe character devices bound from the
// host, a private devpts instance, shm; the tmpfs itself is read-only.
func (r *Root) dev(root string) error {
	dev := filepath.Join(root, "dev")
	if err := mount.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,mode=755"); err != nil {
		return err
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		p := filepath.Join(dev, n)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return err
		}
		if err := mount.Bind("/dev/"+n, p, unix.MS_NOSUID|unix.MS_NOEXEC); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	if err := mount.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return err
	}
	if err := mount.Bind(r.p("shm"), filepath.Join(dev, "shm"), unix.MS_NOSUID|unix.MS_NODEV); err != nil {
		return err
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "core": "/proc/kcore",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return mount.Remount(dev, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC)
}

// Masked and read-only /proc entries, as container runtimes do, plus the
// kernel symbol table and log.
var (
	maskedProcFiles = []string{"kcore", "keys", "timer_list", "sched_debug", "latency_stats", "timer_stats", "kallsyms", "kmsg", "kpagecount", "kpageflags", "kpagecgroup", "vmallocinfo", "sysrq-trigger", "config.gz"}
	maskedProcDirs  = []string{"acpi", "scsi", "asound", "driver", "tty/driver"}
	readOnlyProc    = []string{"bus", "fs", "irq", "sys"}
)

func (r *Root) proc(root string) error {
	proc := filepath.Join(root, "proc")
	if err := mount.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	devNull := filepath.Join(root, "dev/null")
	for _, f := range maskedProcFiles {
		if err := mount.MaskFile(devNull, filepath.Join(proc, f)); err != nil {
			return err
		}
	}
	for _, d := range maskedProcDirs {
		if err := mount.MaskDir(filepath.Join(proc, d)); err != nil {
			return err
		}
	}
	for _, d := range readOnlyProc {
		if err := mount.ReadOnly(filepath.Join(proc, d)); err != nil {
			return err
		}
	}
	return nil
}

// Pivot makes the assembled root the root (pivot_root) and detaches the old
// one.
func (r *Root) Pivot() error {
	root := r.p("root")
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir %s: %w", root, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	// The old root is stacked under the new one: detach it.
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("umount old root: %w", err)
	}
	return unix.Chdir("/")
}
