package remote

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

func poolCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "pool",
		Short: "Keep sandboxes made ahead (warm pools); list and remove pools",
		Long: `A pool keeps SIZE sandboxes of one image, limits, isolation and network made
ahead in the daemon, frozen. A create that names the pool (create --pool NAME),
or whose image, limits, isolation and network are the pool's, takes one: it is
thawed and given the create's environment, metadata, trigger, TTL and idle
timeout, and is the caller's from then on (never returned to the pool); the
daemon makes another in the background. A create with a workspace, a repo,
grants or another egress policy is made afresh. Pooled sandboxes count
against your quotas.

  airlock pool set py --size 4 --image oci:/srv/images/python --memory 512M
  id=$(airlock create --pool py -e TASK=42)
  airlock pool ls
  airlock pool rm py`,
	}
	var req api.SetPool
	var memory, disk string
	set := &cobra.Command{Use: "set NAME", Short: "Define a pool (or change it: a new spec makes its sandboxes afresh)", Args: cobra.ExactArgs(1)}
	f := set.Flags()
	f.IntVar(&req.Size, "size", 0, "sandboxes to keep ready (1-64)")
	f.StringVar(&req.Isolation, "isolation", "", cmdutil.IsolationHelp)
	f.StringVar(&req.Image, "image", "", `image: "host" (default), a rootfs directory, oci:PATH, docker-archive:PATH or a registry reference (paths under your roots)`)
	f.StringVar(&memory, "memory", "", "memory limit (e.g. 512M; default 2G)")
	f.StringVar(&disk, "disk", "", "writable space (default 1G)")
	f.Float64Var(&req.Limits.CPUs, "cpus", 0, "CPU limit (default 1)")
	f.Int64Var(&req.Limits.Pids, "pids", 0, "process limit (default 512)")
	f.StringVar(&req.Network.Mode, "net", "", `network: "none" (default) or "proxy"`)
	f.StringArrayVar(&req.Network.Allow, "allow", nil, "allowed host pattern or preset; turns on the proxy")
	f.StringArrayVar(&req.Network.Deny, "deny", nil, "denied host pattern")
	onDaemon(g, set, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		r := req
		var err error
		if r.Limits.MemoryBytes, err = cmdutil.SizeFlag("memory", memory); err != nil {
			return err
		}
		if r.Limits.DiskBytes, err = cmdutil.SizeFlag("disk", disk); err != nil {
			return err
		}
		var none string
		if err := cmdutil.HostPaths(&none, &none, &r.Image); err != nil {
			return err
		}
		if len(r.Network.Allow) > 0 && r.Network.Mode == "" {
			r.Network.Mode = "proxy"
		}
		p, err := cl.SetPool(ctx, args[0], &r)
		return k.Show(p, err, func() error {
			fmt.Fprintf(g.Stdout, "pool %s: %d sandboxes (%d ready)\n", p.Name, p.Size, p.Ready)
			return nil
		})
	})
	ls := &cobra.Command{Use: "ls", Short: "List your pools", Args: cobra.NoArgs}
	onDaemon(g, ls, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, _ []string) error {
		ps, err := cl.Pools(ctx)
		return k.Show(ps, err, func() error {
			w := tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tSIZE\tREADY\tFILLING\tISOLATION\tIMAGE\tMEMORY\tCPUS\tNETWORK\tHITS\tMISSES\tERROR")
			for _, p := range ps {
				fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%g\t%s\t%d\t%d\t%s\n", p.Name, p.Size, p.Ready, p.Filling, p.Isolation, untrusted.Quote(p.Image),
					spec.FormatSize(p.Limits.MemoryBytes), p.Limits.CPUs, p.Network.Mode, p.Hits, p.Misses, p.Error)
			}
			return w.Flush()
		})
	})
	rm := eachCmd(g, "rm NAME...", "Remove pools and destroy their ready sandboxes", func(ctx context.Context, cl *client.Client, name string) error {
		return cl.DeletePool(ctx, name)
	})
	c.AddCommand(set, ls, rm)
	return c
}
