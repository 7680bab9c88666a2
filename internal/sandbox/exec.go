package sandbox

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
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

func validUser(u string) error {
	switch u {
	case "", "user", "root":
		return nil
	}
	return errdefs.Invalid(fmt.Sprintf("user %q: want \"user\" or \"root\"", u))
}

// Default caps on background commands running at once.
const (
	DefaultMaxBackground          = 64
	DefaultMaxBackgroundPerTenant = 256
)

// takeBackground counts one more background command of b, within the
// sandbox's and its tenant's caps; release gives it back.
func (s *Service) takeBackground(b *box) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tenant := b.rec.Tenant // its id
	switch {
	case b.background >= s.cfg.MaxBackground:
		return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("sandbox %s runs %d background commands, its most at once: wait for one to end or kill one (POST .../processes/{pid}/signal)", b.rec.ID, b.background))
	case s.background[tenant] >= s.cfg.MaxBackgroundPerTenant:
		return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("tenant %s runs %d background commands in all, its most at once: wait for one to end or kill one", b.rec.TenantName, s.background[tenant]))
	}
	b.background++
	s.background[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			b.background--
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
func (s *Service) Exec(ctx context.Context, t *tenant.Principal, id string, req *api.Exec, emit func(*api.ExecEvent) error) error {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return errdefs.Invalid("cmd is empty")
	}
	if err := validUser(req.User); err != nil {
		return err
	}
	timeout, err := parseDuration("timeout", req.Timeout, 0, MaxTTL)
	if err != nil {
		return err
	}
	if req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0) {
		return errdefs.Invalid("tty: rows and cols must be positive")
	}
	if err := checkEnv(req.Env); err != nil {
		return err
	}
	b, err := s.use(t, id)
	if err != nil {
		return err
	}
	release := func() {}
	if req.Background {
		if release, err = s.takeBackground(b); err != nil {
			return err
		}
	}
	// Given back when the command ends, or when it does not start.
	defer func() { release() }()
	// The caller's own copy is not rewritten (redact policy).
	r := *req
	req = &r
	req.Cmd = slices.Clone(req.Cmd)
	req.Env = maps.Clone(req.Env)
	// What the record keeps of argv: redacted whatever the policy.
	argv := slices.Clone(req.Cmd)
	fields := make([]field, 0, len(req.Cmd)+len(req.Env)+1)
	for i := range req.Cmd {
		fields = append(fields, field{fmt.Sprintf("argv[%d]", i), &req.Cmd[i], &argv[i]})
	}
	envVals := make(map[string]*string, len(req.Env))
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		v := req.Env[k]
		envVals[k] = &v
		fields = append(fields, field{"env " + k, &v, nil})
	}
	stdinText := string(req.Stdin)
	if len(req.Stdin) > 0 {
		fields = append(fields, field{"stdin", &stdinText, nil})
	}
	if err := s.scanCall(ctx, t, b.who(), "exec", fields); err != nil {
		return err
	}
	for k, v := range envVals {
		req.Env[k] = *v
	}
	if len(req.Stdin) > 0 {
		req.Stdin = []byte(stdinText)
	}
	t0 := time.Now()
	start := &process.StartRequest{Process: &process.ProcessConfig{Cmd: req.Cmd[0], Args: req.Cmd[1:], Envs: req.Env}}
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
	// The stream lives until the command ends, for a background command
	// too (its end is recorded); the caller's ctx decides a kill.
	sctx, cancel := context.WithCancel(context.Background())
	defer func() {
		if cancel != nil {
			cancel()
		}
	}()
	// The request is recorded while the agent starts the command; the
	// client learns the pid only once the record is on disk.
	w := b.who()
	execID := newID()
	recorded := make(chan error, 1)
	go func() {
		recorded <- s.commit(ctx, w, "exec.start", "observed", map[string]any{
			"exec_id": execID, "argv": argv, "cwd": req.Cwd, "user": userOr(req.User), "env": envNames(req.Env),
			"background": req.Background, "tag": req.Tag, "tty": req.TTY != nil, "timeout": req.Timeout, "stdin_bytes": len(req.Stdin),
		})
	}()
	notStarted := func(why error) {
		if <-recorded == nil {
			s.note(w, "exec.end", "reported", map[string]any{"exec_id": execID, "status": "not started", "error": why.Error()})
		}
	}
	stream, err := b.agent.proc.Start(sctx, asUser(connect.NewRequest(start), req.User))
	if err != nil {
		notStarted(err)
		return agentError(err)
	}
	following := false // a background command's stream is closed by its follower
	defer func() {
		if !following {
			stream.Close()
		}
	}()
	if !stream.Receive() {
		// A command that cannot start ends the way a shell reports it:
		// 127 not found, 126 not executable.
		var ce *connect.Error
		if errors.As(stream.Err(), &ce) && (ce.Code() == connect.CodeNotFound || ce.Code() == connect.CodeFailedPrecondition) {
			code := 126
			if ce.Code() == connect.CodeNotFound {
				code = 127
			}
			notStarted(ce)
			return emit(&api.ExecEvent{End: &api.ExecEnd{ExitCode: code, Status: "not started", Error: agentError(ce).Error()}})
		}
		notStarted(fmt.Errorf("the stream ended: %v", stream.Err()))
		return s.streamEnded(b, stream.Err())
	}
	st := stream.Msg().GetEvent().GetStart()
	if st == nil {
		notStarted(errors.New("no start event"))
		return errdefs.New(errdefs.ErrInternal, "the sandbox's agent did not report the start (reported by the sandbox)")
	}
	pid := st.GetPid()
	s.cfg.Metrics.execs.Inc()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	kill := func() {
		kctx, kcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer kcancel()
		_, _ = b.agent.proc.SendSignal(kctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
	}
	if err := <-recorded; err != nil {
		kill() // it must not run unrecorded
		return err
	}
	out := map[string]*streamDigest{"stdout": newStreamDigest(), "stderr": newStreamDigest(), "pty": newStreamDigest()}
	ended := func(end *api.ExecEnd, t0 time.Time) {
		data := map[string]any{"exec_id": execID, "pid": pid, "duration_ms": float64(time.Since(t0).Microseconds()) / 1000}
		for k, d := range out {
			if d.n > 0 {
				data[k] = d.summary()
			}
		}
		if end != nil {
			data["exit_code"], data["status"], data["error"], data["timed_out"] = end.ExitCode, end.Status, end.Error, end.TimedOut
			if end.SandboxEnded {
				data["sandbox_ended"] = end.EndReason
			}
		} else {
			data["status"] = "unknown: the stream ended without an end"
		}
		s.note(w, "exec.end", "reported", data)
	}
	digest := func(ev *api.ExecEvent) {
		out["stdout"].add(ev.Stdout)
		out["stderr"].add(ev.Stderr)
		out["pty"].add(ev.PTY)
	}
	if err := emit(&api.ExecEvent{PID: pid, ExecID: execID}); err != nil {
		if !req.Background {
			kill()
		}
		return err
	}
	if len(req.Stdin) > 0 {
		if _, err := b.agent.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: req.Stdin}}})); err != nil {
			return agentError(err)
		}
	}
	if len(req.Stdin) > 0 && !req.KeepStdin {
		if _, err := b.agent.proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
			return agentError(err)
		}
	}
	if req.Background {
		// Follow it to its end, for the record; the caller has its pid.
		stop, done := cancel, release
		cancel, following, release = nil, true, func() {}
		go func() {
			defer done()
			defer stop()
			defer stream.Close()
			var last *api.ExecEnd
			_ = relay(stream.Receive, func() *process.ProcessEvent { return stream.Msg().GetEvent() }, func(ev *api.ExecEvent) error {
				digest(ev)
				last = ev.End
				return nil
			})
			ended(last, t0)
		}()
		return nil
	}
	var timedOut atomic.Bool
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() { timedOut.Store(true); kill() })
		defer timer.Stop()
	}
	stop := context.AfterFunc(ctx, kill) // the caller went away
	defer stop()
	var last *api.ExecEnd
	defer func() { ended(last, t0) }()
	err = relay(stream.Receive, func() *process.ProcessEvent { return stream.Msg().GetEvent() }, func(ev *api.ExecEvent) error {
		digest(ev)
		if ev.End != nil {
			last = ev.End
			if timer != nil {
				timer.Stop()
			}
			if timedOut.Load() {
				ev.End.TimedOut = true
				ev.End.ExitCode = 124
				ev.End.Status = fmt.Sprintf("timeout (%v) reached: killed", timeout)
				s.cfg.Metrics.limitKills.WithLabelValues("timeout").Inc()
			}
			s.cfg.Metrics.execSeconds.Observe(time.Since(t0).Seconds())
		}
		return emit(ev)
	})
	if errors.Is(err, errStreamEnded) {
		return s.reportSandboxEnd(b, stream.Err(), func(ev *api.ExecEvent) error { last = ev.End; return emit(ev) })
	}
	return err
}

func userOr(u string) string {
	if u == "" {
		return "user"
	}
	return u
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

// reportSandboxEnd ends a command's stream whose sandbox died under it.
func (s *Service) reportSandboxEnd(b *box, streamErr error, emit func(*api.ExecEvent) error) error {
	select {
	case <-b.inst.Done():
	case <-time.After(2 * time.Second):
		return s.streamEnded(b, streamErr)
	}
	select {
	case <-b.ended:
	case <-time.After(30 * time.Second):
	}
	b.mu.Lock()
	reason := b.rec.EndReason
	b.mu.Unlock()
	return emit(&api.ExecEvent{End: &api.ExecEnd{ExitCode: 137, Status: "sandbox ended", SandboxEnded: true, EndReason: reason}})
}

func (s *Service) streamEnded(b *box, err error) error {
	select {
	case <-b.inst.Done():
		return errdefs.New(errdefs.ErrNotFound, "the sandbox ended")
	default:
	}
	if err == nil {
		return errdefs.New(errdefs.ErrInternal, "the sandbox's agent closed the stream (reported by the sandbox)")
	}
	return agentError(err)
}

func selector(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

// Attach streams a running command's events from now on, to its end.
func (s *Service) Attach(ctx context.Context, t *tenant.Principal, id string, pid uint32, emit func(*api.ExecEvent) error) error {
	b, err := s.use(t, id)
	if err != nil {
		return err
	}
	stream, err := b.agent.proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: selector(pid)}))
	if err != nil {
		return agentError(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		return s.streamEnded(b, stream.Err())
	}
	// Like exec's, the stream starts with the pid: the caller knows it is
	// attached before any output comes.
	if err := emit(&api.ExecEvent{PID: pid}); err != nil {
		return err
	}
	err = relay(stream.Receive, func() *process.ProcessEvent { return stream.Msg().GetEvent() }, emit)
	if errors.Is(err, errStreamEnded) {
		return s.reportSandboxEnd(b, stream.Err(), emit)
	}
	return err
}

// Processes lists a sandbox's running commands.
func (s *Service) Processes(ctx context.Context, t *tenant.Principal, id string) ([]api.Process, error) {
	b, err := s.use(t, id)
	if err != nil {
		return nil, err
	}
	res, err := b.agent.proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		return nil, agentError(err)
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
func (s *Service) Input(ctx context.Context, t *tenant.Principal, id string, pid uint32, in *api.Input) error {
	b, err := s.use(t, id)
	if err != nil {
		return err
	}
	if len(in.Data) > 0 {
		text := string(in.Data)
		if err := s.scanCall(ctx, t, b.who(), "input", []field{{"stdin", &text, nil}}); err != nil {
			return err
		}
		in = &api.Input{Data: []byte(text), EOF: in.EOF}
		// Try stdin; a command on a terminal takes it there.
		_, err := b.agent.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: selector(pid), Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: in.Data}}}))
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodeFailedPrecondition {
			_, err = b.agent.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: selector(pid), Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: in.Data}}}))
		}
		if err != nil {
			return agentError(err)
		}
	}
	if in.EOF {
		if _, err := b.agent.proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: selector(pid)})); err != nil {
			return agentError(err)
		}
	}
	return nil
}

// Signal sends TERM or KILL to a command's process group.
func (s *Service) Signal(ctx context.Context, t *tenant.Principal, id string, pid uint32, sig string) error {
	var ps process.Signal
	switch sig {
	case "TERM", "SIGTERM":
		ps = process.Signal_SIGNAL_SIGTERM
	case "KILL", "SIGKILL":
		ps = process.Signal_SIGNAL_SIGKILL
	default:
		return errdefs.Invalid(fmt.Sprintf("signal %q: want TERM or KILL", sig))
	}
	b, err := s.use(t, id)
	if err != nil {
		return err
	}
	_, err = b.agent.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: selector(pid), Signal: ps}))
	return agentError(err)
}

// Resize changes a command's terminal size.
func (s *Service) Resize(ctx context.Context, t *tenant.Principal, id string, pid uint32, tty *api.TTY) error {
	if tty.Rows == 0 || tty.Cols == 0 {
		return errdefs.Invalid("rows and cols must be positive")
	}
	b, err := s.use(t, id)
	if err != nil {
		return err
	}
	_, err = b.agent.proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: selector(pid), Pty: &process.PTY{Size: &process.PTY_Size{Rows: uint32(tty.Rows), Cols: uint32(tty.Cols)}}}))
	return agentError(err)
}
