// Package cli is airlock's command line: subcommands, flags, output (text
// and --json). Results go to stdout, diagnostics to stderr. `run`, `mcp`
// and `serve` build their world with internal/system (the composition
// root); the other commands talk to a daemon through the Go SDK (client),
// and `airlock audit` reads the log on the host.
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/run"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/system"
)

// Version is set at build time with -ldflags "-X ...cli.Version=...".
var Version = "dev"

// exitError carries an exit code through cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// globals are the flags every subcommand shares.
type globals struct {
	stateDir   string
	dataDir    string
	debug      bool
	imageCache string
	// dnsUpstream, pool and allowNets are operator settings of run.
	dnsUpstream string
	pool        netip.Prefix
	allowNets   []netip.Prefix
	log         *slog.Logger
	stdout      io.Writer
	stderr      io.Writer
}

// Main runs the command line and returns the process exit code.
func Main(args []string) int {
	g := &globals{stdout: os.Stdout, stderr: os.Stderr}
	root := &cobra.Command{
		Use:   "airlock",
		Short: "Disposable, isolated, network-scoped sandboxes for AI agents",
		Long: `airlock gives every agent run a disposable room to execute code: its own
namespaces, a read-only image, a throwaway writable layer, no network, no host
credentials, kernel-enforced limits, and nothing left behind afterwards.

  sudo airlock run -- python3 -c 'print("hello")'
  sudo airlock run --workspace ./repo --diff -- make test
  sudo airlock doctor

For many tenants and long-lived sandboxes, run the daemon and use it with
the same commands (or the HTTP API of docs/api.md, or the Go SDK):

  sudo airlock serve &
  sudo airlock tenant create alice            # prints alice's API key once
  export AIRLOCK_API_KEY=...; id=$(sudo -E airlock create --workspace ./repo)
  sudo -E airlock exec "$id" -- make test; sudo -E airlock rm "$id"`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", "/run/airlock", "runtime state (leases, locks)")
	root.PersistentFlags().StringVar(&g.dataDir, "data-dir", "/var/lib/airlock", "persistent data (image cache)")
	root.PersistentFlags().BoolVar(&g.debug, "debug", false, "structured debug logs on stderr")
	root.PersistentFlags().StringVar(&g.imageCache, "image-cache-size", "20G", "cap on the OCI image cache; least recently used images are evicted past it")
	_ = root.PersistentFlags().MarkHidden("state-dir")
	_ = root.PersistentFlags().MarkHidden("data-dir")
	root.AddCommand(runCmd(g), doctorCmd(g), gcCmd(g), imageCmd(g))
	root.AddCommand(remoteCmds(g)...)
	// Bad flags and arguments are invalid requests: for `run` that is exit
	// 125, "the sandbox could not be created", like any other refusal.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return errdefs.Invalid(err.Error()) })
	root.PersistentPreRun = func(*cobra.Command, []string) {
		g.log = slog.New(slog.DiscardHandler)
		if g.debug {
			g.log = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	}
	root.SetArgs(args)
	root.SetOut(g.stdout)
	root.SetErr(g.stderr)
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	default:
		fmt.Fprintf(g.stderr, "airlock: %v\n", err)
		if errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrUnavailable) ||
			errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrResourceExhausted) {
			return run.ExitCreate
		}
		return 1
	}
}

// systemOptions are what every mode of internal/system takes from the
// global flags.
func (g *globals) systemOptions(mode system.Mode) (system.Options, error) {
	cacheBytes, err := spec.ParseSize(g.imageCache)
	if err != nil {
		return system.Options{}, errdefs.Invalid("--image-cache-size: " + err.Error())
	}
	return system.Options{Mode: mode, StateDir: g.stateDir, DataDir: g.dataDir, Log: g.log, Warn: g.warn,
		DNSUpstream: g.dnsUpstream, SubnetPool: g.pool, EgressAllowNets: g.allowNets, ImageCacheBytes: cacheBytes}, nil
}

// lifecycle is the host's wall and lifecycle, for commands that manage
// sandboxes' remains and images.
func (g *globals) lifecycle(warn func(string)) (*lifecycle.Lifecycle, error) {
	if os.Geteuid() != 0 {
		return nil, errdefs.Unavailable("root is needed to manage the host's sandboxes and images: run this as root, or with sudo")
	}
	o, err := g.systemOptions(system.OneShot)
	if err != nil {
		return nil, err
	}
	o.Warn = warn
	return system.NewLifecycle(o)
}

func (g *globals) warn(msg string) { fmt.Fprintf(g.stderr, "airlock: %s\n", msg) }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
