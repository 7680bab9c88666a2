package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/cli/host"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/system"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"github.com/airlock-sandbox/airlock/internal/version"
)

func mcpCmd(g *cmdutil.Globals) *cobra.Command {
	var (
		sf                         cmdutil.SandboxFlags
		secrets                    []string
		policy, export, scanPolicy string
		useDaemon                  bool
	)
	c := &cobra.Command{
		Use:   "mcp [flags]",
		Short: "Serve MCP over stdio: an agent's tools run inside a sandbox made for the session",
		Long: `mcp serves the Model Context Protocol on stdin and stdout, for desktop and
command-line agents. Its tools (run_command, read_file, write_file,
edit_file, list_files, search_files, diff, network_log) and the workspace's
files as resources all act inside one sandbox made for the session from these
flags (those of airlock run), never on the machine that runs the agent. The
sandbox is destroyed when the session ends; the workspace's diff is then
printed to stderr, or written to --export.

By default the sandbox is made in this process (no daemon; root needed, as for
run), and everything the session does goes to an audit log under
~/.local/state/airlock/mcp/. With --daemon it is made by airlock serve, as the
tenant whose key --key-file (or $AIRLOCK_API_KEY) holds.

Configuration for an MCP client (docs/mcp.md has more):

  {"mcpServers": {"airlock": {"command": "sudo",
    "args": ["airlock", "mcp", "--workspace", "/home/me/src/shop", "--allow", "npm"]}}}`,
		Example: `  sudo airlock mcp --workspace "$PWD"
  sudo airlock mcp --repo ~/src/shop --commit main --allow pypi --export /tmp/shop.diff
  airlock mcp --daemon --key-file ~/.config/airlock/key --workspace /srv/repos/shop`,
		Args: cobra.NoArgs,
	}
	k := cmdutil.AddConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		var err error
		if policy != "" {
			if err := readPolicy(policy, &sf.Req.Network); err != nil {
				return err
			}
		}
		parsed, err := sf.Spec()
		if err != nil {
			return err
		}
		req := *parsed
		if req.Workspace, err = cmdutil.AbsPath(req.Workspace); err != nil {
			return err
		}
		if req.Repo, err = cmdutil.AbsPath(req.Repo); err != nil {
			return err
		}
		if !slices.Contains(spec.ScanPolicies, scanPolicy) {
			return errdefs.Invalid(fmt.Sprintf("--scan %q: one of block, redact, record", scanPolicy))
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), unix.SIGINT, unix.SIGTERM, unix.SIGHUP)
		defer stop()
		// A client gone mid-answer is a write error (the session ends and
		// the sandbox with it), not a SIGPIPE that kills this process first.
		signal.Ignore(unix.SIGPIPE)
		if useDaemon {
			if len(secrets) > 0 {
				return errdefs.Invalid("--secret is for the embedded sandbox; with --daemon, store secrets with airlock secret add")
			}
			cl, err := k.Client(false)
			if err != nil {
				return err
			}
			return serveMCP(ctx, g, &mcp.ClientBackend{Client: cl}, req, export)
		}
		local, err := cmdutil.LocalSecrets(secrets)
		if err != nil {
			return err
		}
		if os.Geteuid() != 0 {
			return errdefs.Unavailable("root is needed to create sandboxes: run this as root, or with sudo (or use --daemon)")
		}
		var b [4]byte
		_, _ = rand.Read(b[:])
		files := filepath.Join(system.RunStateDir(), "mcp", time.Now().UTC().Format("20060102T150405Z")+"-"+hex.EncodeToString(b[:]))
		if err := os.MkdirAll(files, 0o700); err != nil {
			return err
		}
		o, err := host.SystemOptions(g, system.Embedded)
		if err != nil {
			return err
		}
		o.Files, o.Version = files, version.Version
		sys, err := system.New(ctx, o)
		if err != nil {
			return err
		}
		defer sys.Close()
		return sys.Embedded(ctx, func(ctx context.Context, svc *sandbox.Service) error {
			admin := &tenant.Principal{Admin: true}
			if _, err := sys.Tenants.Create(ctx, admin, &api.CreateTenant{Name: "local", ScanPolicy: scanPolicy}); err != nil {
				return err
			}
			p := &tenant.Principal{ID: "local", Tenant: "local", ScanPolicy: scanPolicy}
			for _, name := range slices.Sorted(maps.Keys(local)) {
				if _, err := sys.Secrets.Add(ctx, p, &api.AddSecret{Name: name, Value: string(local[name])}); err != nil {
					return err
				}
			}
			g.Warn("mcp: the session's audit log is in " + files)
			return serveMCP(ctx, g, &mcp.ServiceBackend{Service: svc, Principal: p}, req, export)
		})
	}
	f := c.Flags()
	sf.Bind(f)
	f.StringVar(&policy, "policy", "", "YAML or JSON file with allow: and deny: lists")
	f.StringArrayVar(&secrets, "secret", nil, "a secret for --grant: NAME=env:VARIABLE or NAME=file:PATH (embedded only)")
	f.StringVar(&scanPolicy, "scan", "block", "what a credential found in a tool call does: block, redact or record (embedded only; a daemon's tenant has its own)")
	f.StringVar(&sf.Req.TTL, "ttl", "24h", "the sandbox's lifetime, should the session outlive it")
	f.StringVar(&sf.Req.Trigger.TaskID, "task-id", "", "trigger record: the task this session serves (default mcp:<session id>)")
	f.StringVar(&export, "export", "", "write the workspace's diff to FILE when the session ends (default: stderr)")
	f.BoolVar(&useDaemon, "daemon", false, "make the sandbox in airlock serve (with --address and --key-file) instead of in this process")
	return c
}

// serveMCP runs one MCP session over stdio, then ends its sandbox, first
// saving the workspace's diff.
func serveMCP(ctx context.Context, g *cmdutil.Globals, backend mcp.Backend, req api.CreateSandbox, export string) error {
	srv, sess := mcp.NewServer(backend, req, mcp.Options{Version: version.Version})
	sess.OnCreate = func(sb mcp.Sandbox) { g.Warn("mcp: sandbox " + sb.ID() + " made for the session") }
	var once sync.Once
	var diffErr, endErr error
	end := func() {
		once.Do(func() {
			endErr = sess.End(context.WithoutCancel(ctx), func(sb mcp.Sandbox) {
				d, err := sb.Diff(context.WithoutCancel(ctx))
				if err != nil {
					diffErr = fmt.Errorf("the workspace's diff: %w", err)
					return
				}
				if export != "" {
					diffErr = os.WriteFile(export, []byte(d), 0o644)
					return
				}
				if d == "" {
					g.Warn("mcp: no changes in /workspace")
					return
				}
				fmt.Fprint(cmdutil.ForTerminal(g.Stderr), d)
			})
		})
	}
	// A signal ends the session at once, a tool call under way with it
	// (its command dies with the sandbox); the server then returns.
	stopEnd := context.AfterFunc(ctx, end)
	defer stopEnd()
	runErr := srv.Run(ctx, &sdk.StdioTransport{})
	end()
	if endErr != nil {
		g.Warn("mcp: destroy the sandbox: " + endErr.Error())
	}
	if runErr != nil && ctx.Err() == nil && !isClosed(runErr) {
		return runErr
	}
	return diffErr
}

// isClosed reports the end of a stdio session (the client went away).
func isClosed(err error) bool {
	return err != nil && (bytes.Contains([]byte(err.Error()), []byte("EOF")) || bytes.Contains([]byte(err.Error()), []byte("closed")))
}

// readPolicy reads a policy file's allow and deny lists (airlock run's
// --policy format) into n.
func readPolicy(path string, n *api.Network) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return errdefs.Invalid("--policy: " + err.Error())
	}
	var pf struct {
		Allow []string `yaml:"allow"`
		Deny  []string `yaml:"deny"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&pf); err != nil {
		return errdefs.Invalid(fmt.Sprintf("--policy %s: %v", path, err))
	}
	n.Allow = append(n.Allow, pf.Allow...)
	n.Deny = append(n.Deny, pf.Deny...)
	return nil
}
