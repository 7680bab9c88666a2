package sandbox

import (
	"context"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// oomBackend makes sandboxes whose one command meets a limit of the
// commands' cgroup the way a memory bomb or a fork bomb does: the kernel
// counts the OOM kill (or the refused forks) and the agent reports the
// command's end; or, with initDies, the sandbox's init dies under it (its
// stream breaks), its end known to the host endsAfter later.
type oomBackend struct {
	*gateBackend
	initDies  bool
	endsAfter time.Duration
	usage     lifecycle.Usage // counted once the command has run
	exit      int32
	made      chan *oomInstance
}

func (o *oomBackend) Create(ctx context.Context, id string, s *spec.Spec, _ func(eventlog.Event)) (Host, error) {
	in := &oomInstance{gateInstance: gateInstance{socket: filepath.Join(o.t.TempDir(), "agent.sock"), done: make(chan struct{})}, usage: o.usage}
	ln, err := net.Listen("unix", in.socket)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(agentpbconnect.NewAgentHandler(helloAgent{}))
	mux.Handle(processconnect.NewProcessHandler(oomAgent{in: in, initDies: o.initDies, endsAfter: o.endsAfter, exit: o.exit}))
	in.srv = &http.Server{Handler: mux}
	go in.srv.Serve(ln)
	o.made <- in
	return in, nil
}

type oomInstance struct {
	gateInstance
	usage lifecycle.Usage
	ran   atomic.Bool // the command has run: its limits are counted
}

func (i *oomInstance) Usage() lifecycle.Usage {
	if !i.ran.Load() {
		return lifecycle.Usage{}
	}
	return i.usage
}

func (i *oomInstance) CPU() time.Duration { return i.Usage().CPU }

func (i *oomInstance) LimitEvents() (int64, int64) {
	u := i.Usage()
	return u.OOMKills, u.PidsLimited
}

// oomAgent starts a command that ends at once with exit.
type oomAgent struct {
	processconnect.UnimplementedProcessHandler
	in        *oomInstance
	initDies  bool
	endsAfter time.Duration
	exit      int32
}

func (a oomAgent) Start(ctx context.Context, _ *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	if err := st.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 7}}}}); err != nil {
		return err
	}
	a.in.ran.Store(true)
	if a.initDies {
		go func() { time.Sleep(a.endsAfter); _ = a.in.Destroy() }()
		return connect.NewError(connect.CodeUnavailable, nil)
	}
	return st.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: a.exit, Status: "agent's status"}}}})
}

// Regression (issue 14): one command past the memory limit ended a
// long-lived sandbox, and every later call answered "no sandbox". Now the
// commands meet their own limits: the reply says which limit the command
// met, and the sandbox lives on. A kill that is no limit's is answered as
// the agent reported it; a sandbox whose init died under the command is
// answered with its end and why.
func TestExecReplyTellsTheLimitAndTheSandboxLivesOn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		usage    lifecycle.Usage
		exit     int32
		initDies bool
		check    func(*api.ExecEnd) bool
		alive    bool
		// endsAfter: how long after the stream broke the host learns
		// that the sandbox ended.
		endsAfter time.Duration
	}{
		{"an OOM kill", lifecycle.Usage{OOMKills: 1}, 137, false, func(e *api.ExecEnd) bool {
			return e.Limit == "memory" && e.ExitCode == 137 && !e.SandboxEnded && strings.Contains(e.Status, "memory limit (112MiB for the commands) exceeded") && strings.Contains(e.Status, "the sandbox lives on")
		}, true, 0},
		{"an OOM kill of a process of the command", lifecycle.Usage{OOMKills: 1}, 1, false, func(e *api.ExecEnd) bool {
			return e.Limit == "memory" && e.ExitCode == 1 && strings.HasPrefix(e.Status, "agent's status; memory limit")
		}, true, 0},
		{"refused forks", lifecycle.Usage{PidsLimited: 5}, 2, false, func(e *api.ExecEnd) bool {
			return e.Limit == "pids" && e.ExitCode == 2 && strings.Contains(e.Status, "pids limit (96 for the commands) reached: 5 forks refused")
		}, true, 0},
		{"a kill that is no limit's", lifecycle.Usage{}, 137, false, func(e *api.ExecEnd) bool {
			return e.Limit == "" && e.ExitCode == 137 && !e.SandboxEnded && e.Status == "agent's status"
		}, true, 0},
		{"a success while a limit was met elsewhere", lifecycle.Usage{OOMKills: 1}, 0, false, func(e *api.ExecEnd) bool {
			return e.Limit == "" && e.ExitCode == 0 && e.Status == "agent's status"
		}, true, 0},
		{"init dies under the command", lifecycle.Usage{OOMKills: 3}, 0, true, func(e *api.ExecEnd) bool {
			return e.SandboxEnded && e.ExitCode == 137 && strings.Contains(e.EndReason, "init exited") && strings.Contains(e.EndReason, "memory limit (128MiB) had been reached (3 OOM kills)")
		}, false, 0},
		// Regression: on the gVisor wall the host learns of the end when
		// runsc run has ended, seconds after the agent's stream broke;
		// the command was answered the broken stream ("unavailable:
		// unexpected EOF"), not the sandbox's end.
		{"init dies under the command, its end known seconds later", lifecycle.Usage{OOMKills: 3}, 0, true, func(e *api.ExecEnd) bool {
			return e.SandboxEnded && e.ExitCode == 137 && strings.Contains(e.EndReason, "memory limit (128MiB) had been reached (3 OOM kills)")
		}, false, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db, err := store.Open(filepath.Join(t.TempDir(), "db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			be := &oomBackend{gateBackend: newGateBackend(t), initDies: tc.initDies, endsAfter: tc.endsAfter, usage: tc.usage, exit: tc.exit, made: make(chan *oomInstance, 1)}
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
			sb, err := svc.Create(ctx, p, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 128 << 20, Pids: 128}})
			if err != nil {
				t.Fatal(err)
			}
			in := <-be.made
			defer in.Destroy()
			var end *api.ExecEnd
			err = svc.Exec(ctx, p, sb.ID, &api.Exec{Cmd: []string{"bomb"}}, func(ev *api.ExecEvent) error {
				if ev.End != nil {
					end = ev.End
				}
				return nil
			})
			if err != nil || end == nil || !tc.check(end) {
				t.Fatalf("the exec answered %+v, %v", end, err)
			}
			got, err := svc.Get(ctx, p, sb.ID)
			if alive := err == nil && got.State == api.StateRunning; alive != tc.alive {
				t.Fatalf("after the command the sandbox is %+v, %v; want alive %v", got, err, tc.alive)
			}
		})
	}
}
