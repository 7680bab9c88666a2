// Package run is `airlock run`: create a one-shot sandbox through the one
// lifecycle (internal/lifecycle), run its command with the caller's
// terminal or streams attached, destroy it, and say how it ended. Its
// records go to the run's own audit log.
package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/scan"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/workspace"
	"golang.org/x/sys/unix"
)

// Runner runs one-shot sandboxes.
type Runner struct {
	Lifecycle *lifecycle.Lifecycle
	// Broker keeps the run's grants and redacts credentials from its
	// records; nil: no grants.
	Broker *broker.Broker
	Log    *slog.Logger
	Warn   func(string)
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

// Options are the host-side extras of `airlock run`.
type Options struct {
	Diff   io.Writer // unified diff of /workspace, when set
	Export string    // copy the resulting workspace here, when set
	// Signals forwards the user's signals to the command; a second SIGINT
	// (or SIGTERM) destroys the sandbox.
	Signals <-chan os.Signal
	// Resize carries terminal size changes for -t.
	Resize <-chan [2]uint16
	// NetLog receives one JSON line per egress decision (proxy mode).
	NetLog io.Writer
	// Audit, when set, records what the run did: the command's start is
	// committed (on disk) before it runs, and a log that cannot take it
	// stops the run before anything runs unrecorded.
	Audit *record.Recorder
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
	SandboxID  string             `json:"sandbox_id"`
	ExitCode   int                `json:"exit_code"`
	Signal     int                `json:"signal,omitempty"`
	Limit      Limit              `json:"limit,omitempty"`
	Limits     []Limit            `json:"limits_hit,omitempty"`
	Message    string             `json:"message,omitempty"`
	Wall       time.Duration      `json:"-"`
	CPU        time.Duration      `json:"-"`
	WallMS     float64            `json:"wall_ms"`
	CPUMS      float64            `json:"cpu_ms"`
	PeakMemory int64              `json:"peak_memory_bytes"`
	Image      string             `json:"image"`
	Degraded   []string           `json:"degraded,omitempty"`
	Egress     *sandboxnet.Result `json:"egress,omitempty"`
	// Audit is the file the run's audit records went to.
	Audit string `json:"audit,omitempty"`

	execID string // the command's, in its records
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
// is non-nil only when the sandbox could not be created (exit 125), or
// when its workspace could not be diffed or exported afterwards.
func (r *Runner) Run(ctx context.Context, s *spec.Spec, stdio Stdio, o Options) (*Result, error) {
	start := time.Now()
	lap := func(step string) { r.Log.Debug("run", "step", step, "at", time.Since(start)) }
	if err := s.Validate(); err != nil {
		return nil, err
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sig := newSignals(parent, cancel, o.Signals)
	defer sig.stop()
	if o.Audit != nil {
		// The scanner (its rules' keywords, its global allowlist's
		// expressions compiled), which the start record's redaction
		// reads, is made ready meanwhile.
		go func() { _, _ = scan.Default() }()
	}
	// Reap what earlier runs killed with SIGKILL left behind.
	if removed, err := r.Lifecycle.GC(); err != nil {
		r.Log.Warn("gc", "err", err)
	} else if len(removed) > 0 {
		r.Log.Info("gc removed dead sandboxes", "ids", removed)
	}
	res := &Result{SandboxID: lifecycle.NewID(), Image: s.Image}
	st, err := newStreams(stdio)
	if err != nil {
		return nil, err
	}
	defer st.close()
	sb, err := r.Lifecycle.Create(ctx, res.SandboxID, s, lifecycle.Options{
		Command:     st.command(stdio),
		NetLog:      o.NetLog,
		OnEgress:    r.egressSink(o),
		BeforeStart: func(sb *lifecycle.Sandbox) error { return r.recordStart(s, sb, res, o) },
	})
	st.sandboxHasItsOwn()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ErrInterrupted
		}
		return nil, err
	}
	lap("created")
	ex, timedOut, stats, diskFull := r.attend(s, sb, st, stdio, o, sig)
	lap("exited")
	if err := sb.Destroy(); err != nil {
		r.Warn("destroy: " + err.Error())
	}
	defer sb.Release()
	lap("destroyed")
	res.Egress = sb.Egress()
	res.Wall = time.Since(start)
	res.describe(s, ex, stats, timedOut, sig.interrupted.Load(), diskFull)
	r.recordEnd(sb, res, ex, stats, o)
	return res, r.deliver(sb, o)
}

// attend relays the streams, forwards signals, enforces the deadline and
// waits for the command; the sandbox is killed when it returns.
func (r *Runner) attend(s *spec.Spec, sb *lifecycle.Sandbox, st *streams, stdio Stdio, o Options, sig *signals) (ex wall.Exit, timedOut bool, stats lifecycle.Usage, diskFull bool) {
	st.relay(sb, stdio, o.Resize)
	var timeout atomic.Bool
	timer := time.AfterFunc(s.Timeout, func() {
		timeout.Store(true)
		sb.Kill()
	})
	defer timer.Stop()
	sig.live(sb)
	ex = sb.Wait()
	timer.Stop()
	// The command is gone, or about to be: whatever it left running dies
	// with the sandbox. The streams reach EOF once every writer is.
	sb.Kill()
	st.wait()
	return ex, timeout.Load(), sb.Usage(), sb.ScratchFull()
}

// describe sums up how the run ended.
func (res *Result) describe(s *spec.Spec, ex wall.Exit, stats lifecycle.Usage, timedOut, interrupted, diskFull bool) {
	res.CPU = stats.CPU
	res.WallMS = float64(res.Wall.Microseconds()) / 1000
	res.CPUMS = float64(res.CPU.Microseconds()) / 1000
	res.PeakMemory = stats.MemoryPeak
	res.ExitCode, res.Signal = ex.Code, ex.Signal
	switch {
	case timedOut:
		res.Limit, res.ExitCode = LimitTimeout, ExitTimeout
		res.Message = fmt.Sprintf("timeout (%s) reached: sandbox killed", s.Timeout)
	case ex.OOM:
		res.Limit, res.ExitCode, res.Signal = LimitMemory, ExitOOM, int(unix.SIGKILL)
		res.Message = fmt.Sprintf("memory limit (%s) exceeded", spec.FormatSize(s.Limits.Memory))
	case interrupted:
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
}

// deliver writes the workspace's diff and export the user asked for.
func (r *Runner) deliver(sb *lifecycle.Sandbox, o Options) error {
	if o.Diff == nil && o.Export == "" {
		return nil
	}
	ch, err := sb.ChangeSet(context.Background())
	if err != nil {
		return err
	}
	if o.Diff != nil {
		if err := ch.WriteDiff(o.Diff, workspace.MaxDiffBytes); err != nil {
			return err
		}
	}
	if o.Export != "" {
		skipped, err := ch.Export(o.Export)
		if err != nil {
			return err
		}
		for _, sk := range skipped {
			r.Warn("export: skipped " + sk)
		}
	}
	return nil
}

// egressSink records the run's egress decisions, and what each found.
func (r *Runner) egressSink(o Options) func(eventlog.Event) {
	if o.Audit == nil {
		return nil
	}
	return func(ev eventlog.Event) {
		w := record.Who{Sandbox: ev.Sandbox}
		o.Audit.Note(w, record.Egress{Event: ev})
		for _, f := range record.EgressFindings(ev) {
			o.Audit.Note(w, f)
		}
	}
}

// recordStart puts the run on the record before anything runs: a run that
// cannot be recorded does not start. The records are the daemon's for the
// same sandbox and command (internal/audit/record).
func (r *Runner) recordStart(s *spec.Spec, sb *lifecycle.Sandbox, res *Result, o Options) error {
	res.Degraded = sb.Degraded()
	if o.Audit == nil {
		return nil
	}
	w := record.Who{Sandbox: res.SandboxID}
	shown := r.recorded(s, w, o.Audit)
	o.Audit.Note(w, record.SandboxCreated{
		Spec: shown, Image: s.Image, ImageDigest: sb.ImageDigest(), PolicySHA256: record.PolicyHash(s.Net.Allow, s.Net.Deny),
		Controls: record.ControlsOf(sb.Wall(), sb.WallVersion(), res.Degraded), // init_pid 0: recorded before init exists
	})
	res.execID = lifecycle.NewID()
	if err := o.Audit.Commit(context.Background(), w, record.ExecStart{
		ExecID: res.execID, Argv: shown.Command, Cwd: "/workspace", User: s.User, // validated: "user" or "root" Env: shown.Env, TTY: s.TTY, Timeout: s.Timeout.String(),
	}); err != nil {
		return fmt.Errorf("the audit log: %w", err)
	}
	return nil
}

// recordEnd records how the command and the sandbox ended, and what
// changed in its workspace.
func (r *Runner) recordEnd(sb *lifecycle.Sandbox, res *Result, ex wall.Exit, stats lifecycle.Usage, o Options) {
	if o.Audit == nil {
		return
	}
	w := record.Who{Sandbox: res.SandboxID}
	end := record.ExecEnd{ExecID: res.execID, DurationMS: res.WallMS, ExitCode: ex.Code, Status: exitStatus(ex), Error: ex.Error, TimedOut: res.Limit == LimitTimeout}
	if ex.OOM || ex.InitDied {
		end.SandboxEnded = endReason(res)
	}
	o.Audit.Note(w, end)
	limits := make([]string, 0, len(res.Limits))
	for _, l := range res.Limits {
		limits = append(limits, string(l))
	}
	o.Audit.Note(w, record.SandboxDestroyed{
		Reason: endReason(res), Limits: limits, CPUSeconds: stats.CPU.Seconds(), MemoryPeakBytes: stats.MemoryPeak,
		OOMKills: stats.OOMKills, PidsLimited: stats.PidsLimited, Workspace: record.ReadWorkspace(sb, res.SandboxID, ""),
	})
}

// exitStatus says how a command ended as the sandbox's agent says it
// (Go's os.ProcessState): "exit status 1", "signal: killed".
func exitStatus(ex wall.Exit) string {
	switch {
	case ex.Error != "":
		return "not started"
	case ex.Signal > 0:
		return "signal: " + unix.Signal(ex.Signal).String()
	}
	return fmt.Sprintf("exit status %d", ex.Code)
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

// recorded is s as a run's records show it (record.Spec), its command
// with every credential the scanner finds replaced by [REDACTED:rule] and
// recorded as a finding by fingerprint: the command runs as given; its
// record does not keep the value. A scanner that cannot run leaves no
// command in the record.
func (r *Runner) recorded(s *spec.Spec, w record.Who, rec *record.Recorder) spec.Spec {
	shown := record.Spec(*s)
	if r.Broker == nil {
		return shown
	}
	cmd, fs, err := r.Broker.Redacted(s.Command)
	if err != nil {
		shown.Command = []string{"[REDACTED: the secret scanner is unavailable]"}
		return shown
	}
	shown.Command = cmd
	for _, f := range fs {
		rec.Note(w, record.SecretFinding{Call: "run", Where: fmt.Sprintf("argv[%d]", f.Part), Rule: f.Rule, Rules: scan.RuleSet,
			Fingerprint: r.Broker.Keys().Fingerprint(f.Secret), Action: "redacted", Reason: "redacted in the record; the command ran as given"})
	}
	return shown
}

// signals handles the user's signals: before the sandbox exists they
// abort what can be aborted (an image pull, say) and are kept; once it
// exists the first is forwarded to the command and a second destroys the
// sandbox.
type signals struct {
	mu          sync.Mutex // sb and pending change together
	sb          *lifecycle.Sandbox
	pending     os.Signal // received before the sandbox was live
	interrupted atomic.Bool
	done        chan struct{}
}

func newSignals(ctx context.Context, cancel context.CancelFunc, in <-chan os.Signal) *signals {
	sg := &signals{done: make(chan struct{})}
	go func() {
		n := 0
		for {
			select {
			case <-sg.done:
				return
			case <-ctx.Done():
				sg.mu.Lock()
				if sg.sb != nil {
					sg.sb.Kill()
				}
				sg.mu.Unlock()
				return
			case s, ok := <-in:
				if !ok {
					return
				}
				n++
				sg.mu.Lock()
				sb := sg.sb
				if sb == nil && sg.pending == nil {
					sg.pending = s
				}
				sg.mu.Unlock()
				switch {
				case sb == nil:
					cancel()
				case n > 1:
					sg.interrupted.Store(true)
					sb.Kill()
				default:
					if us, ok := s.(unix.Signal); ok {
						_ = sb.Signal(us)
					}
				}
			}
		}
	}()
	return sg
}

// live hands the running sandbox to the handler, with a signal that came
// while it was being made.
func (sg *signals) live(sb *lifecycle.Sandbox) {
	sg.mu.Lock()
	sg.sb = sb
	early := sg.pending
	sg.mu.Unlock()
	if s, ok := early.(unix.Signal); ok {
		_ = sb.Signal(s)
	}
}

func (sg *signals) stop() { close(sg.done) }

// streams are the pipes between the user's streams and the command's.
type streams struct {
	child, host [3]*os.File // unset with a terminal
	tty         bool
	relays      sync.WaitGroup
}

func newStreams(stdio Stdio) (*streams, error) {
	st := &streams{tty: stdio.TTY != nil}
	if st.tty {
		return st, nil
	}
	for i := 0; i < 3; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			st.close()
			return nil, err
		}
		if i == 0 {
			st.child[i], st.host[i] = r, w
		} else {
			st.child[i], st.host[i] = w, r
		}
	}
	return st, nil
}

// command is the one-shot command's side of the streams.
func (st *streams) command(stdio Stdio) *lifecycle.Command {
	return &lifecycle.Command{Stdio: st.child, TTY: st.tty, Rows: stdio.Rows, Cols: stdio.Cols}
}

// sandboxHasItsOwn closes the command's ends: the sandbox holds its own
// copies (or was never made).
func (st *streams) sandboxHasItsOwn() {
	for i, f := range st.child {
		if f != nil {
			f.Close()
			st.child[i] = nil
		}
	}
}

// relay copies the user's streams to the command's and back.
func (st *streams) relay(sb *lifecycle.Sandbox, stdio Stdio, resize <-chan [2]uint16) {
	if st.tty {
		pty := sb.PTY()
		st.relays.Add(1)
		go func() { defer st.relays.Done(); _, _ = io.Copy(stdio.Out, pty) }()
		go func() { _, _ = io.Copy(pty, stdio.In) }()
		if resize != nil {
			go func() {
				for sz := range resize {
					_ = unix.IoctlSetWinsize(int(pty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: sz[0], Col: sz[1]})
				}
			}()
		}
		return
	}
	stdinW := st.host[0]
	st.host[0] = nil
	go func() {
		if stdio.In != nil {
			_, _ = io.Copy(stdinW, stdio.In)
		}
		stdinW.Close()
	}()
	st.relays.Add(2)
	go func() { defer st.relays.Done(); _, _ = io.Copy(stdio.Out, st.host[1]) }()
	go func() { defer st.relays.Done(); _, _ = io.Copy(stdio.Err, st.host[2]) }()
}

// wait waits until the command's output has been copied.
func (st *streams) wait() { st.relays.Wait() }

func (st *streams) close() {
	st.sandboxHasItsOwn()
	for i, f := range st.host {
		if f != nil {
			f.Close()
			st.host[i] = nil
		}
	}
}
