// Package system is airlock's composition root: from one set of Options it
// builds the walls, the lifecycle, the broker, the store, the audit log and
// the service, wired for one of four modes — a one-shot run (`airlock
// run`), an embedded service for one caller (`airlock mcp`), the daemon
// (`airlock serve`, which also listens), or the host's upkeep (`airlock
// gc`, `airlock image`: the wall and the lifecycle only). Everything is
// built in dependency order; nothing is declared before it exists.
package system

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/cleanup"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/httpapi"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/portfront"
	"github.com/airlock-sandbox/airlock/internal/run"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/secret"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/wall/container"
	"github.com/airlock-sandbox/airlock/internal/wall/gvisor"
	"github.com/airlock-sandbox/airlock/internal/wall/initexe"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Mode is what the system is built for.
type Mode int

const (
	// OneShot is `airlock run`: one sandbox, one command, this process;
	// an ephemeral broker holding the run's --secret values; the run's
	// own audit log file.
	OneShot Mode = iota
	// Embedded is `airlock mcp`: the daemon's service in this process for
	// one caller, its files in a session directory; no socket, no lock on
	// the state directory, no adoption or sweep, host paths its own.
	Embedded
	// Daemon is `airlock serve`: tenants, the API, adoption after a
	// restart.
	Daemon
	// Host is `airlock gc` and `airlock image`: the wall and the
	// lifecycle only, to manage the host's sandboxes' remains and images
	// without making any.
	Host
)

// Options configure a System.
type Options struct {
	Mode     Mode
	StateDir string // default /run/airlock
	DataDir  string // default /var/lib/airlock
	// Files is where the service keeps its own state (database, admin
	// key, audit log and keys, the broker's key). Default DataDir.
	Files string
	Log   *slog.Logger
	// Warn receives one-line warnings meant for the user.
	Warn func(string)
	// Runsc is the runsc the gvisor wall runs (gvisor.DefaultRunsc when
	// ""); a missing or wrong one fails gvisor creates only.
	Runsc string
	// Init is the airlock-init both walls run in a sandbox (initexe.Default
	// when ""); a missing or wrong one fails every create.
	Init string

	DNSUpstream     string
	SubnetPool      netip.Prefix
	EgressAllowNets []netip.Prefix
	ImageCacheBytes int64
	// Registries are the registries a daemon's tenants may pull from.
	Registries []string

	// OneShot: the values of `airlock run --secret`, for its grants; and
	// the run's audit log file ("" for a new one under RunStateDir).
	Secrets  map[string][]byte
	RunAudit string

	// Daemon: the API's listeners and limits.
	Socket            string // the root-only unix socket (api.DefaultSocket)
	SocketGroup       string // a group (name or gid) that may open it too
	TCP               string // an address to serve with TLS too
	TLSCert, TLSKey   string
	AdminKeyFile      string // default Files/admin.key
	Database          string // default Files/airlock.db
	ShutdownTimeout   time.Duration
	MCPSessionTimeout time.Duration // default 30m
	// NoAudit runs without the audit log: for benchmarks that measure what
	// the log costs, never for service.
	NoAudit bool
	// OTLPEndpoint, when set, is an OpenTelemetry collector (OTLP/HTTP
	// base URL) the audit records are exported to.
	OTLPEndpoint string
	// MaxBackground and MaxBackgroundPerTenant cap background commands
	// (sandbox.Config); 0: the defaults.
	MaxBackground, MaxBackgroundPerTenant int
	// DefaultIsolation is the wall of a create that names none
	// (sandbox.Config; "": container). A daemon whose default is gvisor
	// does not start without a usable runsc.
	DefaultIsolation string
	// Node is the node the daemon reports (GET /v1/node): its name and
	// capacity, and the part of it sandboxes are held to; its version,
	// walls and audit head are the system's.
	Node sandbox.NodeConfig
	// E2B is the E2B front's listener ("": none; internal/e2bapi).
	E2B     E2BOptions
	Version string // airlock's, for MCP clients
	// Ready is called once the API listens, with the admin key file and
	// whether it was just written.
	Ready func(adminKeyFile string, created bool)
}

// E2BOptions configure the E2B front (`airlock serve --e2b-listen`).
type E2BOptions struct {
	// Listen is its address: plain HTTP on a loopback address, TLS
	// (TLSCert and TLSKey, default the API's pair) anywhere else.
	Listen          string
	TLSCert, TLSKey string
	// Domain is the sandboxes' domain the SDKs are told (default: the
	// listener's address).
	Domain string
	// Templates maps E2B template ids to images; "base" is "host" unless
	// it is given.
	Templates map[string]string
	// AllowInternet is what a create asking for the internet may reach.
	AllowInternet []string
}

// System is everything one airlock process runs sandboxes with.
type System struct {
	opts Options
	// Walls are the walls sandboxes are made on: the container wall
	// (the default) and the gvisor wall.
	Walls     []wall.Wall
	Lifecycle *lifecycle.Lifecycle
	Broker    *broker.Broker
	// Audit is the log every record goes to (nil: none), through
	// Recorder, the one writer of records every part of the system shares.
	Audit    *audit.Log
	Recorder *record.Recorder
	// AuditFile is a one-shot run's log.
	AuditFile string
	// Store, Secrets, Service, Tenants and Ports: Embedded and Daemon.
	Store   *store.Store
	Secrets *secret.Store
	Service *sandbox.Service
	Tenants *tenant.Service
	// Ports is the front of sandboxes' servers (HTTP, WebSocket,
	// tunnels) and the port tokens it checks.
	Ports    *portfront.Ports
	Runner   *run.Runner // OneShot
	registry *prometheus.Registry
	closers  cleanup.Stack
	// isolations are the walls sandboxes can be made on here (runsc
	// found for gvisor).
	isolations []string
}

// New builds a system for o.Mode. Close gives everything back.
func New(ctx context.Context, o Options) (_ *System, err error) {
	o.defaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	s := &System{opts: o}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	var runKey <-chan keyResult
	if o.Mode == OneShot {
		// The run's signing key (an ed25519 derivation, ~1.5 ms of CPU)
		// is read while the walls are made.
		runKey = loadRunKey()
	}
	bin := initexe.New(o.Init, filepath.Join(o.StateDir, "init"))
	// The two walls look at the host (its cgroups) and make their state
	// directories side by side.
	var gw *gvisor.Wall
	var gerr error
	gdone := make(chan struct{})
	go func() {
		defer close(gdone)
		gw, gerr = gvisor.New(o.StateDir, o.Runsc, bin, o.Log)
	}()
	cw, err := container.New(o.StateDir, bin, o.Log)
	<-gdone
	if err != nil {
		return nil, err
	}
	if gerr != nil {
		return nil, gerr
	}
	s.Walls = []wall.Wall{cw, gw}
	if o.Mode == Daemon {
		// The node reports the walls it can make sandboxes on (a look at
		// runsc, remembered in the state directory once checked).
		s.isolations = []string{cw.Name()}
		if gw.Runsc().Err == nil {
			s.isolations = append(s.isolations, gw.Name())
		}
	}
	// Every create naming no wall would fail: say so now, not at the
	// first create.
	if o.DefaultIsolation == gw.Name() {
		if rs := gw.Runsc(); rs.Err != nil {
			return nil, fmt.Errorf("--default-isolation %s: %w", o.DefaultIsolation, rs.Err)
		}
	}
	switch o.Mode {
	case Host:
		s.Lifecycle, err = lifecycle.New(s.lifecycleConfig(), s.Walls...)
		return s, err
	case OneShot:
		return s, s.oneShot(runKey)
	}
	return s, s.service(ctx)
}

func (o *Options) defaults() {
	if o.StateDir == "" {
		o.StateDir = "/run/airlock"
	}
	if o.DataDir == "" {
		o.DataDir = "/var/lib/airlock"
	}
	if o.Files == "" {
		o.Files = o.DataDir
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Warn == nil {
		o.Warn = func(string) {}
	}
	if o.Socket == "" {
		o.Socket = api.DefaultSocket
	}
	if o.AdminKeyFile == "" {
		o.AdminKeyFile = filepath.Join(o.Files, "admin.key")
	}
	if o.Database == "" {
		o.Database = filepath.Join(o.Files, "airlock.db")
	}
	if o.MCPSessionTimeout == 0 {
		o.MCPSessionTimeout = 30 * time.Minute
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
}

func (o *Options) check() error {
	if (o.TLSCert == "") != (o.TLSKey == "") || (o.TCP != "" && o.TLSCert == "") {
		return errdefs.Invalid("a TCP listener needs both a TLS certificate and key")
	}
	if e := o.E2B; e.Listen != "" {
		if (e.TLSCert == "") != (e.TLSKey == "") {
			return errdefs.Invalid("the E2B listener needs both a TLS certificate and key, or neither")
		}
		if !loopback(e.Listen) && e.TLSCert == "" && o.TLSCert == "" {
			return errdefs.Invalid(fmt.Sprintf("--e2b-listen %s: plain HTTP only on a loopback address; elsewhere give --e2b-tls-cert and --e2b-tls-key (or --tls-cert and --tls-key)", e.Listen))
		}
	}
	if o.DefaultIsolation != "" && !slices.Contains(spec.Isolations, o.DefaultIsolation) {
		return errdefs.Invalid(fmt.Sprintf("--default-isolation %q: must be %s", o.DefaultIsolation, strings.Join(spec.Isolations, " or ")))
	}
	return nil
}

// lifecycleConfig is the lifecycle's share of the options.
func (s *System) lifecycleConfig() lifecycle.Config {
	o := s.opts
	return lifecycle.Config{
		StateDir: o.StateDir, DataDir: o.DataDir, Log: o.Log, Warn: o.Warn, ImageCacheBytes: o.ImageCacheBytes,
		Net:                sandboxnet.Config{DNSUpstream: o.DNSUpstream, SubnetPool: o.SubnetPool, EgressAllowNets: o.EgressAllowNets, Broker: s.Broker},
		SandboxesDieWithUs: o.Mode == Embedded,
		// A daemon's images are its tenants' names.
		TenantImages: o.Mode == Daemon, Registries: o.Registries,
	}
}

// oneShot wires `airlock run`: a broker that lives as long as the run (its
// keys, its tokens and the secrets given by --secret end with it), the
// lifecycle, and the run's own audit log.
func (s *System) oneShot(runKey <-chan keyResult) (err error) {
	secrets := s.opts.Secrets
	s.Broker = broker.New(broker.Config{Keys: keys.Ephemeral(), Secret: func(_, name string) ([]byte, error) {
		if v, ok := secrets[name]; ok {
			return v, nil
		}
		return nil, errdefs.Invalid(fmt.Sprintf("grant: no secret %q: give it with --secret %s=env:VARIABLE or =file:PATH", name, name))
	}})
	if s.Lifecycle, err = lifecycle.New(s.lifecycleConfig(), s.Walls...); err != nil {
		return err
	}
	if s.Audit, s.AuditFile, err = openRunAudit(s.opts.RunAudit, <-runKey); err != nil {
		return err
	}
	s.closers.Push(s.Audit.Close)
	s.Recorder = record.New(s.Audit, s.opts.Log)
	s.Runner = &run.Runner{Lifecycle: s.Lifecycle, Broker: s.Broker, Log: s.opts.Log, Warn: s.opts.Warn}
	return nil
}

// service wires the long-lived service (Embedded and Daemon): the store,
// the audit log, the secrets, the broker that opens them (with its key
// file), the lifecycle, the sandboxes' service, and the tenants', which
// ends a deleted tenant's sandboxes.
func (s *System) service(ctx context.Context) (err error) {
	o := s.opts
	s.registry = prometheus.NewRegistry()
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if s.Store, err = store.Open(o.Database); err != nil {
		return err
	}
	s.closers.Push(s.Store.Close)
	// The broker's keys live beside the database, where no sandbox looks.
	k, err := keys.LoadFile(filepath.Join(o.Files, "broker.key"))
	if err != nil {
		return err
	}
	if err := s.openAudit(ctx); err != nil {
		return err
	}
	scfg := secret.Config{Store: s.Store, Keys: k}
	cfg := sandbox.Config{Store: s.Store, Log: o.Log, Metrics: sandbox.NewMetrics(s.registry),
		MaxBackground: o.MaxBackground, MaxBackgroundPerTenant: o.MaxBackgroundPerTenant,
		// The embedded service has one caller, root on this host: host
		// paths are its own. A daemon's tenants name them only under their
		// roots, which never touch the daemon's directories (Reserved).
		HostPaths:        o.Mode == Embedded,
		DefaultIsolation: o.DefaultIsolation,
		Node:             o.Node,
	}
	cfg.Node.Version, cfg.Node.Isolations = o.Version, s.isolations
	tcfg := tenant.Config{Store: s.Store, Log: o.Log,
		Reserved: []string{o.StateDir, o.DataDir, o.Files, filepath.Dir(o.Database), filepath.Dir(o.AdminKeyFile), filepath.Dir(o.Socket)},
	}
	if s.Audit != nil {
		s.Recorder = record.New(s.Audit, o.Log)
		cfg.AuditDir, cfg.PatchDir = AuditDir(o.Files), filepath.Join(AuditDir(o.Files), "patches")
		l := s.Audit
		cfg.Node.AuditHead = func() *api.AuditHead {
			h := l.Head()
			if h.Seq == 0 {
				return nil // nothing on disk yet
			}
			return &api.AuditHead{Seq: h.Seq, Hash: h.Hash}
		}
	}
	cfg.Audit, scfg.Audit, tcfg.Audit = s.Recorder, s.Recorder, s.Recorder
	s.Secrets = secret.New(scfg)
	s.Broker = broker.New(broker.Config{Keys: k, Dir: filepath.Join(o.Files, "broker"), Secret: s.Secrets.Value})
	if s.Lifecycle, err = lifecycle.New(s.lifecycleConfig(), s.Walls...); err != nil {
		return err
	}
	cfg.Backend, cfg.Broker = sandbox.NewBackend(s.Lifecycle), s.Broker
	s.Service = sandbox.New(cfg)
	tcfg.Sandboxes = s.Service
	s.Tenants = tenant.New(tcfg)
	s.Service.Cfg.Principal = s.Tenants.ByID
	// Port tokens are signed with a key of their own, beside the
	// broker's, so that they outlive a restart and share no MAC key with
	// the broker's tokens.
	pk, err := keys.LoadFile(filepath.Join(o.Files, "ports.key"))
	if err != nil {
		return err
	}
	s.Ports = portfront.New(portfront.Config{Sandboxes: s.Service, Tenant: s.Tenants.ByID, Keys: pk, Refuse: httpapi.WriteError, Log: o.Log})
	return nil
}

// openAudit opens the service's audit log (unless NoAudit), keeping its
// head in the store, exporting to OTLP when asked.
func (s *System) openAudit(ctx context.Context) error {
	o := s.opts
	if o.NoAudit {
		o.Log.Warn("running WITHOUT an audit log (--no-audit): nothing sandboxes do is recorded")
		return nil
	}
	var exp *audit.Exporter
	if o.OTLPEndpoint != "" {
		exp = audit.NewExporter(o.OTLPEndpoint)
		s.closers.Do(func() {
			exp.Close()
			if exp.Dropped()+exp.Failed() > 0 {
				o.Log.Warn("audit export incomplete", "dropped", exp.Dropped(), "refused", exp.Failed())
			}
		})
	}
	l, err := openAudit(ctx, o.Files, s.Store, o.Log, exp)
	if err != nil {
		return err
	}
	s.Audit = l
	s.closers.Push(l.Close)
	return nil
}

// Close gives back what New built, newest first.
func (s *System) Close() error { return s.closers.Run() }
