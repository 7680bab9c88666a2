// Package execs is the sandbox service's calls on commands: exec (its
// scan, its records before the pid is told, its timeout and the kill of a
// command whose caller went away, a background command followed to its
// end, its output kept for logs), attach, logs, processes, input, signals
// and terminal sizes; a command killed because its sandbox is ending is
// told the sandbox's end.
package execs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Commands is the service's calls on commands, on its Core.
type Commands struct {
	*core.Core
	// background counts running background commands per tenant id (and
	// Box.Background per sandbox), under Core.Mu.
	background map[string]int
	// logs is the output kept of background commands.
	logs *logs
}

// New makes the calls on commands of c's sandboxes.
func New(c *core.Core) *Commands {
	return &Commands{Core: c, background: map[string]int{}, logs: newLogs()}
}

// takeBackground counts one more background command of b, within the
// sandbox's and its tenant's caps; release gives it back.
func (s *Commands) takeBackground(b *core.Box) (release func(), err error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	tenant := b.Rec.Tenant // its id
	switch {
	case b.Background >= s.Cfg.MaxBackground:
		return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("sandbox %s runs %d background commands, its most at once: wait for one to end or kill one (POST .../processes/{pid}/signal)", b.Rec.ID, b.Background))
	case s.background[tenant] >= s.Cfg.MaxBackgroundPerTenant:
		return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("tenant %s runs %d background commands in all, its most at once: wait for one to end or kill one", b.Rec.TenantName, s.background[tenant]))
	}
	b.Background++
	s.background[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.Mu.Lock()
			defer s.Mu.Unlock()
			b.Background--
			if s.background[tenant]--; s.background[tenant] == 0 {
				delete(s.background, tenant)
			}
		})
	}, nil
}

// checkEnv refuses a command's environment the kernel or the command
// would read otherwise than the caller wrote it.
func checkEnv(env map[string]string) error {
	if len(env) > spec.MaxEnv {
		return errdefs.Invalid(fmt.Sprintf("env: at most %d variables", spec.MaxEnv))
	}
	for k, v := range env {
		if err := spec.CheckEnvName(k); err != nil {
			return err
		}
		if strings.IndexByte(v, 0) >= 0 {
			return errdefs.Invalid(fmt.Sprintf("env %s: the value contains a NUL byte", k))
		}
	}
	return nil
}

// Exec runs a command in sandbox id and streams its events to emit: the
// start (pid), output, and the end. A background command returns after
// its start. A foreground command whose caller goes away is killed.
func (s *Commands) Exec(ctx context.Context, t *tenant.Principal, id string, req *api.Exec, emit func(*api.ExecEvent) error) error {
	timeout, err := checkExec(req)
	if err != nil {
		return err
	}
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	release := func() {}
	if req.Background || req.Detach {
		if release, err = s.takeBackground(b); err != nil {
			return err
		}
	}
	// Given back when the command ends, or when it does not start.
	defer func() { release() }()
	req, argv, err := s.scanExec(ctx, t, b, req)
	if err != nil {
		return err
	}
	// The stream lives until the command ends, for a background command
	// too (its end is recorded); the caller's ctx decides a kill.
	sctx, cancel := context.WithCancel(context.Background())
	defer func() {
		if cancel != nil {
			cancel()
		}
	}()
	x, notStarted, err := s.startExec(ctx, sctx, t, b, req, argv)
	if notStarted != nil {
		return emit(&api.ExecEvent{End: notStarted})
	}
	if err != nil {
		return err
	}
	following := false // a background command's stream is closed by its follower
	var out *outputLog // a background command's output kept, from its start
	if req.Background || req.Detach {
		out = s.keepLog(b, x.pid)
	}
	defer func() {
		if !following {
			x.stream.Close()
			if out != nil {
				out.finish(nil)
			}
		}
	}()
	if err := emit(&api.ExecEvent{PID: x.pid, ExecID: x.id}); err != nil {
		if !req.Background && !req.Detach {
			x.kill()
		}
		if !req.Detach {
			return err
		}
	}
	if err := x.sendStdin(ctx, req); err != nil {
		return err
	}
	if req.Background || req.Detach {
		// Follow it to its end, for the record; the caller has its pid.
		stop, done := cancel, release
		cancel, following, release = nil, true, func() {}
		if req.Detach {
			return x.detached(ctx, out, timeout, stop, done, emit)
		}
		go x.follow(out, stop, done)
		return nil
	}
	return x.foreground(ctx, timeout, emit)
}

// checkExec refuses a malformed command and returns its timeout.
func checkExec(req *api.Exec) (time.Duration, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return 0, errdefs.Invalid("cmd is empty")
	}
	if err := core.ValidUser(req.User); err != nil {
		return 0, err
	}
	timeout, err := core.ParseDuration("timeout", req.Timeout, 0, core.MaxTTL)
	if err != nil {
		return 0, err
	}
	if req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0) {
		return 0, errdefs.Invalid("tty: rows and cols must be positive")
	}
	return timeout, checkEnv(req.Env)
}

// scanExec applies the tenant's scan policy to a command's argv, env and
// stdin. It returns the request to run (a copy: a redact policy rewrites
// it, never the caller's) and the argv to record (redacted whatever the
// policy).
func (s *Commands) scanExec(ctx context.Context, t *tenant.Principal, b *core.Box, req *api.Exec) (*api.Exec, []string, error) {
	r := *req
	req = &r
	req.Cmd = slices.Clone(req.Cmd)
	req.Env = maps.Clone(req.Env)
	argv := slices.Clone(req.Cmd)
	fields := make([]core.Field, 0, len(req.Cmd)+len(req.Env)+1)
	for i := range req.Cmd {
		fields = append(fields, core.Field{Where: fmt.Sprintf("argv[%d]", i), Val: &req.Cmd[i], Shown: &argv[i]})
	}
	envVals := make(map[string]*string, len(req.Env))
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		v := req.Env[k]
		envVals[k] = &v
		fields = append(fields, core.Field{Where: "env " + k, Val: &v})
	}
	stdinText := string(req.Stdin)
	if len(req.Stdin) > 0 {
		fields = append(fields, core.Field{Where: "stdin", Val: &stdinText})
	}
	if err := s.ScanCall(ctx, t, b.WhoFor(t), "exec", fields); err != nil {
		return nil, nil, err
	}
	for k, v := range envVals {
		req.Env[k] = *v
	}
	if len(req.Stdin) > 0 {
		req.Stdin = []byte(stdinText)
	}
	return req, argv, nil
}

// startRequest is the agent's request to start req's command in a
// sandbox of spec sp.
func startRequest(sp *spec.Spec, req *api.Exec) *process.StartRequest {
	start := &process.StartRequest{Process: &process.ProcessConfig{Cmd: req.Cmd[0], Args: req.Cmd[1:], Envs: commandEnv(sp, req.Env)}}
	if req.Cwd != "" {
		start.Process.Cwd = &req.Cwd
	}
	if req.Tag != "" {
		start.Tag = &req.Tag
	}
	stdin := req.KeepStdin || len(req.Stdin) > 0
	start.Stdin = &stdin
	if req.TTY != nil {
		start.Pty = &process.PTY{Size: &process.PTY_Size{Rows: uint32(req.TTY.Rows), Cols: uint32(req.TTY.Cols)}}
	}
	return start
}

// execution is one started command: its stream from the agent (which
// lives in sctx), and what its exec.end record needs.
type execution struct {
	s                   *Commands
	b                   *core.Box
	w                   record.Who
	id                  string // exec id
	pid                 uint32
	t0                  time.Time
	before              counts // the sandbox's, before the command ran
	stream              *connect.ServerStreamForClient[process.StartResponse]
	stdout, stderr, pty *record.Digester
}

// startExec records the request while the agent starts the command; the
// client learns the pid only once the record is on disk. A command that
// cannot start answers the end to report (127 not found, 126 not
// executable), or an error; either way it is recorded as not started.
func (s *Commands) startExec(ctx, sctx context.Context, t *tenant.Principal, b *core.Box, req *api.Exec, argv []string) (*execution, *api.ExecEnd, error) {
	x := &execution{s: s, b: b, w: b.WhoFor(t), id: core.NewID(), t0: time.Now(), stdout: record.NewDigester(), stderr: record.NewDigester(), pty: record.NewDigester()}
	recorded := make(chan error, 1)
	go func() {
		recorded <- s.Cfg.Audit.Commit(ctx, x.w, record.ExecStart{
			ExecID: x.id, Argv: argv, Cwd: req.Cwd, User: core.UserOr(req.User), Env: record.EnvNames(req.Env),
			Background: req.Background, Tag: req.Tag, TTY: req.TTY != nil, Timeout: req.Timeout, StdinBytes: len(req.Stdin),
		})
	}()
	x.before = countsOf(b)
	notStarted := func(why error) {
		if <-recorded == nil {
			s.Cfg.Audit.Note(x.w, record.ExecEnd{ExecID: x.id, ExitCode: -1, Status: "not started", Error: why.Error()})
		}
	}
	stream, err := b.Agent.Proc.Start(sctx, core.AsUser(connect.NewRequest(startRequest(&b.Spec, req)), req.User))
	if err != nil {
		notStarted(err)
		return nil, nil, core.AgentError(err)
	}
	if !stream.Receive() {
		defer stream.Close()
		// A command that cannot start ends the way a shell reports it:
		// 127 not found, 126 not executable.
		var ce *connect.Error
		if errors.As(stream.Err(), &ce) && (ce.Code() == connect.CodeNotFound || ce.Code() == connect.CodeFailedPrecondition) {
			code := 126
			if ce.Code() == connect.CodeNotFound {
				code = 127
			}
			notStarted(ce)
			return nil, &api.ExecEnd{ExitCode: code, Status: "not started", Error: core.AgentError(ce).Error()}, nil
		}
		notStarted(fmt.Errorf("the stream ended: %v", stream.Err()))
		return nil, nil, s.streamEnded(b, stream.Err())
	}
	st := stream.Msg().GetEvent().GetStart()
	if st == nil {
		stream.Close()
		notStarted(errors.New("no start event"))
		return nil, nil, errdefs.New(errdefs.ErrInternal, "the sandbox's agent did not report the start (reported by the sandbox)")
	}
	x.pid, x.stream = st.GetPid(), stream
	s.Cfg.Metrics.Execs.Inc()
	if err := <-recorded; err != nil {
		x.kill() // it must not run unrecorded
		stream.Close()
		return nil, nil, err
	}
	return x, nil, nil
}

// kill ends the command (SIGKILL to its process group).
func (x *execution) kill() {
	kctx, kcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer kcancel()
	_, _ = x.b.Agent.Proc.SendSignal(kctx, connect.NewRequest(&process.SendSignalRequest{Process: selector(x.pid), Signal: process.Signal_SIGNAL_SIGKILL}))
}

// sendStdin writes the request's stdin to the command, and closes it
// unless the caller keeps it open.
func (x *execution) sendStdin(ctx context.Context, req *api.Exec) error {
	if len(req.Stdin) == 0 {
		return nil
	}
	sel := selector(x.pid)
	if _, err := x.b.Agent.Proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: req.Stdin}}})); err != nil {
		return core.AgentError(err)
	}
	if !req.KeepStdin {
		if _, err := x.b.Agent.Proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
			return core.AgentError(err)
		}
	}
	return nil
}

// relay passes the command's events to emit, digesting its output for
// the record, until its end.
func (x *execution) relay(emit func(*api.ExecEvent) error) error {
	return relay(x.stream.Receive, func() *process.ProcessEvent { return x.stream.Msg().GetEvent() }, func(ev *api.ExecEvent) error {
		x.stdout.Add(ev.Stdout)
		x.stderr.Add(ev.Stderr)
		x.pty.Add(ev.PTY)
		return emit(ev)
	})
}

// ended records the command's end (nil: its stream ended without one).
func (x *execution) ended(end *api.ExecEnd) {
	d := record.ExecEnd{ExecID: x.id, PID: int(x.pid), DurationMS: float64(time.Since(x.t0).Microseconds()) / 1000,
		ExitCode: -1, Status: "unknown: the stream ended without an end", Stdout: x.stdout.Seen(), Stderr: x.stderr.Seen(), PTY: x.pty.Seen()}
	if end != nil {
		d.ExitCode, d.Status, d.Error, d.TimedOut = end.ExitCode, end.Status, end.Error, end.TimedOut
		if end.SandboxEnded {
			d.SandboxEnded = end.EndReason
		}
	}
	x.s.Cfg.Audit.Note(x.w, d)
}

// follow follows a background command to its end, for the record and
// its log (out), then closes its stream, cancels it (stop) and gives its
// slot back (done).
func (x *execution) follow(out *outputLog, stop, done func()) {
	defer done()
	defer stop()
	defer x.stream.Close()
	var last *api.ExecEnd
	_ = x.relay(func(ev *api.ExecEvent) error {
		if ev.End != nil {
			last = x.s.tellEnd(x.b, x.before, ev.End)
		} else {
			out.add(ev)
		}
		return nil
	})
	x.ended(last)
	out.finish(last)
}

// foreground streams a command's events to emit until its end, killing it
// at its timeout or when the caller goes away (ctx).
func (x *execution) foreground(ctx context.Context, timeout time.Duration, emit func(*api.ExecEvent) error) error {
	stop := context.AfterFunc(ctx, x.kill) // the caller went away
	defer stop()
	var last *api.ExecEnd
	defer func() { x.ended(last) }()
	return x.timed(timeout, func(ev *api.ExecEvent) error {
		if ev.End != nil {
			last = ev.End
		}
		return emit(ev)
	})
}

// timed relays a command's events to emit until its end, killing it at its
// timeout (0: none), and tells the end (a timeout's, a limit's, the
// sandbox's).
func (x *execution) timed(timeout time.Duration, emit func(*api.ExecEvent) error) error {
	var timedOut atomic.Bool
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() { timedOut.Store(true); x.kill() })
		defer timer.Stop()
	}
	err := x.relay(func(ev *api.ExecEvent) error {
		if ev.End != nil {
			if timer != nil {
				timer.Stop()
			}
			ev.End = x.s.tellEnd(x.b, x.before, ev.End)
			if timedOut.Load() && !ev.End.SandboxEnded {
				ev.End.TimedOut = true
				ev.End.ExitCode = 124
				ev.End.Status = fmt.Sprintf("timeout (%v) reached: killed", timeout)
				x.s.Cfg.Metrics.LimitKills.WithLabelValues("timeout").Inc()
			}
			x.s.Cfg.Metrics.ExecSeconds.Observe(time.Since(x.t0).Seconds())
		}
		return emit(ev)
	})
	if errors.Is(err, errStreamEnded) {
		return x.s.reportSandboxEnd(x.b, x.stream.Err(), emit)
	}
	return err
}

// detached streams a command's events to emit while the caller stays
// (ctx), and follows it to its end whether it stays or not: for the record
// and its log (out), killing it at its timeout; then closes its stream,
// cancels it (stop) and gives its slot back (done).
func (x *execution) detached(ctx context.Context, out *outputLog, timeout time.Duration, stop, done func(), emit func(*api.ExecEvent) error) error {
	events := make(chan *api.ExecEvent)
	gone := make(chan struct{}) // the caller left
	var ferr error              // the follower's, once events is closed
	go func() {
		defer done()
		defer stop()
		defer x.stream.Close()
		defer close(events)
		var last *api.ExecEnd
		ferr = x.timed(timeout, func(ev *api.ExecEvent) error {
			if ev.End != nil {
				last = ev.End
			} else {
				out.add(ev)
			}
			select {
			case events <- ev:
			case <-gone:
			}
			return nil
		})
		x.ended(last)
		out.finish(last)
	}()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return ferr
			}
			if err := emit(ev); err != nil {
				close(gone)
				return err
			}
			if ev.End != nil {
				// Returned once its end is on the record, as a
				// foreground command's.
				for range events {
				}
				return nil
			}
		case <-ctx.Done():
			close(gone)
			return ctx.Err()
		}
	}
}

var errStreamEnded = errors.New("stream ended without an end event")

// relay turns agent process events into API events until the end.
func relay(receive func() bool, msg func() *process.ProcessEvent, emit func(*api.ExecEvent) error) error {
	for receive() {
		ev := msg()
		var out api.ExecEvent
		switch e := ev.GetEvent().(type) {
		case *process.ProcessEvent_Data:
			out.Stdout, out.Stderr, out.PTY = e.Data.GetStdout(), e.Data.GetStderr(), e.Data.GetPty()
		case *process.ProcessEvent_End:
			out.End = &api.ExecEnd{ExitCode: int(e.End.GetExitCode()), Status: e.End.GetStatus(), Error: e.End.GetError()}
			if len(out.End.Status) > 256 {
				out.End.Status = out.End.Status[:256]
			}
			if len(out.End.Error) > 1024 {
				out.End.Error = out.End.Error[:1024]
			}
		default:
			continue // start (already reported), keep-alive
		}
		if err := emit(&out); err != nil {
			return err
		}
		if out.End != nil {
			return nil
		}
	}
	return errStreamEnded
}

// killedExit is the exit code of a command killed by SIGKILL (128 + 9):
// what the agent reports, and what a command whose sandbox ended answers.
const killedExit = 128 + 9

// ending tells whether b is ending: the service is destroying it, or its
// init has exited. A command's agent can report its kill, or lose its
// stream, before the service learns that; ending waits up to wait (0: not
// at all) for init's exit.
func (s *Commands) ending(b *core.Box, wait time.Duration) bool {
	select {
	case <-b.Inst.Done():
		return true
	default:
	}
	b.Mu.Lock()
	ending := b.Ending
	b.Mu.Unlock()
	if ending || wait == 0 {
		return ending
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-b.Inst.Done():
		return true
	case <-timer.C:
		return false
	}
}

// tellEnd returns the end to report for a command that ended with end: a
// command killed because its sandbox is ending is told the sandbox's end
// and why, whichever the service learnt first; one that met the commands'
// limits is told which (the sandbox lives on).
func (s *Commands) tellEnd(b *core.Box, before counts, end *api.ExecEnd) *api.ExecEnd {
	if end.ExitCode == killedExit && s.ending(b, 0) {
		return s.sandboxEnd(b)
	}
	if end.ExitCode == 0 {
		return end
	}
	// The kernel counts an OOM kill before the victim dies, and a refused
	// fork before the fork returns: both are counted by now. Another
	// command of the sandbox meeting the limit meanwhile is counted too,
	// so only a command that failed is told.
	now := countsOf(b)
	mem, pids := b.Spec.Limits.CommandLimits()
	switch {
	case now.oomKills > before.oomKills && end.ExitCode == killedExit:
		end.Limit = "memory"
		end.Status = fmt.Sprintf("memory limit (%s for the commands) exceeded: the kernel's OOM killer killed the command; the sandbox lives on", spec.FormatSize(mem))
	case now.oomKills > before.oomKills:
		end.Limit = "memory"
		end.Status += fmt.Sprintf("; memory limit (%s for the commands) exceeded: the kernel's OOM killer killed a process of the command; the sandbox lives on", spec.FormatSize(mem))
	case now.pidsLimited > before.pidsLimited:
		end.Limit = "pids"
		end.Status += fmt.Sprintf("; pids limit (%d for the commands) reached: %d forks refused; the sandbox lives on", pids, now.pidsLimited-before.pidsLimited)
	default:
		return end
	}
	s.Cfg.Metrics.LimitKills.WithLabelValues(end.Limit).Inc()
	return end
}

// counts are a sandbox's OOM kills and refused forks so far.
type counts struct{ oomKills, pidsLimited int64 }

func countsOf(b *core.Box) counts {
	oom, pids := b.Inst.LimitEvents()
	return counts{oom, pids}
}

// sandboxEnd waits (bounded) for b's end to be recorded and tells it as
// the end of a command it killed.
func (s *Commands) sandboxEnd(b *core.Box) *api.ExecEnd {
	select {
	case <-b.Ended:
	case <-time.After(30 * time.Second):
	}
	b.Mu.Lock()
	reason := b.Rec.EndReason
	b.Mu.Unlock()
	return &api.ExecEnd{ExitCode: killedExit, Status: "sandbox ended", SandboxEnded: true, EndReason: reason}
}

// endGrace is how long a command whose stream broke waits for its
// sandbox's end to be known before it is answered the stream's error. A
// wall's teardown takes its time: on the gVisor wall the host learns of
// the end when runsc run has ended, after its Sentry's and gofer's
// processes are gone, seconds after the agent's stream broke on a busy
// host (more than 2 s seen). A stream that breaks while its sandbox lives
// on is rare (the agent is the sandbox's init or its first process).
const endGrace = 10 * time.Second

// reportSandboxEnd ends a command's stream that broke: with the sandbox's
// end when it died under the command.
func (s *Commands) reportSandboxEnd(b *core.Box, streamErr error, emit func(*api.ExecEvent) error) error {
	if !s.ending(b, endGrace) {
		return s.streamEnded(b, streamErr)
	}
	return emit(&api.ExecEvent{End: s.sandboxEnd(b)})
}

func (s *Commands) streamEnded(b *core.Box, err error) error {
	select {
	case <-b.Inst.Done():
		return errdefs.New(errdefs.ErrNotFound, "the sandbox ended")
	default:
	}
	if err == nil {
		return errdefs.New(errdefs.ErrInternal, "the sandbox's agent closed the stream (reported by the sandbox)")
	}
	return core.AgentError(err)
}

func selector(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

// Attach streams a running command's events from now on, to its end.
func (s *Commands) Attach(ctx context.Context, t *tenant.Principal, id string, pid uint32, emit func(*api.ExecEvent) error) error {
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	stream, err := b.Agent.Proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: selector(pid)}))
	if err != nil {
		return core.AgentError(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		return s.streamEnded(b, stream.Err())
	}
	before := countsOf(b) // limits met from now on are told
	// Like exec's, the stream starts with the pid: the caller knows it is
	// attached before any output comes.
	if err := emit(&api.ExecEvent{PID: pid}); err != nil {
		return err
	}
	err = relay(stream.Receive, func() *process.ProcessEvent { return stream.Msg().GetEvent() }, func(ev *api.ExecEvent) error {
		if ev.End != nil {
			ev.End = s.tellEnd(b, before, ev.End)
		}
		return emit(ev)
	})
	if errors.Is(err, errStreamEnded) {
		return s.reportSandboxEnd(b, stream.Err(), emit)
	}
	return err
}

// Processes lists a sandbox's running commands.
func (s *Commands) Processes(ctx context.Context, t *tenant.Principal, id string) ([]api.Process, error) {
	b, err := s.Use(t, id)
	if err != nil {
		return nil, err
	}
	res, err := b.Agent.Proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		return nil, core.AgentError(err)
	}
	out := []api.Process{}
	for _, p := range res.Msg.GetProcesses() {
		out = append(out, api.Process{PID: p.GetPid(), Tag: p.GetTag(), Cmd: append([]string{p.GetConfig().GetCmd()}, p.GetConfig().GetArgs()...), Cwd: p.GetConfig().GetCwd()})
		if len(out) >= 10_000 {
			break
		}
	}
	return out, nil
}

// Input writes to a command's stdin (or terminal), or closes its stdin.
func (s *Commands) Input(ctx context.Context, t *tenant.Principal, id string, pid uint32, in *api.Input) error {
	return s.input(ctx, t, id, pid, in, inputAny)
}

// InputTo writes data to a command's stdin, or to its terminal (pty), as
// E2B's envd does: the other is not tried.
func (s *Commands) InputTo(ctx context.Context, t *tenant.Principal, id string, pid uint32, data []byte, pty bool) error {
	to := inputStdin
	if pty {
		to = inputPTY
	}
	return s.input(ctx, t, id, pid, &api.Input{Data: data}, to)
}

// Where input goes.
const (
	inputAny   = iota // stdin, or the terminal of a command on one
	inputStdin        // stdin only
	inputPTY          // the terminal only
)

func (s *Commands) input(ctx context.Context, t *tenant.Principal, id string, pid uint32, in *api.Input, to int) error {
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	if len(in.Data) > 0 {
		text := string(in.Data)
		if err := s.ScanCall(ctx, t, b.WhoFor(t), "input", []core.Field{{Where: "stdin", Val: &text}}); err != nil {
			return err
		}
		in = &api.Input{Data: []byte(text), EOF: in.EOF}
		send := func(pi *process.ProcessInput) error {
			_, err := b.Agent.Proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: selector(pid), Input: pi}))
			return err
		}
		stdin := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: in.Data}}
		pty := &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: in.Data}}
		switch to {
		case inputStdin:
			err = send(stdin)
		case inputPTY:
			err = send(pty)
		default:
			// Try stdin; a command on a terminal takes it there.
			err = send(stdin)
			var ce *connect.Error
			if errors.As(err, &ce) && ce.Code() == connect.CodeFailedPrecondition {
				err = send(pty)
			}
		}
		if err != nil {
			return core.AgentError(err)
		}
	}
	if in.EOF {
		if _, err := b.Agent.Proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: selector(pid)})); err != nil {
			return core.AgentError(err)
		}
	}
	return nil
}

// Signal sends TERM or KILL to a command's process group.
func (s *Commands) Signal(ctx context.Context, t *tenant.Principal, id string, pid uint32, sig string) error {
	var ps process.Signal
	switch sig {
	case "TERM", "SIGTERM":
		ps = process.Signal_SIGNAL_SIGTERM
	case "KILL", "SIGKILL":
		ps = process.Signal_SIGNAL_SIGKILL
	default:
		return errdefs.Invalid(fmt.Sprintf("signal %q: want TERM or KILL", sig))
	}
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	_, err = b.Agent.Proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: selector(pid), Signal: ps}))
	return core.AgentError(err)
}

// Resize changes a command's terminal size.
func (s *Commands) Resize(ctx context.Context, t *tenant.Principal, id string, pid uint32, tty *api.TTY) error {
	if tty.Rows == 0 || tty.Cols == 0 {
		return errdefs.Invalid("rows and cols must be positive")
	}
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	_, err = b.Agent.Proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: selector(pid), Pty: &process.PTY{Size: &process.PTY_Size{Rows: uint32(tty.Rows), Cols: uint32(tty.Cols)}}}))
	return core.AgentError(err)
}

// commandEnv is the environment a command asks of the agent: its own
// (env), over the sandbox's when the sandbox was made ahead for a pool,
// whose agent was started without it (spec.Spec.Pool). HOME, USER and
// LOGNAME stay the agent's, as they do for a sandbox made with its env.
func commandEnv(sp *spec.Spec, env map[string]string) map[string]string {
	if sp.Pool == "" || len(sp.Env) == 0 {
		return env
	}
	out := make(map[string]string, len(sp.Env)+len(env))
	for _, kv := range sp.Env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "HOME", "USER", "LOGNAME":
			continue
		}
		out[k] = v
	}
	maps.Copy(out, env)
	return out
}
