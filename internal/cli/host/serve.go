package host

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/system"
)

// serveFile is `airlock serve --config FILE` (YAML or JSON; unknown keys
// are errors). Flags given on the command line win.
type serveFile struct {
	Socket         string   `yaml:"socket"`
	SocketGroup    string   `yaml:"socket_group"`
	TCP            string   `yaml:"tcp"`
	TLSCert        string   `yaml:"tls_cert"`
	TLSKey         string   `yaml:"tls_key"`
	AdminKeyFile   string   `yaml:"admin_key_file"`
	LogLevel       string   `yaml:"log_level"`
	SubnetPool     string   `yaml:"subnet_pool"`
	EgressAllowNet []string `yaml:"egress_allow_net"`
	ImageCacheSize string   `yaml:"image_cache_size"`
	OTLPEndpoint   string   `yaml:"otlp_endpoint"`
	// 0: the flag's value.
	MaxBackgroundExecs          int      `yaml:"max_background_execs"`
	MaxBackgroundExecsPerTenant int      `yaml:"max_background_execs_per_tenant"`
	Registries                  []string `yaml:"registries"`
	DefaultIsolation            string   `yaml:"default_isolation"`
	E2BListen                   string   `yaml:"e2b_listen"`
	E2BDomain                   string   `yaml:"e2b_domain"`
	E2BTLSCert                  string   `yaml:"e2b_tls_cert"`
	E2BTLSKey                   string   `yaml:"e2b_tls_key"`
	E2BTemplates                []string `yaml:"e2b_template"`
	E2BAllowInternet            []string `yaml:"e2b_allow_internet"`
	NodeName                    string   `yaml:"node_name"`
	CapacityCPUs                float64  `yaml:"capacity_cpus"`
	CapacityMemory              string   `yaml:"capacity_memory"`
	CapacitySandboxes           int      `yaml:"capacity_sandboxes"`
}

func loadServeFile(path string) (*serveFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errdefs.Invalid("--config: " + err.Error())
	}
	var f serveFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, errdefs.Invalid(fmt.Sprintf("--config %s: %v", path, err))
	}
	return &f, nil
}

func serveCmd(g *cmdutil.Globals, version string) *cobra.Command {
	var (
		config, socket, socketGroup, tcp, cert, key, adminKey, logLevel, pool, otlp string
		defaultIsolation                                                            string
		noAudit                                                                     bool
		allowNets                                                                   []string
		mcpIdle                                                                     time.Duration
		maxBackground, maxBackgroundTenant                                          int
		registries                                                                  []string
		e2b                                                                         system.E2BOptions
		e2bTemplates                                                                []string
		node                                                                        nodeFlags
	)
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: long-lived sandboxes for many tenants behind an HTTP API",
		Long: `serve runs airlock's daemon. It listens on a root-only unix socket (and, with
--tcp, on TCP with TLS), keeps its state in SQLite under the data directory,
and adopts the sandboxes a previous daemon left running. On first start it
writes an admin key to a root-only file and says where; the admin key
creates tenants, whose keys create and use sandboxes:

  sudo airlock serve &
  sudo airlock tenant create alice          # prints alice's key once
  export AIRLOCK_API_KEY=airlock_tenant_...
  sudo -E airlock create                    # prints the sandbox id
  sudo -E airlock exec ID -- make test

A tenant names host paths (--workspace, --repo, a rootfs, oci: or
docker-archive: image) only under the roots the admin grants it
(airlock tenant create NAME --root DIR), and pulls images only from the
registries listed with --registry.

The node: GET /v1/node (admin key) reports the node's name (--node-name),
its capacity and what its sandboxes hold of it (the CPUs and memory of
their limits, and their number: live, being made and pooled), and
GET /v1/node/events streams its changes, for a cluster that places
sandboxes on it (docs/api.md, "Node"). Capacity given with
--capacity-cpus, --capacity-memory or --capacity-sandboxes is held: a
create or a pool refill that would pass it is refused (quota_exceeded,
"node capacity: ..."), across all tenants. Not given, the CPUs and memory
reported are the host's, and nothing is held to them (a sandbox's limits
are ceilings, not reservations):

  sudo airlock serve --node-name node-a --capacity-cpus 8 --capacity-memory 16GiB

Stopping the daemon (SIGTERM) leaves every sandbox running; the next
daemon adopts them. The API is documented in docs/api.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return errdefs.Unavailable("root is needed to run the daemon")
			}
			fc := &serveFile{}
			if config != "" {
				var err error
				if fc, err = loadServeFile(config); err != nil {
					return err
				}
			}
			pick := func(flag, file string) string {
				if cmd.Flags().Changed(flag) || file == "" {
					return cmd.Flag(flag).Value.String()
				}
				return file
			}
			socket, tcp, cert, key = pick("socket", fc.Socket), pick("tcp", fc.TCP), pick("tls-cert", fc.TLSCert), pick("tls-key", fc.TLSKey)
			socketGroup = pick("socket-group", fc.SocketGroup)
			adminKey, logLevel, pool = pick("admin-key-file", fc.AdminKeyFile), pick("log-level", fc.LogLevel), pick("subnet-pool", fc.SubnetPool)
			otlp = pick("otlp-endpoint", fc.OTLPEndpoint)
			defaultIsolation = pick("default-isolation", fc.DefaultIsolation)
			e2b.Listen, e2b.Domain = pick("e2b-listen", fc.E2BListen), pick("e2b-domain", fc.E2BDomain)
			e2b.TLSCert, e2b.TLSKey = pick("e2b-tls-cert", fc.E2BTLSCert), pick("e2b-tls-key", fc.E2BTLSKey)
			if len(fc.E2BTemplates) > 0 && !cmd.Flags().Changed("e2b-template") {
				e2bTemplates = fc.E2BTemplates
			}
			if len(fc.E2BAllowInternet) > 0 && !cmd.Flags().Changed("e2b-allow-internet") {
				e2b.AllowInternet = fc.E2BAllowInternet
			}
			templates, err := parseTemplates(e2bTemplates)
			if err != nil {
				return err
			}
			e2b.Templates = templates
			if !cmd.Flags().Changed("egress-allow-net") {
				allowNets = fc.EgressAllowNet
			}
			opened, err := parseAllowNets(allowNets)
			if err != nil {
				return err
			}
			if len(fc.Registries) > 0 && !cmd.Flags().Changed("registry") {
				registries = fc.Registries
			}
			if fc.ImageCacheSize != "" && !cmd.Flags().Changed("image-cache-size") {
				g.ImageCache = fc.ImageCacheSize
			}
			if fc.MaxBackgroundExecs != 0 && !cmd.Flags().Changed("max-background-execs") {
				maxBackground = fc.MaxBackgroundExecs
			}
			if fc.MaxBackgroundExecsPerTenant != 0 && !cmd.Flags().Changed("max-background-execs-per-tenant") {
				maxBackgroundTenant = fc.MaxBackgroundExecsPerTenant
			}
			if maxBackground < 1 || maxBackgroundTenant < 1 {
				return errdefs.Invalid("--max-background-execs and --max-background-execs-per-tenant must be at least 1")
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return errdefs.Invalid("--log-level: " + err.Error())
			}
			if g.Debug {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewJSONHandler(g.Stderr, &slog.HandlerOptions{Level: level}))
			if len(opened) > 0 {
				log.Warn("egress: ranges the guard blocks are opened to every sandbox", "egress_allow_net", opened)
			}
			prefix, err := netip.ParsePrefix(pool)
			if err != nil {
				return errdefs.Invalid("--subnet-pool: " + err.Error())
			}
			g.Log, g.Pool, g.AllowNets = log, prefix, opened
			o, err := SystemOptions(g, system.Daemon)
			if err != nil {
				return err
			}
			o.Warn = func(m string) { log.Warn(m) }
			o.Socket, o.TCP, o.TLSCert, o.TLSKey, o.AdminKeyFile, o.NoAudit, o.OTLPEndpoint, o.Version = socket, tcp, cert, key, adminKey, noAudit, otlp, version
			o.SocketGroup, o.DefaultIsolation, o.E2B = socketGroup, defaultIsolation, e2b
			o.MCPSessionTimeout, o.MaxBackground, o.MaxBackgroundPerTenant, o.Registries = mcpIdle, maxBackground, maxBackgroundTenant, registries
			if o.Node, err = node.config(cmd, fc); err != nil {
				return err
			}
			o.Ready = func(file string, created bool) {
				if created {
					fmt.Fprintf(g.Stderr, "airlock: wrote a new admin key to %s (root only); it manages tenants and the kill switch\n", file)
				}
				fmt.Fprintf(g.Stderr, "airlock: serving on %s\n", socket)
			}
			ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
			defer stop()
			sys, err := system.New(ctx, o)
			if err != nil {
				return err
			}
			defer sys.Close()
			return sys.Serve(ctx)
		},
	}
	f := c.Flags()
	f.StringVar(&config, "config", "", "config file (YAML): socket, socket_group, tcp, tls_cert, tls_key, admin_key_file, log_level, subnet_pool, egress_allow_net, image_cache_size, otlp_endpoint, max_background_execs, max_background_execs_per_tenant, registries, default_isolation, e2b_listen, e2b_domain, e2b_tls_cert, e2b_tls_key, e2b_template, e2b_allow_internet, node_name, capacity_cpus, capacity_memory, capacity_sandboxes")
	node.add(c)
	f.StringArrayVar(&registries, "registry", nil, "a registry (HOST[:PORT]) tenants' images may be pulled from, through the egress address guard (repeatable; none by default)")
	f.StringVar(&socket, "socket", api.DefaultSocket, "unix socket to serve the API on (root only, unless --socket-group)")
	f.StringVar(&socketGroup, "socket-group", "", "a group (name or gid) whose members may open the socket (mode 0660), so that clients need no root: an API key is still needed for every call")
	f.StringVar(&tcp, "tcp", "", "also serve on this TCP address, with TLS (needs --tls-cert and --tls-key)")
	f.StringVar(&cert, "tls-cert", "", "TLS certificate (PEM) for --tcp")
	f.StringVar(&key, "tls-key", "", "TLS private key (PEM) for --tcp")
	f.StringVar(&adminKey, "admin-key-file", "", "where the admin key is written (default DATA_DIR/admin.key)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error (JSON logs on stderr)")
	f.StringVar(&pool, "subnet-pool", sandboxnet.DefaultSubnetPool.String(), "IPv4 range proxy-mode sandboxes take their /30s from")
	f.StringArrayVar(&allowNets, "egress-allow-net", nil, egressAllowNetHelp)
	f.StringVar(&defaultIsolation, "default-isolation", "container", "the wall of a create that names none (container or gvisor); a default only: a create may name another wall, unless its tenant is held to one (airlock tenant update --isolation). With gvisor the daemon does not start without a usable runsc")
	f.StringVar(&g.DNSUpstream, "dns-upstream", "", "resolver the egress proxy asks (host:port; default: the host's)")
	_ = f.MarkHidden("dns-upstream")
	f.StringVar(&otlp, "otlp-endpoint", "", "also export audit records to this OpenTelemetry collector (OTLP/HTTP base URL, e.g. http://collector:4318)")
	f.DurationVar(&mcpIdle, "mcp-session-timeout", 30*time.Minute, "end MCP sessions at /mcp (and their sandboxes) after this long without a request")
	f.IntVar(&maxBackground, "max-background-execs", sandbox.DefaultMaxBackground, "background commands one sandbox may run at once (past it: quota_exceeded)")
	f.IntVar(&maxBackgroundTenant, "max-background-execs-per-tenant", sandbox.DefaultMaxBackgroundPerTenant, "background commands all of one tenant's sandboxes may run at once")
	f.StringVar(&e2b.Listen, "e2b-listen", "", "also serve E2B's API (control plane, envd, ports) on this TCP address, for the unmodified E2B SDKs (docs/e2b.md): plain HTTP on a loopback address, TLS elsewhere")
	f.StringVar(&e2b.Domain, "e2b-domain", "", "the sandboxes' domain told to E2B SDKs, which reach a sandbox at <port>-<id>.DOMAIN (default: the --e2b-listen address)")
	f.StringVar(&e2b.TLSCert, "e2b-tls-cert", "", "TLS certificate (PEM) for --e2b-listen (default: --tls-cert)")
	f.StringVar(&e2b.TLSKey, "e2b-tls-key", "", "TLS private key (PEM) for --e2b-listen (default: --tls-key)")
	f.StringArrayVar(&e2bTemplates, "e2b-template", nil, "an E2B template id and the image it names, NAME=IMAGE (repeatable; base=host unless given)")
	f.StringArrayVar(&e2b.AllowInternet, "e2b-allow-internet", nil, "a host an E2B create that asks for the internet may reach (repeatable; none: such a create is refused, as airlock never allows the whole internet)")
	f.BoolVar(&noAudit, "no-audit", false, "run without the audit log (benchmarks only)")
	_ = f.MarkHidden("no-audit")
	return c
}

// parseTemplates reads --e2b-template NAME=IMAGE values.
func parseTemplates(vals []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range vals {
		name, image, ok := strings.Cut(v, "=")
		if !ok || name == "" || image == "" {
			return nil, errdefs.Invalid(fmt.Sprintf("--e2b-template %q: want NAME=IMAGE (base=host)", v))
		}
		out[name] = image
	}
	return out, nil
}

// nodeFlags are serve's --node-name and --capacity-* flags.
type nodeFlags struct {
	name      string
	cpus      float64
	memory    string
	sandboxes int
}

// add defines the flags on c.
func (n *nodeFlags) add(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&n.name, "node-name", "", "the node's name in GET /v1/node (default: the host's name)")
	f.Float64Var(&n.cpus, "capacity-cpus", 0, "CPUs the node's sandboxes may hold in all (the sum of their cpus limits, pooled and being made included): a create or pool refill past it is refused (default: the host's CPUs, reported but not held)")
	f.StringVar(&n.memory, "capacity-memory", "", "memory the node's sandboxes may hold in all (the sum of their memory limits), e.g. 16GiB: a create or pool refill past it is refused (default: the host's memory, reported but not held)")
	f.IntVar(&n.sandboxes, "capacity-sandboxes", 0, "sandboxes the node may hold at once, all tenants', pooled and being made included (0: no cap)")
}

// config is the node the flags (or the config file's keys, which the
// flags given win over) describe: what is given is held; the CPUs and
// memory not given are the host's, reported only.
func (n nodeFlags) config(cmd *cobra.Command, fc *serveFile) (sandbox.NodeConfig, error) {
	var c sandbox.NodeConfig
	changed := cmd.Flags().Changed
	if !changed("node-name") && fc.NodeName != "" {
		n.name = fc.NodeName
	}
	if !changed("capacity-cpus") && fc.CapacityCPUs != 0 {
		n.cpus = fc.CapacityCPUs
	}
	if !changed("capacity-memory") && fc.CapacityMemory != "" {
		n.memory = fc.CapacityMemory
	}
	if !changed("capacity-sandboxes") && fc.CapacitySandboxes != 0 {
		n.sandboxes = fc.CapacitySandboxes
	}
	c.Name = n.name
	if c.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("--node-name not given, and the host's name: %w", err)
		}
		c.Name = h
	}
	switch {
	case n.cpus < 0 || math.IsNaN(n.cpus) || math.IsInf(n.cpus, 0):
		return c, errdefs.Invalid(fmt.Sprintf("--capacity-cpus %g: a positive number of CPUs", n.cpus))
	case n.sandboxes < 0:
		return c, errdefs.Invalid(fmt.Sprintf("--capacity-sandboxes %d: 0 (no cap) or more", n.sandboxes))
	}
	c.Held.CPUs, c.Held.Sandboxes = n.cpus, n.sandboxes
	if n.memory != "" {
		m, err := spec.ParseSize(n.memory)
		if err != nil || m <= 0 {
			return c, errdefs.Invalid(fmt.Sprintf("--capacity-memory %q: a size, e.g. 16GiB", n.memory))
		}
		c.Held.MemoryBytes = m
	}
	c.Capacity = c.Held
	if c.Capacity.CPUs == 0 {
		c.Capacity.CPUs = float64(runtime.NumCPU())
	}
	if c.Capacity.MemoryBytes == 0 {
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err != nil {
			return c, fmt.Errorf("sysinfo: %w", err)
		}
		c.Capacity.MemoryBytes = int64(si.Totalram) * int64(si.Unit)
	}
	return c, nil
}
