package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/httpapi"
	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/scan"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
)

// ServeConfig configures `airlock serve`.
type ServeConfig struct {
	Engine Config
	// Socket is the unix socket the API listens on (root only).
	Socket string
	// TCP, when set, is an address to serve the API on with TLS too.
	TCP             string
	TLSCert, TLSKey string
	AdminKeyFile    string // default DataDir/admin.key
	Database        string // default DataDir/airlock.db
	ShutdownTimeout time.Duration
	// NoAudit runs without the audit log: for benchmarks that measure what
	// the log costs, never for service.
	NoAudit bool
	// OTLPEndpoint, when set, is an OpenTelemetry collector (its OTLP/HTTP
	// base URL) the audit records are exported to.
	OTLPEndpoint string
	// Files is where the daemon's own state lives: its database, admin
	// key, audit log and keys, the broker's key. Default Engine.DataDir.
	Files string
	// Embedded, when set, runs the service in this process for one caller
	// (airlock mcp) instead of serving the API: no socket, no lock on the
	// state directory, no adoption or sweep (sandboxes of other daemons and
	// runs are left alone). When it returns, every sandbox it made is
	// destroyed.
	Embedded func(ctx context.Context, svc *sandbox.Service) error
	// Version is airlock's, for MCP clients.
	Version string
	// Registries are the registries tenants' images may be pulled from
	// (HOST[:PORT]); none by default. The embedded service (airlock mcp)
	// pulls from any, as airlock run does.
	Registries []string
	// MCPSessionTimeout ends MCP sessions (and their sandboxes) idle this
	// long; default 30m.
	MCPSessionTimeout time.Duration
	// MaxBackground and MaxBackgroundPerTenant cap background commands
	// (sandbox.Config); 0: the defaults.
	MaxBackground, MaxBackgroundPerTenant int
	// Ready is called once the API is listening, with the admin key file
	// and whether it was just written.
	Ready func(adminKeyFile string, created bool)
}

// Serve runs the daemon until ctx ends: it adopts the sandboxes a previous
// daemon left, serves the API, and on shutdown leaves every sandbox
// running for the next daemon to adopt.
func Serve(ctx context.Context, c ServeConfig) error {
	e := &c.Engine
	if e.StateDir == "" {
		e.StateDir = "/run/airlock"
	}
	if e.DataDir == "" {
		e.DataDir = "/var/lib/airlock"
	}
	if c.Socket == "" {
		c.Socket = api.DefaultSocket
	}
	if c.Files == "" {
		c.Files = e.DataDir
	}
	if c.Embedded != nil {
		e.SandboxesDieWithUs = true
	} else {
		e.TenantImages, e.Registries = true, c.Registries
	}
	if c.AdminKeyFile == "" {
		c.AdminKeyFile = filepath.Join(c.Files, "admin.key")
	}
	if c.Database == "" {
		c.Database = filepath.Join(c.Files, "airlock.db")
	}
	if c.MCPSessionTimeout == 0 {
		c.MCPSessionTimeout = 30 * time.Minute
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if (c.TLSCert == "") != (c.TLSKey == "") || (c.TCP != "" && c.TLSCert == "") {
		return errdefs.Invalid("a TCP listener needs both a TLS certificate and key")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := sandbox.NewMetrics(reg)
	var svc *sandbox.Service // set below; egress starts only with sandboxes
	e.OnEgress = func(ev egress.Event) {
		metrics.Egress.WithLabelValues(ev.Decision).Inc()
		if svc != nil {
			svc.NoteEgress(ev.Sandbox, ev)
			for _, f := range ev.Findings {
				svc.NoteFinding(ev.Sandbox, map[string]any{
					"call": "egress", "where": f.Where, "rule": f.Rule, "fingerprint": f.Fingerprint, "action": f.Action,
					"reason": f.Reason, "host": ev.Host, "method": ev.Method, "path": ev.Path, "rules": scan.RuleSet,
				})
			}
		}
	}

	// The broker's keys live beside the database, where no sandbox looks.
	keys, err := broker.LoadKeyFile(filepath.Join(c.Files, "broker.key"))
	if err != nil {
		return err
	}
	e.Broker = broker.New(broker.Config{Keys: keys, Dir: filepath.Join(c.Files, "broker"), Secret: func(tenant, name string) ([]byte, error) {
		if svc == nil {
			return nil, errdefs.Unavailable("the daemon is starting")
		}
		return svc.SecretValue(tenant, name)
	}})
	engine, err := NewEngine(*e)
	if err != nil {
		return err
	}
	log := engine.cfg.Log
	// One daemon per state directory.
	if c.Embedded == nil {
		lock, err := lockfile.TryLock(filepath.Join(e.StateDir, "daemon.lock"))
		if err != nil {
			return err
		}
		if lock == nil {
			return fmt.Errorf("%w: another airlock serve runs on %s", errdefs.ErrFailedPrecondition, e.StateDir)
		}
		defer lock.Release()
	}
	db, err := store.Open(c.Database)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg := sandbox.Config{Backend: engine, Store: db, Log: log, Metrics: metrics, Broker: e.Broker,
		MaxBackground: c.MaxBackground, MaxBackgroundPerTenant: c.MaxBackgroundPerTenant,
		// The embedded service has one caller, root on this host: host
		// paths are its own. A daemon's tenants name them only under their
		// roots, which never touch these directories.
		HostPaths: c.Embedded != nil,
		Reserved:  []string{e.StateDir, e.DataDir, c.Files, filepath.Dir(c.Database), filepath.Dir(c.AdminKeyFile), filepath.Dir(c.Socket)},
	}
	if c.NoAudit {
		log.Warn("running WITHOUT an audit log (--no-audit): nothing sandboxes do is recorded")
	} else {
		var exp *audit.Exporter
		if c.OTLPEndpoint != "" {
			exp = audit.NewExporter(c.OTLPEndpoint)
		}
		alog, err := openAudit(ctx, c.Files, db, log, exp)
		if err != nil {
			return err
		}
		defer func() {
			if err := alog.Close(); err != nil {
				log.Error("audit log close", "err", err)
			}
			if exp != nil {
				exp.Close()
				if exp.Dropped()+exp.Failed() > 0 {
					log.Warn("audit export incomplete", "dropped", exp.Dropped(), "refused", exp.Failed())
				}
			}
		}()
		cfg.Audit, cfg.AuditDir, cfg.PatchDir = alog, AuditDir(c.Files), filepath.Join(AuditDir(c.Files), "patches")
	}
	svc = sandbox.New(cfg)
	if c.Embedded != nil {
		runCtx, stopRun := context.WithCancel(context.Background())
		defer stopRun()
		go svc.Run(runCtx)
		err := c.Embedded(ctx, svc)
		if _, kerr := svc.KillAll(context.WithoutCancel(ctx), &sandbox.Principal{Admin: true}, ""); kerr != nil {
			log.Error("embedded: destroy the sandboxes", "err", kerr)
		}
		return err
	}
	created, err := svc.EnsureAdminKey(ctx, c.AdminKeyFile)
	if err != nil {
		return fmt.Errorf("admin key: %w", err)
	}
	// Adopt what the last daemon left, then clear what nobody holds.
	if err := svc.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	if removed, err := engine.GC(); err != nil {
		log.Warn("gc", "err", err)
	} else if len(removed) > 0 {
		log.Info("gc removed dead sandboxes", "ids", removed)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	runDone := make(chan struct{})
	go func() { svc.Run(runCtx); close(runDone) }()

	h := httpapi.New(svc, log, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mcpHTTP := &mcp.HTTP{Service: svc, Version: c.Version, SessionTimeout: c.MCPSessionTimeout, Log: log, Refuse: httpapi.WriteError}
	h.Mount("/mcp", mcpHTTP.Serve)
	ln, err := listenSocket(c.Socket)
	if err != nil {
		return err
	}
	servers := []*http.Server{httpapi.Server(h)}
	errc := make(chan error, 2)
	go func() { errc <- servers[0].Serve(ln) }()
	if c.TCP != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return errdefs.Invalid("TLS certificate: " + err.Error())
		}
		tln, err := net.Listen("tcp", c.TCP)
		if err != nil {
			return err
		}
		srv := httpapi.Server(h)
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		servers = append(servers, srv)
		go func() { errc <- srv.ServeTLS(tln, "", "") }()
		log.Info("listening", "tcp", tln.Addr().String())
	}
	log.Info("listening", "socket", c.Socket)
	if c.Ready != nil {
		c.Ready(c.AdminKeyFile, created)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	log.Info("shutting down; sandboxes keep running for the next daemon")
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	for _, srv := range servers {
		_ = srv.Shutdown(sctx)
	}
	stopRun()
	<-runDone // its last records go in before the log closes
	_ = os.Remove(c.Socket)
	return nil
}

// listenSocket listens on a root-only unix socket at path, replacing a
// stale one but never a live daemon's.
func listenSocket(path string) (net.Listener, error) {
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
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// AuditDir is where the daemon's audit log lives under a data directory.
func AuditDir(dataDir string) string { return filepath.Join(dataDir, "audit") }

// AuditKeyFile holds the audit log's ed25519 signing key.
func AuditKeyFile(dataDir string) string { return filepath.Join(dataDir, "audit.key") }

// AuditHeadMeta is the store key of the audit log's head, kept apart from
// the log.
const AuditHeadMeta = "audit_head"

// openAudit opens the daemon's audit log, keeping its head in the store.
func openAudit(ctx context.Context, dataDir string, db *store.Store, log *slog.Logger, exp *audit.Exporter) (*audit.Log, error) {
	key, err := audit.LoadOrCreateKey(AuditKeyFile(dataDir))
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	l, err := audit.Open(AuditDir(dataDir), key, audit.Options{Export: exp, OnHead: func(h audit.Head) {
		b, _ := json.Marshal(h)
		if err := db.SetMeta(context.WithoutCancel(ctx), AuditHeadMeta, string(b)); err != nil {
			log.Error("audit head", "err", err)
		}
	}})
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return l, nil
}
