package host

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/doctor"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/system"
)

func doctorCmd(g *cmdutil.Globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check this host for every control airlock needs",
		Long: `Doctor checks, on this host and for real where it can, every kernel feature
airlock's controls rely on, and says what airlock refuses to do without each.
It exits 1 when a required control is missing.

Then it reports the per-host limits that bound how many sandboxes this host
holds (pids, uid ranges, the subnet pool, inotify, descriptors, memory,
namespaces): what is in use of each, what one idle sandbox takes of it, and
how many more idle container sandboxes it leaves room for; the one that
binds first is marked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			checks := doctor.Checks(g.StateDir, g.Runsc, g.Init)
			pool := g.Pool
			if !pool.IsValid() {
				pool = sandboxnet.DefaultSubnetPool
			}
			limits := doctor.Limits(g.StateDir, sandboxnet.LeaseDir(g.StateDir), pool)
			failed := false
			for _, c := range checks {
				failed = failed || !c.OK && c.Required
			}
			if asJSON {
				if err := cmdutil.PrintJSON(g.Stdout, map[string]any{"ok": !failed, "checks": checks, "limits": limits}); err != nil {
					return err
				}
			} else {
				w := tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
				for _, c := range checks {
					mark := "ok"
					if !c.OK {
						mark = "MISSING"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\n", c.Name, mark, c.Detail)
					if !c.OK && c.Without != "" {
						fmt.Fprintf(w, "\t\t-> %s\n", c.Without)
					}
				}
				w.Flush()
				fmt.Fprintln(g.Stdout, "\nper-host limits (room for more idle container sandboxes, at what one takes):")
				w = tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
				for _, l := range limits {
					room := "-"
					if l.Sandboxes != nil {
						room = strconv.FormatInt(*l.Sandboxes, 10)
					}
					if l.First {
						room += " (binds first)"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\n\t\teach: %s\n", l.Name, room, l.Detail, l.PerSandbox)
				}
				w.Flush()
				if failed {
					fmt.Fprintln(g.Stdout, "\nairlock cannot create sandboxes on this host until the MISSING controls above are available.")
				} else {
					fmt.Fprintln(g.Stdout, "\nall controls airlock needs are available.")
				}
			}
			if failed {
				return cmdutil.ExitError{Code: 1}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the checks as JSON")
	return c
}

func gcCmd(g *cmdutil.Globals) *cobra.Command {
	var asJSON bool
	var logsOlder time.Duration
	c := &cobra.Command{
		Use:   "gc",
		Short: "Remove what dead sandboxes left behind (and, when asked, old run and MCP session logs)",
		Long: `Gc removes the cgroups, locks and workspace checkouts of sandboxes whose
airlock process is gone (killed with SIGKILL, say). Their processes died with
them; gc never touches a live sandbox. Every airlock run does this too.

The audit logs airlock run and airlock mcp keep under the user's state
directory (~/.local/state/airlock/runs and mcp) are kept until asked:
--logs-older-than 720h removes those nothing wrote to for 30 days (a log
given by --audit FILE is never touched).

  sudo airlock gc
  sudo airlock gc --logs-older-than 720h --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if logsOlder < 0 {
				return errdefs.Invalid("--logs-older-than must not be negative")
			}
			sys, err := hostSystem(cmd.Context(), g, g.Warn)
			if err != nil {
				return err
			}
			defer sys.Close()
			ids, err := sys.Lifecycle.GC()
			var logs []string
			if logsOlder > 0 {
				var lerr error
				logs, lerr = system.PruneLogs(logsOlder)
				err = errors.Join(err, lerr)
			}
			if asJSON {
				if perr := cmdutil.PrintJSON(g.Stdout, map[string]any{"removed": nonNil(ids), "logs_removed": nonNil(logs)}); perr != nil {
					return perr
				}
			} else {
				for _, id := range ids {
					fmt.Fprintf(g.Stdout, "removed %s\n", id)
				}
				for _, l := range logs {
					fmt.Fprintf(g.Stdout, "removed log %s\n", l)
				}
			}
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the removed sandbox ids and logs as JSON")
	c.Flags().DurationVar(&logsOlder, "logs-older-than", 0, "also remove the runs' and MCP sessions' audit logs nothing wrote to for this long (e.g. 720h; default: keep them)")
	return c
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func imageCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "image",
		Short: "Manage the image cache",
		Long: `OCI images (oci:PATH, docker-archive:PATH, registry references) are unpacked
once into a content-addressed cache under /var/lib/airlock/images and shared
read-only by every sandbox that uses them. The cache is capped; the least
recently used images are evicted first, never one in use.`,
	}
	var asJSON, rmJSON, pullJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List cached images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			sys, err := hostSystem(cmd.Context(), g, func(string) {})
			if err != nil {
				return err
			}
			defer sys.Close()
			list, err := sys.Lifecycle.Images().List()
			if err != nil {
				return err
			}
			if asJSON {
				return cmdutil.PrintJSON(g.Stdout, list)
			}
			w := tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tSIZE\tLAST USED\tNAMES")
			for _, m := range list {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", m.ID[:12], spec.FormatSize(m.Size), m.LastUsed.Local().Format(time.DateTime), strings.Join(m.Names, ", "))
			}
			return w.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	rm := &cobra.Command{
		Use:   "rm NAME|ID...",
		Short: "Remove cached images (not those in use)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sys, err := hostSystem(cmd.Context(), g, func(string) {})
			if err != nil {
				return err
			}
			defer sys.Close()
			type outcome struct {
				Image string   `json:"image"`
				OK    bool     `json:"ok"`
				ID    string   `json:"id,omitempty"`
				Names []string `json:"names,omitempty"`
				Error string   `json:"error,omitempty"`
			}
			out := make([]outcome, 0, len(args))
			var errs []error
			for _, a := range args {
				m, err := sys.Lifecycle.Images().Remove(a)
				if err != nil {
					g.Warn(err.Error())
					errs = append(errs, err)
					out = append(out, outcome{Image: a, Error: err.Error()})
					continue
				}
				out = append(out, outcome{Image: a, OK: true, ID: m.ID, Names: m.Names})
				if !rmJSON {
					fmt.Fprintf(g.Stdout, "removed %s (%s)\n", m.ID[:12], strings.Join(m.Names, ", "))
				}
			}
			if rmJSON {
				if err := cmdutil.PrintJSON(g.Stdout, out); err != nil {
					return err
				}
			}
			return cmdutil.Exit(cmdutil.ExitCode(cmd, errors.Join(errs...)))
		},
	}
	rm.Flags().BoolVar(&rmJSON, "json", false, "print what was removed (and what was not, and why) as JSON")
	pull := &cobra.Command{
		Use:   "pull IMAGE",
		Short: "Fetch and unpack an image into the cache without running anything",
		Long: `Pull fetches IMAGE (a registry reference, oci:PATH or docker-archive:PATH)
and unpacks it into the cache, then prints its ID and name. On a terminal, it
says what it pulls from which registry, and draws each layer's progress on
stderr (--progress draws it on anything else; --json never).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sys, err := hostSystem(cmd.Context(), g, g.Warn)
			if err != nil {
				return err
			}
			defer sys.Close()
			ctx, clearProgress := g.Progress(context.Background(), pullJSON)
			l, err := sys.Lifecycle.Images().Resolve(ctx, args[0], g.Warn)
			clearProgress()
			if err != nil {
				return err
			}
			defer l.Done()
			if pullJSON {
				return cmdutil.PrintJSON(g.Stdout, map[string]string{"id": l.Digest, "name": args[0]})
			}
			fmt.Fprintf(g.Stdout, "%s %s\n", l.Digest, args[0])
			return nil
		},
	}
	pull.Flags().BoolVar(&pullJSON, "json", false, `print {"id", "name"} as JSON`)
	c.AddCommand(ls, rm, pull)
	return c
}
