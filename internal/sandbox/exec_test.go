package sandbox

import (
	"context"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// oomBackend makes sandboxes whose one command dies the way a memory bomb
// does: the kernel counts the OOM kill, the agent reports the command
// killed (or, with broken set, drops the stream), and only then does the
// watcher's notice come (OOM, then init's death). The notice waits until
// the service has looked at the sandbox's usage, or has answered.
type oomBackend struct {
	*gateBackend
	broken bool // the agent's stream breaks instead of reporting the kill
	spared bool // the kill is no OOM kill: the sandbox lives on
	made   chan *oomInstance
}

func (o *oomBackend) Create(ctx context.Context, id string, s *spec.Spec, _ func(eventlog.Event)) (Host, error) {
	in := &oomInstance{gateInstance: gateInstance{socket: filepath.Join(o.t.TempDir(), "agent.sock"), done: make(chan struct{})}, oom: make(chan struct{}), looked: make(chan struct{}), spared: o.spared}
	ln, err := net.Listen("unix", in.socket)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(agentpbconnect.NewAgentHandler(helloAgent{}))
	mux.Handle(processconnect.NewProcessHandler(oomAgent{in: in, broken: o.broken}))
	in.srv = &http.Server{Handler: mux}
	go in.srv.Serve(ln)
	o.made <- in
	return in, nil
}

type oomInstance struct {
	gateInstance
	oom        chan struct{}
	spared     bool
	killed     atomic.Bool   // the kernel has counted the OOM kill
	looked     chan struct{} // closed once the service reads the usage after that
	lookedOnce sync.Once
	oomOnce    sync.Once
}

func (i *oomInstance) OOM() <-chan struct{} { return i.oom }

func (i *oomInstance) Usage() lifecycle.Usage {
	if i.spared || !i.killed.Load() {
		return lifecycle.Usage{}
	}
	i.lookedOnce.Do(func() { close(i.looked) })
	return lifecycle.Usage{OOMKills: 1}
}

// notice is the wall's OOM watcher: OOM first, then init killed.
func (i *oomInstance) notice() {
	i.oomOnce.Do(func() { close(i.oom) })
	_ = i.Destroy()
}

// oomAgent starts a command that the OOM killer kills at once.
type oomAgent struct {
	processconnect.UnimplementedProcessHandler
	in     *oomInstance
	broken bool
}

func (a oomAgent) Start(ctx context.Context, _ *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	if err := st.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 7}}}}); err != nil {
		return err
	}
	a.in.killed.Store(true)
	if a.broken {
		return connect.NewError(connect.CodeUnavailable, nil)
	}
	return st.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: 137, Status: "signal: killed"}}}})
}

// Regression: a command killed by the OOM killer was answered as "exit
// 137, signal: killed" with no word of its sandbox, whose destruction for
// memory the service learnt of only after the agent's report (under load,
// TestServeLimitsKillOrSpareTheAgent). The reply must say the sandbox
// ended and why, whichever comes first: the agent's report of the kill, or
// its stream breaking. A kill that is no OOM kill is answered as it is, at
// once.
func TestExecReplyTellsTheSandboxEndedForMemory(t *testing.T) {
	for _, tc := range []struct {
		name           string
		broken, spared bool
	}{{"the agent reports the kill", false, false}, {"the agent's stream breaks", true, false}, {"a kill that is no OOM kill", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db, err := store.Open(filepath.Join(t.TempDir(), "db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			be := &oomBackend{gateBackend: newGateBackend(t), broken: tc.broken, spared: tc.spared, made: make(chan *oomInstance, 1)}
			svc := New(Config{Backend: be, Store: db})
			tenants := tenant.New(tenant.Config{Store: db, Sandboxes: svc})
			admin := &tenant.Principal{Admin: true}
			tn, err := tenants.Create(ctx, admin, &api.CreateTenant{Name: "acme"})
			if err != nil {
				t.Fatal(err)
			}
			p, err := tenants.Authenticate(ctx, tn.Key, "")
			if err != nil {
				t.Fatal(err)
			}
			sb, err := svc.Create(ctx, p, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 128 << 20}})
			if err != nil {
				t.Fatal(err)
			}
			in := <-be.made
			answered := make(chan struct{})
			defer in.notice()
			if !tc.spared {
				go func() {
					select {
					case <-in.looked:
					case <-answered:
					}
					in.notice()
				}()
			}
			var end *api.ExecEnd
			err = svc.Exec(ctx, p, sb.ID, &api.Exec{Cmd: []string{"membomb"}}, func(ev *api.ExecEvent) error {
				if ev.End != nil {
					end = ev.End
				}
				return nil
			})
			close(answered)
			switch {
			case tc.spared:
				if err != nil || end == nil || end.SandboxEnded || end.ExitCode != 137 || end.Status != "signal: killed" {
					t.Fatalf("the exec answered %+v, %v; want the kill as the agent reported it", end, err)
				}
			case err != nil || end == nil || !end.SandboxEnded || !strings.Contains(end.EndReason, "memory limit (128MiB) exceeded") || end.ExitCode != 137:
				t.Fatalf("the exec answered %+v, %v; want the sandbox ended for its memory limit", end, err)
			}
		})
	}
}
