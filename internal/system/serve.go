package system

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bapi"
	"github.com/airlock-sandbox/airlock/internal/e2bapi/envd"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/httpapi"
	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/portfront"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandbox/ports"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
)

// Serve runs the daemon until ctx ends: it adopts the sandboxes a previous
// daemon left, serves the API, and on shutdown leaves every sandbox
// running for the next daemon to adopt.
func (s *System) Serve(ctx context.Context) error {
	o := s.opts
	if o.Mode != Daemon {
		return fmt.Errorf("system: Serve needs the Daemon mode")
	}
	// One daemon per state directory.
	lock, err := lockfile.TryLock(filepath.Join(o.StateDir, "daemon.lock"))
	if err != nil {
		return err
	}
	if lock == nil {
		return fmt.Errorf("%w: another airlock serve runs on %s", errdefs.ErrFailedPrecondition, o.StateDir)
	}
	defer lock.Release()
	svc := s.Service
	created, err := s.Tenants.EnsureAdminKey(ctx, o.AdminKeyFile)
	if err != nil {
		return fmt.Errorf("admin key: %w", err)
	}
	// Adopt what the last daemon left, then clear what nobody holds.
	if err := svc.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	if removed, err := s.Lifecycle.GC(); err != nil {
		o.Log.Warn("gc", "err", err)
	} else if len(removed) > 0 {
		o.Log.Info("gc removed dead sandboxes", "ids", removed)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	var running sync.WaitGroup
	running.Go(func() { svc.Run(runCtx) })
	running.Go(func() { s.Tenants.Run(runCtx) })

	servers, errc, err := s.listen()
	if err != nil {
		return err
	}
	if o.Ready != nil {
		o.Ready(o.AdminKeyFile, created)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	o.Log.Info("shutting down; sandboxes keep running for the next daemon")
	// The node's event streams never end on their own: they are cut
	// (with a line saying so) for the servers' shutdown not to wait.
	svc.EndNodeWatches("the daemon is stopping")
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	for _, srv := range servers {
		_ = srv.Shutdown(sctx)
	}
	stopRun()
	running.Wait() // their last records go in before the log closes
	_ = os.Remove(o.Socket)
	return nil
}

// listen serves the API (and /mcp) on the unix socket, and with TLS on TCP
// when asked.
func (s *System) listen() ([]*http.Server, chan error, error) {
	o := s.opts
	h := httpapi.New(s.Service, s.Tenants, s.Secrets, s.Ports, o.Log, promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	mcpHTTP := &mcp.HTTP{Service: s.Service, Version: o.Version, SessionTimeout: o.MCPSessionTimeout, Log: o.Log, Refuse: httpapi.WriteError}
	h.Mount("/mcp", mcpHTTP.Serve)
	ln, err := listenSocket(o.Socket, o.SocketGroup)
	if err != nil {
		return nil, nil, err
	}
	servers := []*http.Server{httpapi.Server(h)}
	errc := make(chan error, 3)
	go func() { errc <- servers[0].Serve(ln) }()
	if o.TCP != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return servers, errc, errdefs.Invalid("TLS certificate: " + err.Error())
		}
		tln, err := net.Listen("tcp", o.TCP)
		if err != nil {
			return servers, errc, err
		}
		srv := httpapi.Server(h)
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		servers = append(servers, srv)
		go func() { errc <- srv.ServeTLS(tln, "", "") }()
		o.Log.Info("listening", "tcp", tln.Addr().String())
	}
	if o.E2B.Listen != "" {
		srv, err := s.listenE2B(errc)
		if err != nil {
			return servers, errc, err
		}
		servers = append(servers, srv)
	}
	o.Log.Info("listening", "socket", o.Socket)
	return servers, errc, nil
}

// listenE2B serves the E2B front (internal/e2bapi): plain HTTP on a
// loopback address, TLS elsewhere.
func (s *System) listenE2B(errc chan error) (*http.Server, error) {
	o, e := s.opts, s.opts.E2B
	cert, key := e.TLSCert, e.TLSKey
	if cert == "" {
		cert, key = o.TLSCert, o.TLSKey
	}
	tokens, err := e2bapi.LoadTokens(filepath.Join(o.StateDir, "e2b.key"))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", e.Listen)
	if err != nil {
		return nil, err
	}
	domain := e.Domain
	if domain == "" {
		domain = ln.Addr().String()
	}
	templates := map[string]string{"base": "host"}
	maps.Copy(templates, e.Templates)
	front := e2bapi.New(e2bapi.Config{Sandboxes: s.Service, Tenants: s.Tenants, Tokens: tokens, Domain: domain,
		Templates: templates, AllowInternet: e.AllowInternet, Log: o.Log,
		Envd: envd.New(s.Service),
		Ports: func(w http.ResponseWriter, r *http.Request, p *tenant.Principal, id string, port int, auth string) {
			s.Ports.Proxy(w, r, p, id, port, ports.Via{Door: "e2b", Auth: auth, Remote: r.RemoteAddr})
		},
		PortToken: func(r *http.Request, id string, port int) (*tenant.Principal, bool) {
			if tok, _ := portfront.TokenOf(r); tok == "" {
				return nil, false
			}
			p, _, err := s.Ports.Authorize(r, id, port, nil)
			if err != nil {
				return nil, true
			}
			return p, true
		},
	})
	srv := httpapi.Server(front)
	if loopback(e.Listen) && e.TLSCert == "" {
		go func() { errc <- srv.Serve(ln) }()
		o.Log.Info("listening", "e2b", ln.Addr().String(), "domain", domain, "tls", false)
		return srv, nil
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		ln.Close()
		return nil, errdefs.Invalid("E2B TLS certificate: " + err.Error())
	}
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	o.Log.Info("listening", "e2b", ln.Addr().String(), "domain", domain, "tls", true)
	return srv, nil
}

// loopback reports whether addr (host:port) is on a loopback address,
// where plain HTTP reaches no other machine.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// Embedded runs the service for fn, in this process (Embedded mode); when
// fn returns, every sandbox it made is destroyed.
func (s *System) Embedded(ctx context.Context, fn func(ctx context.Context, svc *sandbox.Service) error) error {
	if s.opts.Mode != Embedded {
		return fmt.Errorf("system: Embedded needs the Embedded mode")
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { s.Service.Run(runCtx); close(runDone) }()
	err := fn(ctx, s.Service)
	if _, kerr := s.Service.KillAll(context.WithoutCancel(ctx), &tenant.Principal{Admin: true}, ""); kerr != nil {
		s.opts.Log.Error("embedded: destroy the sandboxes", "err", kerr)
	}
	stopRun()
	<-runDone
	return err
}

// listenSocket listens on a root-only unix socket at path, replacing a
// stale one but never a live daemon's; with a group, its members may open
// it too (0660).
func listenSocket(path, group string) (net.Listener, error) {
	gid := -1
	if group != "" {
		var err error
		if gid, err = groupID(group); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, err
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("%w: a daemon already listens on %s", errdefs.ErrFailedPrecondition, path)
	}
	_ = os.Remove(path)
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, err
	}
	mode := os.FileMode(0o600)
	if gid >= 0 {
		if err := os.Lchown(path, 0, gid); err != nil {
			ln.Close()
			return nil, err
		}
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// groupID is a group's id, by name (/etc/group) or number.
func groupID(group string) (int, error) {
	if n, err := strconv.Atoi(group); err == nil && n >= 0 {
		return n, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, errdefs.Invalid("--socket-group: " + err.Error())
	}
	return strconv.Atoi(g.Gid)
}
