package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func inspectCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "inspect SANDBOX...",
		Short: "Describe sandboxes as JSON: spec, state, usage, network, grants (never a secret)",
		Long: `inspect prints, as a JSON array, what the daemon knows of each sandbox: its
image, limits, network policy, grants (the secret's name and the rules,
never its value or the sandbox's placeholder), metadata and trigger, state,
expiry and last activity, and for a live sandbox its usage. An ended
sandbox is described for a day after its end, with why it ended.

  airlock inspect 8035500fd41a | jq '.[0].usage'`,
		Args: cobra.MinimumNArgs(1),
	}
	return onDaemon(g, c, false, func(ctx context.Context, cl *client.Client, _ *cmdutil.Conn, args []string) error {
		out := make([]*api.Sandbox, 0, len(args))
		var errs []error
		for _, id := range args {
			sb, err := cl.Sandbox(ctx, id)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, cmdutil.APIErr(err)))
				continue
			}
			out = append(out, sb)
		}
		if err := cmdutil.PrintJSON(g.Stdout, out); err != nil {
			return err
		}
		return errors.Join(errs...)
	})
}

func statsCmd(g *cmdutil.Globals) *cobra.Command {
	var watch time.Duration
	c := &cobra.Command{
		Use:   "stats [SANDBOX...]",
		Short: "Show what sandboxes use: CPU, memory against its limit, OOM kills, forks refused",
		Long: `stats shows each sandbox's use of the host, as the kernel accounts it: CPU
seconds, memory now and at its peak against the limit, OOM kills and forks
the pids limit refused. With no SANDBOX, every live sandbox of yours.
--watch refreshes the table until interrupted.

  airlock stats
  airlock stats --watch 1s 8035500fd41a`,
	}
	k := cmdutil.AddConn(c, g, true)
	c.Flags().DurationVarP(&watch, "watch", "w", 0, "show the table again this often until interrupted (e.g. 1s)")
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if watch < 0 {
			return errdefs.Invalid("--watch must not be negative")
		}
		cl, err := k.Client(false)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), unix.SIGINT, unix.SIGTERM)
		defer stop()
		for {
			sbs, err := usageOf(ctx, cl, args)
			if err != nil {
				return err
			}
			if err := k.Show(sbs, nil, func() error { return writeStats(g.Stdout, sbs) }); err != nil {
				return err
			}
			if watch == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(watch):
			}
			if !k.AsJSON {
				fmt.Fprintln(g.Stdout)
			}
		}
	}
	return c
}

// usageOf describes the sandboxes ids (every live one when none), each
// with its usage.
func usageOf(ctx context.Context, cl *client.Client, ids []string) ([]*api.Sandbox, error) {
	if len(ids) == 0 {
		sbs, err := cl.Sandboxes(ctx)
		if err != nil {
			return nil, cmdutil.APIErr(err)
		}
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
	}
	out := make([]*api.Sandbox, 0, len(ids))
	for _, id := range ids {
		sb, err := cl.Sandbox(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id, cmdutil.APIErr(err))
		}
		out = append(out, sb)
	}
	return out, nil
}

// writeStats is the table of stats.
func writeStats(w io.Writer, sbs []*api.Sandbox) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tCPU\tMEMORY\tPEAK\tLIMIT\tOOM KILLS\tFORKS REFUSED")
	size := func(n int64) string {
		if n <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	}
	for _, sb := range sbs {
		u := sb.Usage
		if u == nil {
			u = &api.Usage{}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2fs\t%s\t%s\t%s\t%d\t%d\n", sb.ID, sb.State, u.CPUSeconds, size(u.MemoryBytes), size(u.MemoryPeakBytes), size(sb.Limits.MemoryBytes), u.OOMKills, u.PidsLimited)
	}
	return tw.Flush()
}
