package host

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/run"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/system"
)

func runCmd(g *cmdutil.Globals) *cobra.Command {
	s := spec.Default()
	var (
		memory, disk, timeout string
		asJSON                bool
		diff                  bool
		export                string
		egressBytes           string
		nets                  netFlags
		grants, secrets       []string
		grantsFile            string
	)
	c := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARG...]",
		Short: "Run one command in a fresh sandbox, then destroy it",
		Long: `Run creates a fresh sandbox, runs COMMAND in it with /workspace as its working
directory, relays stdin, stdout and stderr, destroys the sandbox and exits with
the command's exit code. No daemon and no configuration are needed.

Every run gets new user, pid, mount, uts, ipc, net and cgroup namespaces, a
read-only image, a writable /workspace, /tmp, /dev/shm and home on a private
tmpfs capped by --disk, no network, no capabilities, no_new_privs, seccomp,
Landlock, and kernel-enforced memory, CPU, pids and time limits.

Images (--image):
  host                    read-only view of this host's /usr, with a clean /etc (default)
  /path/to/rootfs         a root filesystem directory
  oci:/path/to/layout     an OCI image layout directory
  docker-archive:/x.tar   a 'docker save' tarball
  python:3.12-slim        a registry reference (pulled when a registry is reachable)

Exit status:
  the command's own, 128+N if it died of signal N,
  124 timeout, 125 sandbox could not be created, 126 command not executable,
  127 command not found, 137 memory limit exceeded (or killed).`,
		Example: `  sudo airlock run -- echo hello
  sudo airlock run --workspace "$PWD" --diff -- sh -c 'echo fix >> README.md'
  sudo airlock run --repo ~/src/shop --commit HEAD~1 -- make test
  sudo airlock run --image docker-archive:/tmp/alpine.tar --user root --writable-rootfs -- apk add curl
  sudo airlock run --memory 256M --pids 64 --timeout 30s --json -- ./untrusted
  sudo GH_RO_TOKEN=... airlock run --repo ~/src/shop --secret gh=env:GH_RO_TOKEN \
    --grant 'gh@api.github.com GET,HEAD:/repos/acme/shop/** env=GITHUB_TOKEN' -- ./triage.sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errdefs.Invalid("no command given: use airlock run [flags] -- COMMAND [ARG...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if s.Limits.Memory, err = spec.ParseSize(memory); err != nil {
				return fmt.Errorf("--memory: %w", err)
			}
			if s.Limits.Disk, err = spec.ParseSize(disk); err != nil {
				return fmt.Errorf("--disk: %w", err)
			}
			if s.Timeout, err = parseDuration(timeout); err != nil {
				return err
			}
			if s.Net.EgressBytes, err = spec.ParseSize(egressBytes); err != nil {
				return fmt.Errorf("--egress-bytes: %w", err)
			}
			if s.Net.PolicyFile, err = cmdutil.AbsPath(s.Net.PolicyFile); err != nil {
				return err
			}
			s.Command = args
			ag, err := cmdutil.GrantsOf(grants, grantsFile)
			if err != nil {
				return err
			}
			if s.Grants, err = cmdutil.SpecGrants(ag); err != nil {
				return err
			}
			if nets.secrets, err = cmdutil.LocalSecrets(secrets); err != nil {
				return err
			}
			if err := cmdutil.HostPaths(&s.Workspace, &s.Repo, &s.Image); err != nil {
				return err
			}
			if err := s.Validate(); err != nil {
				return err
			}
			return runSandbox(g, &s, asJSON, diff, export, nets)
		},
	}
	f := c.Flags()
	f.SetInterspersed(false)
	f.StringVar(&s.Isolation, "isolation", "container", cmdutil.IsolationHelp)
	f.StringVar(&s.Image, "image", "host", "root filesystem: host, a directory, oci:PATH, docker-archive:PATH or a registry reference")
	f.BoolVar(&s.WritableRootfs, "writable-rootfs", false, "give the sandbox its own writable layer over the image (for package installs)")
	f.StringVar(&s.Workspace, "workspace", "", "copy this host directory to /workspace at create: the sandbox sees it as it was then (the host's files are never written)")
	f.StringVar(&s.Repo, "repo", "", "build /workspace from this git repository at --commit (objects only: no hooks, no config)")
	f.StringVar(&s.Commit, "commit", "", "revision of --repo to check out")
	f.BoolVar(&diff, "diff", false, "after the command, print a unified diff of what changed in /workspace (past about 64 MiB files are named, not diffed; what cannot be read is named)")
	f.StringVar(&export, "export", "", "after the command, copy the resulting /workspace into this new directory (without setuid/setgid bits, group or other write, or links that could resolve outside it; a file's hard links stay links; what is skipped is named on stderr)")
	f.StringVar(&s.User, "user", "user", `run as "user" (uid 1000, no capabilities) or "root" (root inside the sandbox only)`)
	f.StringArrayVarP(&s.Env, "env", "e", nil, "set KEY=VALUE in the command's environment (repeatable)")
	f.BoolVarP(&s.TTY, "tty", "t", false, "relay through a terminal owned by the sandbox")
	f.StringVar(&memory, "memory", "2G", "memory limit (OOM kills the whole sandbox)")
	f.Float64Var(&s.Limits.CPUs, "cpus", spec.DefaultCPUs, "CPU quota, in CPUs")
	f.Int64Var(&s.Limits.Pids, "pids", spec.DefaultPids, "maximum number of processes and threads")
	f.StringVar(&disk, "disk", "1G", "writable space (tmpfs, counted against --memory); writes past it get ENOSPC")
	f.StringVar(&timeout, "timeout", "10m", "wall-clock limit; the whole sandbox is killed at the deadline")
	f.StringSliceVar(&s.AllowDegraded, "allow-degraded", nil, "run without a missing control: only \"landlock\" may be named")
	f.StringVar(&s.Hostname, "hostname", "", "hostname inside the sandbox (default airlock-<id>)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object with the result to stdout at the end")
	f.StringVar(&s.Net.Mode, "net", "", `"none" (only loopback; the default without --allow) or "proxy" (only the egress proxy)`)
	f.StringArrayVar(&s.Net.Allow, "allow", nil, "allow HOST, *.SUFFIX, HOST:PORT, an IP, or a preset (pypi, npm, go, github, debian); repeatable; turns on the proxy")
	f.StringArrayVar(&s.Net.Deny, "deny", nil, "deny HOST or *.SUFFIX (wins over --allow); repeatable")
	f.StringVar(&s.Net.PolicyFile, "policy", "", "YAML or JSON file with allow: and deny: lists; turns on the proxy")
	f.StringVar(&nets.log, "net-log", "", "write every network decision to FILE as JSON lines (- for stderr)")
	f.StringVar(&nets.audit, "audit", "", "write the run's signed audit log to FILE (default: a new file under ~/.local/state/airlock/runs)")
	f.StringVar(&egressBytes, "egress-bytes", "1G", "cap on bytes the sandbox sends out through the proxy")
	f.IntVar(&s.Net.MaxConns, "max-conns", spec.DefaultMaxConns, "cap on concurrent proxied connections")
	f.StringVar(&nets.dnsUpstream, "dns-upstream", "", "resolver the proxy asks (host:port; default: /etc/resolv.conf's first)")
	f.StringVar(&nets.pool, "subnet-pool", sandboxnet.DefaultSubnetPool.String(), "IPv4 prefix from which each proxy-mode sandbox gets a /30")
	f.StringArrayVar(&nets.allowNets, "egress-allow-net", nil, egressAllowNetHelp)
	f.StringArrayVar(&grants, "grant", nil, cmdutil.GrantHelp+"; the secret comes from --secret")
	f.StringVar(&grantsFile, "grants", "", "YAML or JSON file: a list of grants")
	f.StringArrayVar(&secrets, "secret", nil, "a secret for --grant: NAME=env:VARIABLE or NAME=file:PATH (never the value itself; repeatable)")
	f.StringVar(&s.Scan, "scan", "record", "what a credential in a request the proxy can read does: block, redact or record")
	_ = f.MarkHidden("dns-upstream")
	return cmdutil.Relays(c)
}

// netFlags are run's host-side network options.
type netFlags struct {
	log         string
	audit       string
	dnsUpstream string
	pool        string
	allowNets   []string
	secrets     map[string][]byte // --secret values, for grants
}

// egressAllowNetHelp describes --egress-allow-net (run and serve).
const egressAllowNetHelp = "open a range the egress proxy never dials (private, documentation, ...) to every sandbox's policy (IP prefix; repeatable; never opens the host's own addresses or the subnet pool)"

// parseAllowNets parses --egress-allow-net values.
func parseAllowNets(vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, errdefs.Invalid(fmt.Sprintf("--egress-allow-net %q: want an IP prefix such as 10.20.0.0/16 (%v)", v, err))
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func runSandbox(g *cmdutil.Globals, s *spec.Spec, asJSON, diff bool, export string, nets netFlags) error {
	t0 := time.Now()
	var err error
	g.DNSUpstream = nets.dnsUpstream
	if g.Pool, err = netip.ParsePrefix(nets.pool); err != nil {
		return errdefs.Invalid(fmt.Sprintf("--subnet-pool %q: %v", nets.pool, err))
	}
	if g.AllowNets, err = parseAllowNets(nets.allowNets); err != nil {
		return err
	}
	sys, err := runSystem(g, nets)
	g.Log.Debug("engine ready", "at", time.Since(t0))
	if err != nil {
		return err // under --json, Main prints it as JSON too
	}
	closed := false
	closeSys := func() {
		if !closed {
			closed = true
			if cerr := sys.Close(); cerr != nil {
				g.Warn("audit log " + sys.AuditFile + ": " + cerr.Error())
			}
		}
	}
	defer closeSys()
	stdio := run.Stdio{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}
	ro := run.Options{Export: export}
	if nets.log == "-" {
		ro.NetLog = g.Stderr
	} else if nets.log != "" {
		f, err := os.OpenFile(nets.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return errdefs.Invalid("--net-log: " + err.Error())
		}
		defer f.Close()
		ro.NetLog = f
	}
	if diff {
		ro.Diff = cmdutil.ForTerminal(os.Stdout)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT)
	defer signal.Stop(sigs)
	ro.Signals = sigs
	if s.TTY {
		restore, err := attachTerminal(&stdio, &ro)
		if err != nil {
			return err
		}
		defer restore()
	}
	// The image's pull and unpack draw on stderr (and erase it before the
	// command starts).
	ctx, clearProgress := g.Progress(context.Background(), asJSON)
	res, err := sys.Run(ctx, s, stdio, ro)
	clearProgress()
	closeSys()
	return runOutcome(g, s, res, err, asJSON)
}

// runSystem builds the one-shot system: root, the run's secrets, its log.
func runSystem(g *cmdutil.Globals, nets netFlags) (*system.System, error) {
	if os.Geteuid() != 0 {
		return nil, errdefs.Unavailable("root is needed to create sandboxes: run this as root, or with sudo")
	}
	o, err := SystemOptions(g, system.OneShot)
	if err != nil {
		return nil, err
	}
	o.Secrets, o.RunAudit = nets.secrets, nets.audit
	return system.New(context.Background(), o)
}

// attachTerminal puts the user's terminal in raw mode for -t and follows
// its size; restore puts it back.
func attachTerminal(stdio *run.Stdio, ro *run.Options) (restore func(), err error) {
	stdio.TTY = os.Stdin
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return func() {}, nil
	}
	stdio.Rows, stdio.Cols = cmdutil.TermSize(int(os.Stdin.Fd()))
	old, err := term.MakeRaw(int(os.Stdin.Fd()))
	if err != nil {
		return nil, fmt.Errorf("terminal raw mode: %w", err)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, unix.SIGWINCH)
	resize := make(chan [2]uint16, 1)
	go func() {
		for range winch {
			rows, cols := cmdutil.TermSize(int(os.Stdin.Fd()))
			resize <- [2]uint16{rows, cols}
		}
	}()
	ro.Resize = resize
	return func() {
		signal.Stop(winch)
		_ = term.Restore(int(os.Stdin.Fd()), old)
	}, nil
}

// runOutcome tells the user how the run went and chooses the exit status.
func runOutcome(g *cmdutil.Globals, s *spec.Spec, res *run.Result, err error, asJSON bool) error {
	if errors.Is(err, run.ErrInterrupted) {
		g.Warn(err.Error())
		return cmdutil.ExitError{Code: 128 + int(unix.SIGINT)}
	}
	if res == nil {
		return err // under --json, Main prints it as JSON too
	}
	if err != nil {
		g.Warn(err.Error())
	}
	if res.Message != "" {
		g.Warn(res.Message)
	}
	if res.Egress != nil {
		g.Warn(res.Egress.Summary)
		for _, l := range res.Egress.LimitsHit {
			switch l {
			case "bytes-out":
				g.Warn(fmt.Sprintf("egress byte limit (%s) reached: connections were closed", spec.FormatSize(s.Net.EgressBytes)))
			case "connections":
				g.Warn(fmt.Sprintf("connection limit (%d) reached: connections were refused", s.Net.MaxConns))
			}
		}
	}
	if asJSON {
		if err := cmdutil.PrintJSON(g.Stdout, res); err != nil {
			return err
		}
	}
	if res.ExitCode != 0 {
		return cmdutil.ExitError{Code: res.ExitCode}
	}
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errdefs.Invalid(fmt.Sprintf("--timeout %q: want a duration such as 30s, 5m or 1h", s))
	}
	return d, nil
}
