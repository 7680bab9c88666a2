package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/internal/confined/agent/files"
	"golang.org/x/sys/unix"
)

// procs is the registry of running commands.
type procs struct {
	mu   sync.Mutex
	byID map[uint32]*proc
}

func newProcs() *procs { return &procs{byID: map[uint32]*proc{}} }

// proc is one running command and whoever listens to it.
type proc struct {
	pid    uint32
	cfg    *process.ProcessConfig
	tag    string
	stdin  *os.File // nil unless requested
	pty    *os.File // the master, with a terminal
	mu     sync.Mutex
	subs   map[chan *process.ProcessEvent]struct{}
	end    *process.ProcessEvent // set once it has ended
	closed bool
}

// subscribe adds a listener; it gets every event from now on and the end.
func (p *proc) subscribe() chan *process.ProcessEvent {
	ch := make(chan *process.ProcessEvent, 64)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		ch <- p.end
		close(ch)
		return ch
	}
	p.subs[ch] = struct{}{}
	return ch
}

func (p *proc) unsubscribe(ch chan *process.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.subs[ch]; ok {
		delete(p.subs, ch)
		close(ch)
	}
}

// publish hands ev to every listener. A slow listener slows the command's
// output (back-pressure) rather than losing it; with none, output is dropped.
func (p *proc) publish(ev *process.ProcessEvent) {
	p.mu.Lock()
	subs := make([]chan *process.ProcessEvent, 0, len(p.subs))
	for ch := range p.subs {
		subs = append(subs, ch)
	}
	p.mu.Unlock()
	for _, ch := range subs {
		func() {
			defer func() { _ = recover() }() // unsubscribed meanwhile
			select {
			case ch <- ev:
			case <-time.After(30 * time.Second):
			}
		}()
	}
}

func (p *proc) finish(ev *process.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.end = ev
	for ch := range p.subs {
		select {
		case ch <- ev:
		default:
			go func() { defer func() { _ = recover() }(); ch <- ev; close(ch) }()
			continue
		}
		close(ch)
	}
	p.subs = nil
}

func (r *procs) get(sel *process.ProcessSelector) (*proc, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p, ok := r.byID[s.Pid]; ok {
			return p, nil
		}
	case *process.ProcessSelector_Tag:
		for _, p := range r.byID {
			if p.tag == s.Tag {
				return p, nil
			}
		}
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no process selector"))
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New("no such process"))
}

type processService struct{ a *agent }

func dataEvent(d *process.ProcessEvent_DataEvent) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

func (s *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	u, err := s.a.users.FromHeader(req.Header())
	if err != nil {
		return err
	}
	p, ch, err := s.a.start(u, req.Msg)
	if err != nil {
		return err
	}
	return forward(ctx, p, ch, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	}, true)
}

// forward streams a process's events to one client until it ends or the
// client goes. A client going away does not end the process.
func forward(ctx context.Context, p *proc, ch chan *process.ProcessEvent, send func(*process.ProcessEvent) error, started bool) error {
	defer p.unsubscribe(ch)
	if started {
		if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
			return err
		}
	}
	keep := time.NewTicker(30 * time.Second)
	defer keep.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return nil
			}
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
		case <-keep.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// start launches one command and returns it with a subscription taken
// before it ran, so that none of its output is missed.
func (a *agent) start(u files.User, req *process.StartRequest) (*proc, chan *process.ProcessEvent, error) {
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty"))
	}
	cwd := a.o.Cwd
	if cfg.Cwd != nil {
		var err error
		if cwd, err = files.Resolve(u, cfg.GetCwd()); err != nil {
			return nil, nil, err
		}
	}
	env := append([]string{}, a.o.Env...)
	env = setEnv(env, "HOME", u.Home)
	env = setEnv(env, "USER", u.Name)
	env = setEnv(env, "LOGNAME", u.Name)
	keys := make([]string, 0, len(cfg.GetEnvs()))
	for k := range cfg.GetEnvs() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsAny(cfg.Envs[k], "\x00") {
			return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("bad environment variable %q", k))
		}
		env = setEnv(env, k, cfg.Envs[k])
	}
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	for _, s := range argv {
		if strings.ContainsAny(s, "\x00") {
			return nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("argument contains NUL"))
		}
	}

	var closeAfter []*os.File
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	p := &proc{cfg: cfg, tag: req.GetTag(), subs: map[chan *process.ProcessEvent]struct{}{}}
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Sys: &syscall.SysProcAttr{
		Setsid:     true,
		Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}}
	var outputs []*os.File
	if req.Pty != nil {
		sz := req.GetPty().GetSize()
		master, slave, err := a.o.Launcher.OpenPTY(u.UID, uint16(sz.GetRows()), uint16(sz.GetCols()))
		if err != nil {
			return nil, nil, files.ConnectError(err)
		}
		closeAfter = append(closeAfter, slave)
		p.pty = master
		attr.Files = []uintptr{slave.Fd(), slave.Fd(), slave.Fd()}
		attr.Sys.Setctty = true
		outputs = []*os.File{master}
	} else {
		var stdin *os.File
		if req.GetStdin() {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, nil, files.ConnectError(err)
			}
			stdin, p.stdin = r, w
			closeAfter = append(closeAfter, stdin)
		} else {
			var err error
			if stdin, err = a.devNull(); err != nil {
				return nil, nil, files.ConnectError(err)
			}
		}
		or, ow, err := outputPipe()
		if err != nil {
			return nil, nil, files.ConnectError(err)
		}
		er, ew, err := outputPipe()
		if err != nil {
			or.Close()
			ow.Close()
			return nil, nil, files.ConnectError(err)
		}
		closeAfter = append(closeAfter, ow, ew)
		attr.Files = []uintptr{stdin.Fd(), ow.Fd(), ew.Fd()}
		outputs = []*os.File{or, er}
	}
	ch := p.subscribe()
	pid, err := a.o.Launcher.Start(argv, attr)
	if err != nil {
		for _, f := range outputs {
			f.Close()
		}
		if p.stdin != nil {
			p.stdin.Close()
		}
		if p.pty != nil {
			p.pty.Close()
		}
		// The launch changes to cwd before it executes the command, and
		// both report ENOENT alike: a missing directory is not a missing
		// command (127 and 126 are the command's).
		if cfg.Cwd != nil {
			if fi, serr := os.Stat(cwd); serr != nil || !fi.IsDir() {
				return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %q: no such directory in the sandbox", cwd))
			}
		}
		code := connect.CodeFailedPrecondition
		if errors.Is(err, os.ErrNotExist) {
			code = connect.CodeNotFound
		}
		return nil, nil, connect.NewError(code, err)
	}
	p.pid = uint32(pid)
	a.procs.mu.Lock()
	a.procs.byID[p.pid] = p
	a.procs.mu.Unlock()
	go a.run(p, outputs)
	return p, ch, nil
}

// devNull is the stdin of a command given none: /dev/null, opened once for
// the agent's life (close-on-exec; each command gets its own copy).
func (a *agent) devNull() (*os.File, error) {
	a.nullOnce.Do(func() { a.null, a.nullErr = os.Open(os.DevNull) })
	return a.null, a.nullErr
}

// outputPipe is a pipe for a command's output: the read end the agent's,
// in Go's poller; the write end only handed to the command and closed, so
// it stays blocking and out of the poller (os.Pipe would add both ends,
// then take the write end out again for the command: six syscalls more an
// exec, for two pipes).
func outputPipe() (r, w *os.File, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(fds[0]), "|0"), os.NewFile(uintptr(fds[1]), "|1"), nil
}

// run relays a command's output and reports its end.
func (a *agent) run(p *proc, outputs []*os.File) {
	var wg sync.WaitGroup
	for i, f := range outputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := f.Read(buf)
				if n > 0 {
					d := &process.ProcessEvent_DataEvent{}
					data := append([]byte(nil), buf[:n]...)
					switch {
					case p.pty != nil:
						d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: data}
					case i == 0:
						d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: data}
					default:
						d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: data}
					}
					p.publish(dataEvent(d))
				}
				if err != nil {
					return
				}
			}
		}()
	}
	// What the command left in its process group ends with it (the
	// launcher kills the group as it reaps the command: a shell's "cmd &",
	// a fork bomb's children); a daemon meant to outlive it starts its own
	// session (setsid) or runs as a background command.
	ws, err := a.o.Launcher.Wait(int(p.pid))
	// Output still in the pipes is delivered; a background child that
	// keeps them open does not hold the end back for more than a moment.
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(500 * time.Millisecond):
		for _, f := range outputs {
			_ = f.SetReadDeadline(time.Now())
		}
		<-drained
	}
	for _, f := range outputs {
		if f != p.pty {
			f.Close()
		}
	}
	end := &process.ProcessEvent_EndEvent{}
	switch {
	case err != nil:
		end.ExitCode, end.Status = -1, "unknown"
		e := err.Error()
		end.Error = &e
	case ws.Signaled():
		end.ExitCode = int32(128 + int(ws.Signal()))
		end.Status = "signal: " + ws.Signal().String()
	default:
		end.ExitCode, end.Exited = int32(ws.ExitStatus()), true
		end.Status = fmt.Sprintf("exit status %d", ws.ExitStatus())
	}
	a.procs.mu.Lock()
	delete(a.procs.byID, p.pid)
	a.procs.mu.Unlock()
	p.mu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
	}
	if p.pty != nil {
		p.pty.Close()
	}
	p.closed = true
	p.mu.Unlock()
	p.finish(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	ch := p.subscribe()
	return forward(ctx, p, ch, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	}, true)
}

func (s *processService) List(context.Context, *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	s.a.procs.mu.Lock()
	defer s.a.procs.mu.Unlock()
	out := &process.ListResponse{}
	for _, p := range s.a.procs.byID {
		info := &process.ProcessInfo{Config: p.cfg, Pid: p.pid}
		if p.tag != "" {
			info.Tag = &p.tag
		}
		out.Processes = append(out.Processes, info)
	}
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return connect.NewResponse(out), nil
}

func (p *proc) write(in *process.ProcessInput) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return connect.NewError(connect.CodeNotFound, errors.New("the process has ended"))
	}
	var w io.Writer
	var data []byte
	switch i := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		if p.stdin == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no open stdin (start it with stdin, or it was closed)"))
		}
		w, data = p.stdin, i.Stdin
	case *process.ProcessInput_Pty:
		if p.pty == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no terminal"))
		}
		w, data = p.pty, i.Pty
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("no input"))
	}
	if _, err := w.Write(data); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return nil
}

func (s *processService) SendInput(_ context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.write(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (s *processService) StreamInput(_ context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			var err error
			if p, err = s.a.procs.get(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event"))
			}
			if err := p.write(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (s *processService) SendSignal(_ context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal must be SIGTERM or SIGKILL"))
	}
	if err := s.a.o.Launcher.Signal(int(p.pid), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (s *processService) CloseStdin(_ context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("a terminal has no stdin to close: send ^D"))
	}
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (s *processService) Update(_ context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.pty == nil || p.closed {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no terminal"))
		}
		if err := unix.IoctlSetWinsize(int(p.pty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(sz.Rows), Col: uint16(sz.Cols)}); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		if s.a.o.SignalResize {
			for _, pg := range sessionGroups("/proc", int(p.pid)) {
				_ = s.a.o.Launcher.Signal(pg, syscall.SIGWINCH)
			}
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// sessionGroups lists the process groups of session sid (the terminal
// command's: it leads a session of its own), as proc shows them.
func sessionGroups(proc string, sid int) []int {
	ents, _ := os.ReadDir(proc)
	var out []int
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...: comm may hold spaces
		// and parentheses, so the fields start after the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 4 {
			continue
		}
		pg, err1 := strconv.Atoi(f[2])
		s, err2 := strconv.Atoi(f[3])
		if err1 == nil && err2 == nil && s == sid && pg > 0 && !slices.Contains(out, pg) {
			out = append(out, pg)
		}
	}
	return out
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if len(kv) > len(k) && kv[:len(k)] == k && kv[len(k)] == '=' {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}
