// Package daemon is airlock's composition root: it builds every subsystem
// and wires them together. Engine is the embedded form used by `airlock
// run`: create one sandbox, run one command, destroy it, in this process.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/linux/landlock"
	"github.com/airlock-sandbox/airlock/internal/netns"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/wall/container"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/scan"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/workspace"
	"golang.org/x/sys/unix"
)

// Config is the engine's host configuration.
type Config struct {
	StateDir string // default /run/airlock
	DataDir  string // default /var/lib/airlock
	Log      *slog.Logger
	// Warn receives one-line warnings meant for the user (stderr).
	Warn func(string)
	// DNSUpstream is the resolver the egress proxy and DNS forwarder ask
	// (host:port); default: the first nameserver of /etc/resolv.conf.
	DNSUpstream string
	// SubnetPool is where sandbox veths get their /30s.
	SubnetPool netip.Prefix
	// EgressAllowNets are ranges of the egress guard's table (private,
	// documentation, ...) the operator opens to every sandbox's proxy;
	// never the host's own addresses or the subnet pool.
	EgressAllowNets []netip.Prefix
	// ImageCacheBytes caps the OCI image cache (least recently used images
	// are evicted past it); 0: image.DefaultCacheBytes.
	ImageCacheBytes int64
	// OnEgress, when set, sees every egress decision (metrics).
	OnEgress func(egress.Event)
	// SandboxesDieWithUs makes long-lived sandboxes die with this process
	// (airlock mcp's embedded service, which no later daemon adopts from).
	SandboxesDieWithUs bool
	// Broker, when set, keeps proxy-mode sandboxes' grants and scans what
	// their proxies can read; without it grants are refused.
	Broker *broker.Broker
	// TenantImages makes images tenants' names (airlock serve): registry
	// pulls only from Registries, dialled through the egress address
	// guard; errors that say nothing of host files or registries' answers.
	// Unset (airlock run, airlock mcp), any registry is pulled from.
	TenantImages bool
	Registries   []string
}

// Engine runs sandboxes in this process.
type Engine struct {
	cfg    Config
	rt     *container.Wall
	images *image.Store
}

// NewEngine checks the host and prepares state directories.
func NewEngine(cfg Config) (*Engine, error) {
	if cfg.StateDir == "" {
		cfg.StateDir = "/run/airlock"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "/var/lib/airlock"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Warn == nil {
		cfg.Warn = func(string) {}
	}
	if !cfg.SubnetPool.IsValid() {
		cfg.SubnetPool = netns.DefaultPool
	}
	rt, err := container.New(cfg.StateDir, cfg.Log)
	if err != nil {
		return nil, err
	}
	images, err := image.NewStore(cfg.DataDir+"/images", cfg.Log)
	if err != nil {
		return nil, err
	}
	if cfg.ImageCacheBytes > 0 {
		images.MaxBytes = cfg.ImageCacheBytes
	}
	if cfg.TenantImages {
		images.Tenants, images.Registries = true, cfg.Registries
		images.Dial = guardedDial(&egress.Guard{AllowNets: cfg.EgressAllowNets, Sandboxes: cfg.SubnetPool})
	}
	return &Engine{cfg: cfg, rt: rt, images: images}, nil
}

// Images is the engine's image store.
func (e *Engine) Images() *image.Store { return e.images }

// GC removes what dead sandboxes left behind.
func (e *Engine) GC() ([]string, error) {
	ids, err := e.rt.GC()
	if err2 := workspace.GCRepos(e.cfg.DataDir+"/tmp", e.rt.Live); err2 != nil {
		err = errors.Join(err, err2)
	}
	netns.Reap(filepath.Join(e.cfg.StateDir, "nets"))
	// A long-lived sandbox's agent socket, once its sandbox is gone (its
	// creator died without a word).
	socks, _ := filepath.Glob(filepath.Join(e.cfg.StateDir, "agents", "*.sock"))
	for _, s := range socks {
		id := strings.TrimSuffix(filepath.Base(s), ".sock")
		if _, lerr := os.Stat(filepath.Join(e.cfg.StateDir, "sandboxes", id+".lock")); os.IsNotExist(lerr) {
			_ = os.Remove(s)
		}
	}
	return ids, err
}

// Stdio is what the command's standard streams are connected to.
type Stdio struct {
	In       io.Reader
	Out, Err io.Writer
	// TTY is the host terminal for -t, already in raw mode; nil otherwise.
	TTY *os.File
	// Rows and Cols are the terminal's initial size.
	Rows, Cols uint16
}

// RunOptions are the host-side extras of `airlock run`.
type RunOptions struct {
	Diff   io.Writer // unified diff of /workspace, when set
	Export string    // copy the resulting workspace here, when set
	// Signals forwards the user's signals to the command; a second SIGINT
	// (or SIGTERM) destroys the sandbox.
	Signals <-chan os.Signal
	// Resize carries terminal size changes for -t.
	Resize <-chan [2]uint16
	// NetLog receives one JSON line per egress decision (proxy mode).
	NetLog io.Writer
	// Audit, when set, is told what the run did as audit records: the
	// sandbox's id, the kind, the source ("observed" by the host or
	// "reported" by the sandbox) and the data. With wait it returns once
	// the record (and all before it) is on disk; an error then stops the
	// run before anything runs unrecorded.
	Audit func(sandbox, kind, source string, data any, wait bool) error
}

// Limit names a resource cap that ended or constrained the run.
type Limit string

const (
	LimitTimeout Limit = "timeout"
	LimitMemory  Limit = "memory"
	LimitPids    Limit = "pids"
	LimitDisk    Limit = "disk"
)

// Result is the outcome of one run; it is what --json prints.
type Result struct {
	SandboxID  string        `json:"sandbox_id"`
	ExitCode   int           `json:"exit_code"`
	Signal     int           `json:"signal,omitempty"`
	Limit      Limit         `json:"limit,omitempty"`
	Limits     []Limit       `json:"limits_hit,omitempty"`
	Message    string        `json:"message,omitempty"`
	Wall       time.Duration `json:"-"`
	CPU        time.Duration `json:"-"`
	WallMS     float64       `json:"wall_ms"`
	CPUMS      float64       `json:"cpu_ms"`
	PeakMemory int64         `json:"peak_memory_bytes"`
	Image      string        `json:"image"`
	Degraded   []string      `json:"degraded,omitempty"`
	Egress     *EgressResult `json:"egress,omitempty"`
	// Audit is the file the run's audit records went to.
	Audit string `json:"audit,omitempty"`
}

// EgressResult sums up a proxy-mode sandbox's network activity.
type EgressResult struct {
	Summary       string   `json:"summary"`
	BytesOut      int64    `json:"bytes_out"`
	DeniedPackets uint64   `json:"denied_packets"`
	LimitsHit     []string `json:"limits_hit,omitempty"`
	// LogLost counts decisions --net-log could not record.
	LogLost int `json:"log_lost,omitempty"`
}

// ErrInterrupted: the user interrupted the run before the sandbox existed.
var ErrInterrupted = errors.New("interrupted before the sandbox was created")

// Exit codes of `airlock run` besides the command's own.
const (
	ExitTimeout  = 124
	ExitCreate   = 125
	ExitNoExec   = 126
	ExitNotFound = 127
	ExitOOM      = 137
)

// Run creates a sandbox for s, runs its command and destroys it. The error
// is non-nil only when the sandbox could not be created (exit 125).
func (e *Engine) Run(ctx context.Context, s *spec.Spec, stdio Stdio, ro RunOptions) (*Result, error) {
	start := time.Now()
	lap := func(step string) { e.cfg.Log.Debug("run", "step", step, "at", time.Since(start)) }
	if err := s.Validate(); err != nil {
		return nil, err
	}
	// The user's signals: before the sandbox exists they abort what can be
	// aborted (an image pull, say) and are kept; once it exists the first is
	// forwarded to the command and a second destroys the sandbox.
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu      sync.Mutex // live and pending change together
		live    wall.Sandbox
		pending os.Signal // received before the sandbox was live
	)
	var interrupted atomic.Bool
	stopSignals := make(chan struct{})
	defer close(stopSignals)
	go func() {
		n := 0
		for {
			select {
			case <-stopSignals:
				return
			case <-parent.Done():
				mu.Lock()
				if live != nil {
					live.Kill()
				}
				mu.Unlock()
				cancel()
				return
			case sig, ok := <-ro.Signals:
				if !ok {
					return
				}
				n++
				mu.Lock()
				sb := live
				if sb == nil && pending == nil {
					pending = sig
				}
				mu.Unlock()
				switch {
				case sb == nil:
					cancel()
				case n > 1:
					interrupted.Store(true)
					sb.Kill()
				default:
					if us, ok := sig.(unix.Signal); ok {
						_ = sb.Signal(us)
					}
				}
			}
		}
	}()
	// Reap what earlier runs killed with SIGKILL left behind.
	if removed, err := e.GC(); err != nil {
		e.cfg.Log.Warn("gc", "err", err)
	} else if len(removed) > 0 {
		e.cfg.Log.Info("gc removed dead sandboxes", "ids", removed)
	}
	res := &Result{SandboxID: container.NewID(), Image: s.Image}
	landlockOn := true
	if abi := landlock.ABI(); abi < landlock.MinABI {
		if !s.Degraded("landlock") {
			return nil, errdefs.Unavailable(fmt.Sprintf("Landlock is unavailable (kernel ABI %d, need %d); pass --allow-degraded landlock to run without it", abi, landlock.MinABI))
		}
		landlockOn = false
		res.Degraded = append(res.Degraded, "landlock")
		e.cfg.Warn(fmt.Sprintf("running WITHOUT Landlock (kernel ABI %d): writes are confined by the read-only mounts only", abi))
	}

	host, err := e.openHost(s)
	if err != nil {
		return nil, err
	}
	defer host.close()
	layout, err := e.resolveImage(ctx, s, host)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ErrInterrupted
		}
		return nil, err
	}
	defer layout.Done()
	lap("image")
	reservation, err := e.rt.Reserve(res.SandboxID)
	if err != nil {
		return nil, err
	}
	defer reservation.Release()
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	wsDir := path(host.ws)
	if s.Repo != "" {
		dir, cleanup, err := e.checkout(ctx, s, host, res.SandboxID)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ErrInterrupted
			}
			return nil, err
		}
		cleanups = append(cleanups, cleanup)
		wsDir = dir
	}

	o := e.options(s, layout, res.SandboxID)
	o.Workspace = wsDir
	var egressDone func() *EgressResult
	if s.NetMode() == "proxy" {
		sink := e.cfg.OnEgress
		if ro.Audit != nil {
			sink = func(ev egress.Event) {
				if e.cfg.OnEgress != nil {
					e.cfg.OnEgress(ev)
				}
				_ = ro.Audit(ev.Sandbox, "egress", "observed", ev, false)
			}
		}
		done, err := e.network(s, res.SandboxID, o, ro.NetLog, sink)
		if err != nil {
			return nil, err
		}
		egressDone = done
		defer func() {
			if egressDone != nil {
				egressDone()
			}
			if e.cfg.Broker != nil {
				e.cfg.Broker.End(res.SandboxID)
			}
		}()
	}
	o.Landlock = landlockOn
	o.TTY, o.Rows, o.Cols = stdio.TTY != nil, stdio.Rows, stdio.Cols

	var relay sync.WaitGroup
	var hostEnds []*os.File
	if !o.TTY {
		var childEnds [3]*os.File
		for i := 0; i < 3; i++ {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			if i == 0 {
				childEnds[i], hostEnds = r, append(hostEnds, w)
			} else {
				childEnds[i], hostEnds = w, append(hostEnds, r)
			}
		}
		o.Stdio = childEnds
		defer func() {
			for _, f := range childEnds {
				f.Close()
			}
		}()
	}

	if ctx.Err() != nil {
		for _, f := range hostEnds {
			f.Close()
		}
		return nil, ErrInterrupted
	}
	// On the record before anything runs: a run that cannot be recorded
	// does not start.
	if ro.Audit != nil {
		shown := e.recorded(s, res.SandboxID, ro.Audit)
		_ = ro.Audit(res.SandboxID, "sandbox.created", "observed", map[string]any{"spec": shown, "image": s.Image, "image_digest": layout.Digest, "controls": sandbox.Controls(res.Degraded)}, false)
		if err := ro.Audit(res.SandboxID, "exec.start", "observed", map[string]any{"argv": shown.Command, "user": s.User, "cwd": "/workspace", "env": shown.Env, "tty": s.TTY}, true); err != nil {
			for _, f := range hostEnds {
				f.Close()
			}
			return nil, fmt.Errorf("%w: the audit log: %v", errdefs.ErrUnavailable, err)
		}
	}
	sb, err := e.rt.Create(reservation, o)
	for _, f := range o.Stdio {
		if f != nil {
			f.Close() // the sandbox holds its own copies now
		}
	}
	if err != nil {
		for _, f := range hostEnds {
			f.Close()
		}
		return nil, err
	}
	defer sb.CloseFiles()
	destroyed := false
	destroy := func() {
		if !destroyed {
			destroyed = true
			if err := sb.Destroy(); err != nil {
				e.cfg.Warn("destroy: " + err.Error())
			}
		}
	}
	defer destroy()

	// Relay the standard streams.
	if o.TTY {
		relay.Add(1)
		go func() { defer relay.Done(); _, _ = io.Copy(stdio.Out, sb.Layers().PTY) }()
		go func() { _, _ = io.Copy(sb.Layers().PTY, stdio.In) }()
		if ro.Resize != nil {
			go func() {
				for sz := range ro.Resize {
					_ = unix.IoctlSetWinsize(int(sb.Layers().PTY.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: sz[0], Col: sz[1]})
				}
			}()
		}
	} else {
		stdinW := hostEnds[0]
		go func() {
			if stdio.In != nil {
				_, _ = io.Copy(stdinW, stdio.In)
			}
			stdinW.Close()
		}()
		relay.Add(2)
		go func() { defer relay.Done(); _, _ = io.Copy(stdio.Out, hostEnds[1]); hostEnds[1].Close() }()
		go func() { defer relay.Done(); _, _ = io.Copy(stdio.Err, hostEnds[2]); hostEnds[2].Close() }()
	}

	// The deadline.
	var timedOut atomic.Bool
	timer := time.AfterFunc(s.Timeout, func() {
		timedOut.Store(true)
		sb.Kill()
	})
	defer timer.Stop()
	mu.Lock()
	live = sb
	early := pending
	mu.Unlock()
	if sig, ok := early.(unix.Signal); ok {
		_ = sb.Signal(sig) // arrived while the sandbox was being created
	}

	lap("created")
	ex := sb.Wait()
	lap("exited")
	timer.Stop()
	// Init is gone, or about to be: whatever the command left running dies
	// with the pid namespace. The streams reach EOF once every writer is.
	sb.Kill()
	relay.Wait()
	stats := sb.Stats()
	diskFull := scratchFull(sb.Layers().WorkspaceUpper)
	destroy()
	lap("destroyed")
	if egressDone != nil {
		res.Egress = egressDone()
		egressDone = nil
	}

	res.Wall = time.Since(start)
	res.CPU = stats.CPUTime
	res.WallMS = float64(res.Wall.Microseconds()) / 1000
	res.CPUMS = float64(res.CPU.Microseconds()) / 1000
	res.PeakMemory = stats.MemoryPeak
	res.ExitCode, res.Signal = ex.Code, ex.Signal
	switch {
	case timedOut.Load():
		res.Limit, res.ExitCode = LimitTimeout, ExitTimeout
		res.Message = fmt.Sprintf("timeout (%s) reached: sandbox killed", s.Timeout)
	case ex.OOM:
		res.Limit, res.ExitCode, res.Signal = LimitMemory, ExitOOM, int(unix.SIGKILL)
		res.Message = fmt.Sprintf("memory limit (%s) exceeded", spec.FormatSize(s.Limits.Memory))
	case interrupted.Load():
		res.Message = "interrupted: sandbox destroyed"
	case ex.Error != "":
		res.Message = ex.Error
	}
	if res.Limit != "" {
		res.Limits = append(res.Limits, res.Limit)
	}
	if stats.PidsLimited > 0 {
		res.Limits = append(res.Limits, LimitPids)
		if res.Message == "" {
			res.Message = fmt.Sprintf("pids limit (%d) reached: %d forks refused", s.Limits.Pids, stats.PidsLimited)
		}
	}
	if diskFull {
		res.Limits = append(res.Limits, LimitDisk)
		if res.Message == "" {
			res.Message = fmt.Sprintf("disk limit (%s) reached: writes got ENOSPC", spec.FormatSize(s.Limits.Disk))
		}
	}

	if ro.Audit != nil {
		_ = ro.Audit(res.SandboxID, "exec.end", "reported", map[string]any{"exit_code": ex.Code, "signal": ex.Signal, "error": ex.Error}, false)
		destroyed := map[string]any{"reason": endReason(res), "limits": res.Limits, "cpu_seconds": stats.CPUTime.Seconds(), "memory_peak_bytes": stats.MemoryPeak}
		ctx, cancel := context.WithTimeout(context.Background(), sandbox.RecordTime)
		if ch, err := workspace.Changes(ctx, wsDir, sb.Layers().WorkspaceUpper, sb.Layers().Workspace); err == nil {
			// Capped as the daemon's record is: a sandbox chooses the names.
			changes, left := sandbox.CapRecorded(ch.Changes, sandbox.MaxRecordedChanges, sandbox.MaxRecordedBytes)
			destroyed["workspace"] = changes
			if left > 0 {
				destroyed["workspace_left_out"] = left
			}
			if unread, left := sandbox.CapRecorded(ch.Unread, sandbox.MaxRecordedChanges, sandbox.MaxRecordedBytes/4); len(unread) > 0 {
				destroyed["workspace_unread"] = unread
				if left > 0 {
					destroyed["workspace_unread_left_out"] = left
				}
			}
			if ch.Truncated != "" {
				destroyed["workspace_truncated"] = ch.Truncated
			}
		}
		cancel()
		_ = ro.Audit(res.SandboxID, "sandbox.destroyed", "observed", destroyed, false)
	}
	if ro.Diff != nil || ro.Export != "" {
		ch, err := workspace.Changes(context.Background(), wsDir, sb.Layers().WorkspaceUpper, sb.Layers().Workspace)
		if err != nil {
			return res, fmt.Errorf("workspace changes: %w", err)
		}
		if ro.Diff != nil {
			if err := ch.WriteDiff(ro.Diff, workspace.MaxDiffBytes); err != nil {
				return res, err
			}
		}
		if ro.Export != "" {
			skipped, err := ch.Export(ro.Export)
			if err != nil {
				return res, err
			}
			for _, sk := range skipped {
				e.cfg.Warn("export: skipped " + sk)
			}
		}
	}
	return res, nil
}

// scratchFull reports whether the sandbox's writable tmpfs is (nearly) full.
func scratchFull(anyFileOnIt *os.File) bool {
	if anyFileOnIt == nil {
		return false
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(anyFileOnIt.Fd()), &st); err != nil {
		return false
	}
	return st.Bavail*uint64(st.Bsize) < 64<<10
}

// capability numbers `--user root` keeps (package installs need them).
var rootCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_KILL,
	unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETFCAP, unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT, unix.CAP_AUDIT_WRITE,
}

const sandboxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (e *Engine) options(s *spec.Spec, l *image.Layout, id string) *wall.Options {
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
	for _, kv := range l.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok && v != "" {
			path = v
		}
	}
	env := []string{"PATH=" + path, "HOME=" + home, "TERM=" + term, "LANG=C.UTF-8"}
	env = mergeEnv(env, s.Env)
	o := &wall.Options{
		Writable:    s.WritableRootfs,
		Root:        s.User == "root",
		Home:        home,
		Argv:        s.Command,
		Env:         env,
		Cwd:         "/workspace",
		Hostname:    host,
		MemoryBytes: s.Limits.Memory,
		CPUs:        s.Limits.CPUs,
		Pids:        s.Limits.Pids,
		DiskBytes:   s.Limits.Disk,
		NoFile:      s.Limits.NoFile,
	}
	if o.Root {
		o.KeepCaps = rootCaps
	}
	for _, t := range l.Trees {
		o.Trees = append(o.Trees, wall.Tree{HostPath: t.HostPath, Target: t.Target})
	}
	for _, sl := range l.Symlinks {
		o.Files = append(o.Files, wall.File{Path: strings.TrimPrefix(sl.Path, "/"), Link: sl.Target})
	}
	u := container.SandboxUID
	o.Files = append(o.Files,
		wall.File{Path: "etc/passwd", Mode: 0o644, Data: withLine(l.Passwd, fmt.Sprintf("user:x:%d:%d:airlock sandbox user:/home/user:/bin/sh", u, u), ":1000:")},
		wall.File{Path: "etc/group", Mode: 0o644, Data: withLine(l.Group, fmt.Sprintf("user:x:%d:", u), ":1000:")},
		wall.File{Path: "etc/hostname", Mode: 0o644, Data: host + "\n"},
		wall.File{Path: "etc/hosts", Mode: 0o644, Data: "127.0.0.1\tlocalhost " + host + "\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		wall.File{Path: "etc/resolv.conf", Mode: 0o644, Data: "# airlock: this sandbox has no network\n"},
		wall.File{Path: "home/user", Mode: os.ModeDir | 0o755, UID: uint32(u), GID: uint32(u)},
		wall.File{Path: "root", Mode: os.ModeDir | 0o700},
	)
	return o
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

// endReason says why a run's sandbox ended.
func endReason(res *Result) string {
	if res.Limit != "" {
		return string(res.Limit)
	}
	if res.Message != "" {
		return res.Message
	}
	return "exit"
}

// recorded is s as a run's records show it (sandbox.RedactedSpec), its
// command with every credential the scanner finds replaced by
// [REDACTED:rule] and recorded as a finding by fingerprint: the command
// runs as given; its record does not keep the value. A scanner that
// cannot run leaves no command in the record.
func (e *Engine) recorded(s *spec.Spec, id string, rec func(sandbox, kind, source string, data any, wait bool) error) spec.Spec {
	r := sandbox.RedactedSpec(*s)
	if e.cfg.Broker == nil {
		return r
	}
	cmd, fs, err := e.cfg.Broker.Redacted(s.Command)
	if err != nil {
		r.Command = []string{"[REDACTED: the secret scanner is unavailable]"}
		return r
	}
	r.Command = cmd
	for _, f := range fs {
		_ = rec(id, "secret.finding", "observed", map[string]any{"call": "run", "where": fmt.Sprintf("argv[%d]", f.Part), "rule": f.Rule, "rules": scan.RuleSet,
			"fingerprint": e.cfg.Broker.Keys().Fingerprint(f.Secret), "action": "redacted", "reason": "redacted in the record; the command ran as given"}, false)
	}
	return r
}
