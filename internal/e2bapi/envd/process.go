package envd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/process"
)

// processes is envd's process.Process over the sandbox service.
type processes struct{ h *Handler }

// Start runs a command as envd does: its events are streamed, a caller
// that goes away leaves it running, and Connect-Timeout-Ms (the stream's
// deadline) is its lifetime: it is killed then. A command that cannot
// start is an error of the call, never an end without a start.
func (p *processes) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	t, err := target(ctx)
	if err != nil {
		return connectErr(err)
	}
	user, err := userOf(req.Header())
	if err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	ex := &api.Exec{
		Cmd: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd(), User: user,
		Tag: req.Msg.GetTag(), KeepStdin: req.Msg.Stdin == nil || req.Msg.GetStdin(), Detach: true,
	}
	if size := req.Msg.GetPty().GetSize(); req.Msg.GetPty() != nil {
		if size.GetRows() > 1<<16-1 || size.GetCols() > 1<<16-1 {
			return connect.NewError(connect.CodeInvalidArgument, errors.New("pty: rows and cols must fit 16 bits"))
		}
		ex.TTY = &api.TTY{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}
	}
	if dl, ok := ctx.Deadline(); ok {
		d := time.Until(dl).Round(time.Millisecond)
		if d <= 0 {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the request's deadline passed"))
		}
		ex.Timeout = min(d, maxLifetime).String()
	}
	send, stop := keepAlive(ctx, keepaliveInterval(req.Header()), stream.Send, &process.StartResponse{Event: processAlive()})
	defer stop()
	started := false
	err = p.h.svc.Exec(ctx, t.Principal, t.ID, ex, func(ev *api.ExecEvent) error {
		if !started && ev.End != nil {
			return notStarted(ev.End)
		}
		started = true
		return send(&process.StartResponse{Event: event(ev)})
	})
	return connectErr(err)
}

// maxLifetime bounds a command's Connect-Timeout-Ms: the service's
// longest timeout (a sandbox's longest TTL).
const maxLifetime = 7 * 24 * time.Hour

// notStarted is the error of a command that did not start (airlock's end
// 127: not found, 126: not executable).
func notStarted(end *api.ExecEnd) error {
	code := connect.CodeFailedPrecondition
	if end.ExitCode == 127 {
		code = connect.CodeInvalidArgument
	}
	msg := end.Error
	if msg == "" {
		msg = end.Status
	}
	return connect.NewError(code, fmt.Errorf("the command did not start: %s", msg))
}

// event is envd's form of a command's event: the start (pid), output, or
// its end.
func event(ev *api.ExecEvent) *process.ProcessEvent {
	switch {
	case ev.End != nil:
		return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(ev.End)}}
	case ev.Stdout != nil:
		return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: ev.Stdout}}}}
	case ev.Stderr != nil:
		return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: ev.Stderr}}}}
	case ev.PTY != nil:
		return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: ev.PTY}}}}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: ev.PID}}}
}

func processAlive() *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}
}

// endEvent is envd's end of a command: as Go's os/exec tells it, which is
// what the SDKs show (CommandExitError's message is its error): exit code
// N and "exit status N" for an exit, exit code -1 and "signal: killed"
// for a command killed (by a signal, its timeout, or its sandbox's end).
func endEvent(end *api.ExecEnd) *process.ProcessEvent_EndEvent {
	out := &process.ProcessEvent_EndEvent{ExitCode: int32(end.ExitCode), Status: end.Status}
	switch {
	case end.TimedOut || end.SandboxEnded:
		out.ExitCode, out.Status = -1, "signal: killed"
	case strings.HasPrefix(end.Status, "signal: "):
		out.ExitCode = -1
	case strings.HasPrefix(end.Status, "exit status "):
		out.Exited = true
	}
	switch {
	case end.Error != "":
		out.Error = &end.Error
	case out.ExitCode != 0:
		msg := out.Status
		if out.Exited {
			msg = fmt.Sprintf("exit status %d", out.ExitCode)
		} else if i := strings.IndexByte(msg, ';'); i >= 0 {
			msg = msg[:i] // a limit's note follows the signal
		}
		out.Error = &msg
	}
	return out
}

// pidOf finds the command a selector names: by pid, or by tag among the
// sandbox's running commands.
func (p *processes) pidOf(ctx context.Context, t Target, sel *process.ProcessSelector) (uint32, error) {
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		return s.Pid, nil
	case *process.ProcessSelector_Tag:
		procs, err := p.h.svc.Processes(ctx, t.Principal, t.ID)
		if err != nil {
			return 0, connectErr(err)
		}
		for _, pr := range procs {
			if pr.Tag == s.Tag {
				return pr.PID, nil
			}
		}
		return 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("no process tagged %q", s.Tag))
	}
	return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("process: give a pid or a tag"))
}

// Connect streams a running command's events from now on; the caller
// going away does not end it.
func (p *processes) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	t, err := target(ctx)
	if err != nil {
		return connectErr(err)
	}
	pid, err := p.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	send, stop := keepAlive(ctx, keepaliveInterval(req.Header()), stream.Send, &process.ConnectResponse{Event: processAlive()})
	defer stop()
	return connectErr(p.h.svc.Attach(ctx, t.Principal, t.ID, pid, func(ev *api.ExecEvent) error {
		return send(&process.ConnectResponse{Event: event(ev)})
	}))
}

func (p *processes) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	t, err := target(ctx)
	if err != nil {
		return nil, connectErr(err)
	}
	procs, err := p.h.svc.Processes(ctx, t.Principal, t.ID)
	if err != nil {
		return nil, connectErr(err)
	}
	out := &process.ListResponse{Processes: make([]*process.ProcessInfo, 0, len(procs))}
	for _, pr := range procs {
		info := &process.ProcessInfo{Pid: pr.PID, Config: &process.ProcessConfig{}}
		if len(pr.Cmd) > 0 {
			info.Config.Cmd, info.Config.Args = pr.Cmd[0], pr.Cmd[1:]
		}
		if pr.Cwd != "" {
			info.Config.Cwd = &pr.Cwd
		}
		if pr.Tag != "" {
			info.Tag = &pr.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// input writes one input (stdin or terminal) to a command.
func (p *processes) input(ctx context.Context, t Target, pid uint32, in *process.ProcessInput) error {
	var data []byte
	pty := false
	switch i := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = i.Stdin
	case *process.ProcessInput_Pty:
		data, pty = i.Pty, true
	}
	if len(data) == 0 {
		return nil
	}
	return connectErr(p.h.svc.InputTo(ctx, t.Principal, t.ID, pid, data, pty))
}

func (p *processes) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	t, err := target(ctx)
	if err != nil {
		return nil, connectErr(err)
	}
	pid, err := p.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.input(ctx, t, pid, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput writes a stream's inputs in order to the command its first
// message names.
func (p *processes) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	t, err := target(ctx)
	if err != nil {
		return nil, connectErr(err)
	}
	var pid uint32
	started := false
	for stream.Receive() {
		switch e := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			if started {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a second start on the stream"))
			}
			if pid, err = p.pidOf(ctx, t, e.Start.GetProcess()); err != nil {
				return nil, err
			}
			started = true
		case *process.StreamInputRequest_Data:
			if !started {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start naming the process"))
			}
			if err := p.input(ctx, t, pid, e.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (p *processes) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	t, err := target(ctx)
	if err != nil {
		return nil, connectErr(err)
	}
	pid, err := p.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.h.svc.Input(ctx, t.Principal, t.ID, pid, &api.Input{EOF: true}); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (p *processes) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	t, err := target(ctx)
	if err != nil {
		return nil, connectErr(err)
	}
	pid, err := p.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = "KILL"
	case process.Signal_SIGNAL_SIGTERM:
		sig = "TERM"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: want SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	if sig != "KILL" {
		if err := p.h.svc.Signal(ctx, t.Principal, t.ID, pid, sig); err != nil {
			return nil, connectErr(err)
		}
		return connect.NewResponse(&process.SendSignalResponse{}), nil
	}
	if err := p.kill(ctx, t, pid); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// killWait bounds how long a kill waits for the command's end.
const killWait = 5 * time.Second

// kill sends SIGKILL to a command and answers once it has ended (within
// killWait), so that a list right after the SDK's kill() no longer shows
// it: it follows the command (Attach) from before the signal to its end.
func (p *processes) kill(ctx context.Context, t Target, pid uint32) error {
	actx, cancel := context.WithTimeout(ctx, killWait)
	defer cancel()
	attached := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		once := false
		ended <- p.h.svc.Attach(actx, t.Principal, t.ID, pid, func(ev *api.ExecEvent) error {
			if !once {
				once = true
				close(attached)
			}
			return nil
		})
	}()
	select {
	case <-attached:
	case err := <-ended: // gone already (not found), or not to be followed
		if err == nil {
			err = p.h.svc.Signal(ctx, t.Principal, t.ID, pid, "KILL")
		}
		return connectErr(err)
	}
	if err := p.h.svc.Signal(ctx, t.Principal, t.ID, pid, "KILL"); err != nil {
		return connectErr(err)
	}
	select {
	case <-ended:
	case <-actx.Done():
	}
	return nil
}

// Update resizes a command's terminal (the only update envd has).
func (p *processes) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	t, err := target(ctx)
	if err != nil {
		return nil, connectErr(err)
	}
	pid, err := p.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if size.GetRows() > 1<<16-1 || size.GetCols() > 1<<16-1 {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("pty: rows and cols must fit 16 bits"))
		}
		if err := p.h.svc.Resize(ctx, t.Principal, t.ID, pid, &api.TTY{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}); err != nil {
			return nil, connectErr(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
