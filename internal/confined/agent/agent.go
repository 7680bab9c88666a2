// Package agent is the in-sandbox agent: the process and filesystem
// services (shaped on the wire like E2B's envd) and airlock's own file
// calls, served by `airlock-init init` over a socket only the host can reach.
// This package holds the server, the process service and the glue to
// init's Launcher; the filesystem side is internal/confined/agent/files.
// It runs inside the sandbox, so nothing it says is trusted by the host;
// it in turn trusts its one caller, the host, only with paths inside the
// sandbox's own view.
package agent

import (
	"context"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/confined/agent/files"
)

// Protocol is the agent protocol version. The host refuses an agent that
// answers a different one; bump it on any incompatible change (2: files
// are written and unpacked as client streams of chunks).
const Protocol = 2

// MaxMessage bounds one request message (one chunk of a file written or
// unpacked: the daemon sends them far smaller).
const MaxMessage = 64 << 20

// Launcher starts commands with init's confinement (nsinit.Launcher).
type Launcher interface {
	Start(argv []string, attr *syscall.ProcAttr) (int, error)
	Signal(pid int, sig syscall.Signal) error
	// Wait returns once pid has exited and its process group has been
	// sent SIGKILL.
	Wait(pid int) (syscall.WaitStatus, error)
	OpenPTY(uid uint32, rows, cols uint16) (master, slave *os.File, err error)
}

// Options configure the agent.
type Options struct {
	Listener net.Listener
	Launcher Launcher
	UID, GID uint32 // the sandbox user
	Home     string
	Env      []string
	Cwd      string
	Version  string
	// SignalResize: the terminals the agent opens do not send SIGWINCH
	// on a change of size by themselves (gVisor's devpts, which also keeps
	// a terminal's foreground group from anyone outside its session), so
	// after a resize the agent sends it to every process group of the
	// command's session.
	SignalResize bool
}

// Serve serves the agent until the listener fails.
func Serve(o Options) error {
	a := &agent{o: o, users: files.Users{UID: o.UID, GID: o.GID, Home: o.Home}, procs: newProcs()}
	mux := http.NewServeMux()
	// No compression: the host is on the other end of a unix socket, and
	// gzip's pools would cost every idle agent memory.
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(MaxMessage), connect.WithCompression("gzip", nil, nil)}
	mux.Handle(processconnect.NewProcessHandler(&processService{a}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(files.NewFilesystem(a.users), opts...))
	mux.Handle(agentpbconnect.NewAgentHandler(&agentService{Calls: files.NewCalls(a.users), version: o.Version}, opts...))
	mux.HandleFunc("GET /airlock/port/{port}", relayPort)
	srv := &http.Server{Handler: idle(mux), ReadHeaderTimeout: 10 * time.Second}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv.Serve(o.Listener)
}

// idle hands the agent's freed memory back to the host once it has served
// nothing for idleAfter, if it allocated at least releaseMin since it last
// did: an idle sandbox should cost the host as little as its live heap,
// not what its last burst of work left for the GC. After a little work
// (an exec of `true`) it does nothing: a forced collection then costs an
// idle agent more (its metadata) than it frees. One timer, armed when the
// last request ends: no wake-up while idle.
func idle(h http.Handler) http.Handler {
	var mu sync.Mutex
	active := 0
	released := allocated()
	t := time.AfterFunc(time.Hour, func() {
		mu.Lock()
		a := allocated()
		worth := a-released >= releaseMin
		if worth {
			released = a
		}
		mu.Unlock()
		if worth {
			// Twice: what sync.Pools held survives one collection (as
			// their victims) and goes with the second.
			debug.FreeOSMemory()
			debug.FreeOSMemory()
		}
	})
	t.Stop()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		active++
		t.Stop()
		mu.Unlock()
		defer func() {
			mu.Lock()
			if active--; active == 0 {
				t.Reset(idleAfter)
			}
			mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

const (
	idleAfter  = 3 * time.Second
	releaseMin = 4 << 20
)

// allocated is how many bytes the agent has allocated since it started.
func allocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

type agent struct {
	o     Options
	users files.Users
	procs *procs

	nullOnce sync.Once
	null     *os.File // see devNull
	nullErr  error
}

// agentService is airlock's own Agent service: Hello, and the file calls.
type agentService struct {
	*files.Calls
	version string
}

func (s *agentService) Hello(context.Context, *connect.Request[agentpb.HelloRequest]) (*connect.Response[agentpb.HelloResponse], error) {
	return connect.NewResponse(&agentpb.HelloResponse{Protocol: Protocol, Version: s.version}), nil
}
