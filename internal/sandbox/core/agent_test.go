package core

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
)

// endingProcess answers every Start with a start and an end event, and
// then, if it stalls, holds the stream open until the caller goes.
type endingProcess struct {
	processconnect.UnimplementedProcessHandler
	stalls bool
}

func (p endingProcess) Start(ctx context.Context, _ *connect.Request[process.StartRequest], s *connect.ServerStream[process.StartResponse]) error {
	if err := s.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 7}}}}); err != nil {
		return err
	}
	if err := s.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{Exited: true}}}}); err != nil {
		return err
	}
	if p.stalls {
		<-ctx.Done()
	}
	return nil
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// A caller that stops reading a stream at its end event and closes it (as
// an exec does) leaves the connection to the agent for the next call: one
// connection for a run of execs, not one each.
func TestAgentStreamsClosedAtTheirEndKeepTheConnection(t *testing.T) {
	a, accepted := serveProcess(t, endingProcess{})
	for i := 0; i < 5; i++ {
		startToEnd(t, a)
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("the agent accepted %d connections for 5 calls, want 1", n)
	}
}

// An agent that holds a stream open after its end does not hold the
// daemon's close of it: the close gives up on the connection.
func TestAgentStreamThatStallsIsClosedAnyway(t *testing.T) {
	a, accepted := serveProcess(t, endingProcess{stalls: true})
	startToEnd(t, a)
	startToEnd(t, a)
	if n := accepted.Load(); n != 2 {
		t.Fatalf("the agent accepted %d connections for 2 stalled calls, want 2", n)
	}
}

// startToEnd starts a command and reads its stream up to the end event,
// then closes it, as an exec does.
func startToEnd(t *testing.T, a *Agent) {
	t.Helper()
	stream, err := a.Proc.Start(context.Background(), connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "true"}}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() && stream.Msg().GetEvent().GetEnd() == nil {
	}
	if stream.Msg().GetEvent().GetEnd() == nil {
		t.Fatalf("no end event: %v", stream.Err())
	}
	_ = stream.Close()
}

// serveProcess serves h as an agent's process service on a socket of the
// test's own, and returns a client of it and the count of connections it
// accepted.
func serveProcess(t *testing.T, h processconnect.ProcessHandler) (*Agent, *atomic.Int32) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(h))
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(func() { srv.Close() })
	a := NewAgent(sock)
	t.Cleanup(a.Close)
	return a, &cl.n
}
