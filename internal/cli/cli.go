// Package cli is airlock's command line: the root command, its global
// flags and the exit codes; `airlock mcp` (a sandbox for an MCP session,
// made in this process or by a daemon) and `airlock audit` (the log, read
// on the host). Results go to stdout, diagnostics to stderr. The other
// commands live in packages of their own: internal/cli/host (run, serve,
// doctor, gc, image: the engine in this process), internal/cli/remote (a
// daemon's sandboxes) and internal/cli/admin (tenants, secrets, the kill
// switch), over what internal/cli/cmdutil shares. It imports
// internal/cli/host, internal/cli/remote, internal/cli/admin,
// internal/cli/cmdutil, api, internal/system, internal/mcp,
// internal/sandbox, internal/tenant, internal/audit,
// internal/audit/record, internal/store, internal/spec, internal/errdefs,
// internal/untrusted and internal/version.
package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli/admin"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/cli/host"
	"github.com/airlock-sandbox/airlock/internal/cli/remote"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/version"
)

// Main runs the command line and returns the process exit code.
func Main(args []string) int {
	g := &cmdutil.Globals{Stdout: os.Stdout, Stderr: os.Stderr}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(g.Stdout)
	root.SetErr(g.Stderr)
	cmd, err := root.ExecuteC()
	code := cmdutil.ExitCode(cmd, err)
	var ee cmdutil.ExitError
	if err == nil || errors.As(err, &ee) {
		return code // the command said what it had to
	}
	fmt.Fprintf(g.Stderr, "airlock: %v\n", err)
	// Under --json the error is JSON on stdout too: a script reading the
	// answer gets one.
	if f := cmd.Flags().Lookup("json"); f != nil && f.Value.String() == "true" {
		_ = cmdutil.PrintJSON(g.Stdout, map[string]any{"error": err.Error(), "exit_code": code})
	}
	return code
}

// newRoot is airlock's command tree, writing to g's streams.
func newRoot(g *cmdutil.Globals) *cobra.Command {
	ag := &globals{stdout: g.Stdout}
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
  sudo -E airlock exec "$id" -- make test; sudo -E airlock rm "$id"

Exit status, for every command: 0 done, 1 failed, 2 a bad flag, argument or
value. run, exec and attach exit with the sandboxed command's status instead,
and 125 when airlock could not do its part (124 timeout, 126 not executable,
127 not found, 137 killed: the memory limit).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Version,
	}
	root.PersistentFlags().StringVar(&g.StateDir, "state-dir", "/run/airlock", "runtime state (leases, locks)")
	root.PersistentFlags().StringVar(&g.DataDir, "data-dir", "/var/lib/airlock", "persistent data (image cache)")
	root.PersistentFlags().BoolVar(&g.Debug, "debug", false, "structured debug logs on stderr")
	root.PersistentFlags().StringVar(&g.ImageCache, "image-cache-size", "20G", "cap on the OCI image cache; least recently used images are evicted past it")
	root.PersistentFlags().StringVar(&g.Runsc, "runsc", "", "the runsc binary --isolation gvisor runs (default /usr/local/lib/airlock/runsc, as scripts/install.sh puts it); it must be the version airlock pins")
	root.PersistentFlags().StringVar(&g.Init, "init", "", "the airlock-init binary every sandbox runs (its init and agent; default: airlock-init beside this executable, as scripts/install.sh puts it); it must be root's, writable by root alone, and of this airlock's version")
	root.PersistentFlags().BoolVar(&g.ForceProgress, "progress", false, "draw the progress of long work (image pulls, snapshots) on stderr even when it is not a terminal (never under --json)")
	_ = root.PersistentFlags().MarkHidden("state-dir")
	_ = root.PersistentFlags().MarkHidden("data-dir")
	root.AddCommand(host.Commands(g, version.Version)...)
	root.AddCommand(remote.Commands(g)...)
	root.AddCommand(admin.Commands(g)...)
	root.AddCommand(mcpCmd(g), auditCmd(ag), manCmd(g))
	// Bad flags and arguments are usage errors (exit 2; for run, exec
	// and attach, 125: airlock could not do its part).
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return errdefs.Invalid(err.Error()) })
	root.InitDefaultCompletionCmd() // cobra's, here so that Usage covers it
	cmdutil.Usage(root)
	root.PersistentPreRun = func(*cobra.Command, []string) {
		g.Log = slog.New(slog.DiscardHandler)
		if g.Debug {
			g.Log = slog.New(slog.NewTextHandler(g.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		ag.stateDir, ag.dataDir = g.StateDir, g.DataDir
	}
	return root
}
