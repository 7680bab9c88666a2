// Package agent is the in-sandbox agent: the process and filesystem
// services (shaped on the wire like E2B's envd) and airlock's own file
// calls, served by `airlock init` over a socket only the host can reach.
// It runs inside the sandbox, so nothing it says is trusted by the host;
// it in turn trusts its one caller, the host, only with paths inside the
// sandbox's own view.
package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
)

// Protocol is the agent protocol version. The host refuses an agent that
// answers a different one; bump it on any incompatible change.
const Protocol = 1

// MaxMessage bounds one request message (a file written in one call).
const MaxMessage = 64 << 20

// Launcher starts commands with init's confinement (nsinit.Launcher).
type Launcher interface {
	Start(argv []string, attr *syscall.ProcAttr) (int, error)
	Signal(pid int, sig syscall.Signal) error
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
}

// Serve serves the agent until the listener fails.
func Serve(o Options) error {
	a := &agent{o: o, procs: newProcs()}
	mux := http.NewServeMux()
	// No compression: the host is on the other end of a unix socket, and
	// gzip's pools would cost every idle agent memory.
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(MaxMessage), connect.WithCompression("gzip", nil, nil)}
	mux.Handle(processconnect.NewProcessHandler(&processService{a}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&fsService{a: a, watchers: map[string]*watcher{}}, opts...))
	mux.Handle(agentpbconnect.NewAgentHandler(&filesService{a}, opts...))
	srv := &http.Server{Handler: idle(mux), ReadHeaderTimeout: 10 * time.Second}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv.Serve(o.Listener)
}

// idle returns the agent's freed memory to the host once it has served
// nothing for a few seconds: an idle sandbox should cost the host as little
// as its live heap, not what its last burst of work left for the GC.
func idle(h http.Handler) http.Handler {
	var last atomic.Int64
	var freed atomic.Bool
	go func() {
		for range time.Tick(2 * time.Second) {
			if !freed.Load() && time.Since(time.Unix(0, last.Load())) > 3*time.Second {
				debug.FreeOSMemory()
				freed.Store(true)
			}
		}
	}()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		last.Store(time.Now().UnixNano())
		freed.Store(false)
		h.ServeHTTP(w, r)
		last.Store(time.Now().UnixNano())
	})
}

type agent struct {
	o     Options
	procs *procs
}

// user is who an operation runs as.
type user struct {
	name     string
	uid, gid uint32
	home     string
}

// userOf reads the user the way envd does: the user name of HTTP basic
// authorization ("user" or "root"); the sandbox user when absent.
func (a *agent) userOf(h http.Header) (user, error) {
	name := "user"
	if v, ok := strings.CutPrefix(h.Get("Authorization"), "Basic "); ok {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return user{}, connect.NewError(connect.CodeInvalidArgument, errors.New("bad authorization header"))
		}
		if n, _, _ := strings.Cut(string(b), ":"); n != "" {
			name = n
		}
	}
	return a.lookupUser(name)
}

func (a *agent) lookupUser(name string) (user, error) {
	switch name {
	case "", "user":
		return user{"user", a.o.UID, a.o.GID, a.o.Home}, nil
	case "root":
		return user{"root", 0, 0, "/root"}, nil
	}
	return user{}, connect.NewError(connect.CodeInvalidArgument, errors.New("unknown user "+name+` (want "user" or "root")`))
}

// resolve makes p absolute (relative paths are taken from the user's home)
// and clean. Every path is inside the sandbox's own root: the agent has no
// other view.
func resolve(u user, p string) (string, error) {
	if p == "" {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("path is empty"))
	}
	if strings.ContainsRune(p, 0) {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("path contains NUL"))
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(u.home, p)
	}
	return filepath.Clean(p), nil
}

// fsError gives a filesystem error its Connect code.
func fsError(err error) error {
	var ce *connect.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EINVAL):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return connect.NewError(connect.CodeResourceExhausted, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// chownNew gives what the agent (root inside) created to the user it acts for.
func chownNew(p string, u user) error {
	if u.uid == 0 {
		return nil
	}
	return os.Lchown(p, int(u.uid), int(u.gid))
}

type filesService struct{ a *agent }

func (s *filesService) Hello(context.Context, *connect.Request[agentpb.HelloRequest]) (*connect.Response[agentpb.HelloResponse], error) {
	return connect.NewResponse(&agentpb.HelloResponse{Protocol: Protocol, Version: s.a.o.Version}), nil
}
