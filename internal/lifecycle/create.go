package lifecycle

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/cleanup"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image/rootfs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle/hostfiles"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"golang.org/x/sys/unix"
)

// Options are what differs between a long-lived and a one-shot sandbox,
// and where its egress decisions go.
type Options struct {
	// Command, when set, makes a one-shot sandbox: the spec's command runs
	// as its first process with these streams (internal/run). Unset, the
	// sandbox is long-lived and serves the agent.
	Command *Command
	// OnEgress sees every egress decision of a proxy-mode sandbox.
	OnEgress func(eventlog.Event)
	// NetLog receives one JSON line per egress decision.
	NetLog io.Writer
	// BeforeStart, when set, is called with the prepared sandbox before
	// anything of the sandbox's command runs (the wall's BeforeStart: it
	// may be building the sandbox meanwhile); an error stops the create (a
	// one-shot command that could not be recorded never runs).
	BeforeStart func(*Sandbox) error
}

// Command is a one-shot sandbox's command's terminal or streams.
type Command struct {
	// Stdio are the command's stdin, stdout and stderr (the sandbox keeps
	// its own copies); unused with TTY.
	Stdio      [3]*os.File
	TTY        bool
	Rows, Cols uint16
}

// Create makes sandbox id from s: the one construction path. On error
// everything already made is given back.
func (l *Lifecycle) Create(ctx context.Context, id string, s *spec.Spec, o Options) (_ *Sandbox, err error) {
	if o.Command != nil {
		err = s.Validate()
	} else {
		err = s.ValidateLongLived()
	}
	if err != nil {
		return nil, err
	}
	wl, err := l.wallOf(s.Wall())
	if err != nil {
		return nil, err
	}
	degraded, err := l.gate(wl, s)
	if err != nil {
		return nil, err
	}
	var undo cleanup.Stack
	defer undo.RunUnless(&err)
	sb := &Sandbox{id: id, wall: wl.Name(), wallVersion: wl.Version(), image: s.Image, writable: s.WritableRootfs, degraded: degraded, dataDir: l.cfg.DataDir}
	if sb.host, err = l.openHost(s); err != nil {
		return nil, err
	}
	undo.Do(sb.host.Close)
	if sb.layout, err = l.images.ResolveAt(ctx, s.Image, sb.host.Image, l.cfg.Warn); err != nil {
		return nil, err
	}
	undo.Do(sb.layout.Done)
	res, err := wl.Reserve(id)
	if err != nil {
		return nil, err
	}
	defer res.Release()
	sb.wsDir = sb.host.WorkspaceDir()
	switch {
	case s.Repo != "":
		dir, remove, err := sb.host.Checkout(ctx, s, filepath.Dir(l.workspaceDir(id)), id)
		if err != nil {
			return nil, err
		}
		sb.wsDir = dir
		undo.Do(remove)
	case l.copiesWorkspace(s):
		dir, remove, err := l.copyWorkspace(ctx, sb.host.Workspace, s.Workspace, id)
		if err != nil {
			return nil, err
		}
		sb.wsDir = dir
		undo.Do(remove)
	}
	if s.NetMode() == "proxy" {
		// First: the broker's session mints the grants' placeholders
		// into s.Env, which the command's environment is made from.
		if sb.net, err = sandboxnet.Setup(&l.cfg.Net, id, s, o.NetLog, o.OnEgress); err != nil {
			return nil, err
		}
		undo.Do(func() { sb.net.Close() })
	}
	wo := l.options(s, sb.layout, id, sb.net)
	wo.Workspace = sb.wsDir
	wo.Landlock = !slices.Contains(degraded, "landlock")
	if c := o.Command; c != nil {
		wo.Stdio, wo.TTY, wo.Rows, wo.Cols = c.Stdio, c.TTY, c.Rows, c.Cols
	} else {
		sb.socket = l.agentSocket(id)
		wo.AgentSocket = sb.socket
		if s.Restore != "" {
			if !l.SnapshotHasMemory(s.Restore) {
				return nil, fmt.Errorf("%w: snapshot %s holds no memory", errdefs.ErrNotFound, s.Restore)
			}
			wo.Restore = &wall.Restore{Dir: filepath.Join(snapshotDir(l.cfg.DataDir, s.Restore), snapshotMemory)}
		}
		wo.DieWithCreator = l.cfg.SandboxesDieWithUs
		wo.NProc = agentNProc(s.Limits.Pids)
		// A runaway command meets its commands' limits and is stopped;
		// the sandbox, its files and its agent live on.
		wo.CommandMemoryBytes, wo.CommandPids = s.Limits.CommandLimits()
		// Each command chooses its user; root inside gets the small set.
		wo.KeepCaps = rootCaps
		undo.Do(func() { _ = os.Remove(sb.socket) })
		// Until its agent's socket is there, this marks the sandbox as
		// long-lived: a daemon killed meanwhile leaves one that may live
		// on (a gvisor sandbox's runsc run does), which the next daemon
		// finds by it (LongLived) and ends.
		mark := l.creatingMark(id)
		if err = os.MkdirAll(filepath.Dir(mark), 0o700); err != nil {
			return nil, err
		}
		if err = os.WriteFile(mark, nil, 0o600); err != nil {
			return nil, err
		}
		defer os.Remove(mark)
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if o.BeforeStart != nil {
		wo.BeforeStart = func() error { return o.BeforeStart(sb) }
	}
	if sb.w, err = wl.Create(res, wo); err != nil {
		return nil, err
	}
	sb.release = undo.Release()
	return sb, nil
}

// Adopt takes over long-lived sandbox id, made by an earlier daemon, whose
// first process has host pid pid. A sandbox that cannot be adopted is
// destroyed (whatever of it is left) and an error says why.
func (l *Lifecycle) Adopt(ctx context.Context, id string, s *spec.Spec, pid int, onEgress func(eventlog.Event)) (_ *Sandbox, err error) {
	wl, err := l.wallOf(s.Wall())
	if err != nil {
		return nil, err
	}
	w, err := wl.Adopt(id, pid)
	if err != nil {
		return nil, err
	}
	var undo cleanup.Stack
	defer undo.RunUnless(&err)
	undo.Do(func() { _ = w.Destroy(); w.CloseFiles() })
	sb := &Sandbox{id: id, w: w, wall: wl.Name(), wallVersion: wl.Version(), socket: l.agentSocket(id), image: s.Image, writable: s.WritableRootfs, dataDir: l.cfg.DataDir}
	if s.NetMode() == "proxy" {
		// The proxy lived in the old daemon: start it again on the same
		// veth; the sandbox's connections through the old one were cut.
		if sb.net, err = sandboxnet.Adopt(&l.cfg.Net, id, s, pid, onEgress); err != nil {
			return nil, fmt.Errorf("sandbox %s: its network: %w; destroyed", id, err)
		}
		undo.Do(func() { sb.net.Close() })
	}
	// A private workspace (a checkout, a copy) needs nothing of the host
	// directory it was made from, which may be gone.
	hs := s
	if l.privateWorkspace(s) {
		c := *s
		c.Workspace, c.Repo = "", ""
		hs = &c
	}
	if sb.host, err = l.openHost(hs); err != nil {
		return nil, fmt.Errorf("sandbox %s: its image or workspace: %w; destroyed", id, err)
	}
	undo.Do(sb.host.Close)
	if sb.layout, err = l.images.ResolveAt(ctx, s.Image, sb.host.Image, l.cfg.Warn); err != nil {
		return nil, fmt.Errorf("sandbox %s: its image or workspace: %w; destroyed", id, err)
	}
	sb.wsDir = sb.host.WorkspaceDir()
	if l.privateWorkspace(s) {
		sb.wsDir = l.workspaceDir(id)
	}
	var keep cleanup.Stack
	keep.Do(sb.host.Close)
	keep.Do(sb.layout.Done)
	if sb.net != nil {
		keep.Do(func() { sb.net.Close() })
	}
	if l.privateWorkspace(s) {
		keep.Do(func() { _ = os.RemoveAll(sb.wsDir) })
	}
	keep.Do(func() { _ = os.Remove(sb.socket) })
	sb.release = keep.Release()
	undo.Release() // kept: the sandbox's own release gives them back
	return sb, nil
}

// gate checks s against the controls the host lacks for wall w: each must
// be one s explicitly runs without, and is returned as degraded.
func (l *Lifecycle) gate(w wall.Wall, s *spec.Spec) ([]string, error) {
	var degraded []string
	for _, m := range w.Missing() {
		if !s.Degraded(m.Control) {
			return nil, errdefs.Unavailable(fmt.Sprintf("%s; allow it degraded (airlock run --allow-degraded %s, or allow_degraded [%q] in the API) to run without it", m.Detail, m.Control, m.Control))
		}
		degraded = append(degraded, m.Control)
		l.cfg.Warn(fmt.Sprintf("sandbox runs WITHOUT %s: %s", m.Control, m.Detail))
	}
	return degraded, nil
}

// agentNProc leaves init room for its own threads below the pids limit.
func agentNProc(pids int64) uint64 {
	if pids > 64 {
		return uint64(pids - 32)
	}
	return 0
}

// capability numbers `--user root` keeps (package installs need them).
var rootCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_KILL,
	unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETFCAP, unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT, unix.CAP_AUDIT_WRITE,
}

const sandboxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// options prepares what the wall is given: the image's trees and the
// generated files of the root, the command's environment (with the
// network's, when n is set), and the limits.
func (l *Lifecycle) options(s *spec.Spec, layout *rootfs.Layout, id string, n *sandboxnet.Net) *wall.Options {
	host := s.Hostname
	if host == "" {
		host = "airlock-" + id[:8]
	}
	home := "/home/user"
	if s.User == "root" {
		home = "/root"
	}
	term := "dumb"
	if s.TTY {
		term = "xterm-256color"
	}
	path := sandboxPath
	for _, kv := range layout.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok && v != "" {
			path = v
		}
	}
	env := mergeEnv([]string{"PATH=" + path, "HOME=" + home, "TERM=" + term, "LANG=C.UTF-8"}, s.Env)
	o := &wall.Options{
		Writable: s.WritableRootfs, Root: s.User == "root", Home: home, Argv: s.Command, Cwd: "/workspace", Hostname: host,
		MemoryBytes: s.Limits.Memory, CPUs: s.Limits.CPUs, Pids: s.Limits.Pids, DiskBytes: s.Limits.Disk, NoFile: s.Limits.NoFile,
	}
	if o.Root {
		o.KeepCaps = rootCaps
	}
	for _, t := range layout.Trees {
		o.Trees = append(o.Trees, wall.Tree{HostPath: t.HostPath, Target: t.Target})
	}
	for _, sl := range layout.Symlinks {
		o.Files = append(o.Files, wall.File{Path: strings.TrimPrefix(sl.Path, "/"), Link: sl.Target})
	}
	u := wall.SandboxUID
	o.Files = append(o.Files,
		wall.File{Path: "etc/passwd", Mode: 0o644, Data: withLine(layout.Passwd, fmt.Sprintf("user:x:%d:%d:airlock sandbox user:/home/user:/bin/sh", u, u), ":1000:")},
		wall.File{Path: "etc/group", Mode: 0o644, Data: withLine(layout.Group, fmt.Sprintf("user:x:%d:", u), ":1000:")},
		wall.File{Path: "etc/hostname", Mode: 0o644, Data: host + "\n"},
		wall.File{Path: "etc/hosts", Mode: 0o644, Data: "127.0.0.1\tlocalhost " + host + "\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		wall.File{Path: "etc/resolv.conf", Mode: 0o644, Data: "# airlock: this sandbox has no network\n"},
		wall.File{Path: "home/user", Mode: os.ModeDir | 0o755, UID: uint32(u), GID: uint32(u)},
		wall.File{Path: "root", Mode: os.ModeDir | 0o700},
	)
	if n != nil {
		o.NetNS = n.NetNS
		// The proxy's variables under the command's; the CA's over the
		// image's; the sandbox's own (and the grants' placeholders) last.
		env = mergeEnv(mergeEnv(mergeEnv(n.Env, env), n.TrustEnv), s.Env)
		o.Files = withFiles(o.Files, n.Files)
	}
	o.Env = env
	return o
}

// withFiles replaces the files of base that add names, and appends the rest.
func withFiles(base, add []wall.File) []wall.File {
	for _, f := range add {
		replaced := false
		for i := range base {
			if base[i].Path == f.Path {
				base[i], replaced = f, true
			}
		}
		if !replaced {
			base = append(base, f)
		}
	}
	return base
}

// withLine appends line to a passwd/group database unless an entry with
// the same id (marker, e.g. ":1000:") is already there.
func withLine(db, line, marker string) string {
	for _, l := range strings.Split(db, "\n") {
		if strings.Contains(l, marker) {
			return db
		}
	}
	if db != "" && !strings.HasSuffix(db, "\n") {
		db += "\n"
	}
	return db + line + "\n"
}

// mergeEnv overrides base entries with user ones, keeping order.
func mergeEnv(base, user []string) []string {
	out := append([]string{}, base...)
	for _, kv := range user {
		k, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, b := range out {
			if strings.HasPrefix(b, k+"=") {
				out[i], replaced = kv, true
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out
}

// openHost opens the host paths s names.
func (l *Lifecycle) openHost(s *spec.Spec) (*hostfiles.Files, error) {
	return hostfiles.Open(s, filepath.Join(l.cfg.DataDir, "snapshots"))
}

// CheckHostPaths opens the host paths of s as Create would, and closes
// them: a spec kept for later is refused now, not at its use.
func (l *Lifecycle) CheckHostPaths(s *spec.Spec) error {
	h, err := l.openHost(s)
	if err != nil {
		return err
	}
	h.Close()
	return nil
}
