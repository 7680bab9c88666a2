// Package admin holds the commands that administer a daemon rather than
// work in a sandbox: tenants and their quotas, roots and keys (admin key),
// a tenant's secrets, and the kill switch. They talk to the daemon
// through the Go SDK (client); the package imports api,
// internal/cli/cmdutil and internal/errdefs, nothing of the engine.
package admin

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Commands are the commands that administer a daemon.
func Commands(g *cmdutil.Globals) []*cobra.Command {
	return []*cobra.Command{tenantCmd(g), secretCmd(g), killAllCmd(g)}
}

func killAllCmd(g *cmdutil.Globals) *cobra.Command {
	var tenant string
	var all bool
	c := &cobra.Command{
		Use:   "kill-all [--tenant NAME | --all]",
		Short: "Kill switch: destroy every sandbox of a tenant (or of all tenants); returns when they are gone",
		Long: `kill-all destroys sandboxes at once and returns only when they are gone. With
a tenant's key it destroys that tenant's sandboxes; with the admin key (the
default for root on the daemon's host) it needs --tenant NAME or --all.`,
		Args: cobra.NoArgs,
	}
	k := cmdutil.AddConn(c, g, true)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if all && tenant != "" {
			return errdefs.Invalid("--all and --tenant exclude each other")
		}
		cl, err := k.Client(all || tenant != "")
		if err != nil {
			return err
		}
		ids, err := cl.KillAll(cmd.Context(), tenant)
		if err != nil {
			return cmdutil.APIErr(err)
		}
		if k.AsJSON {
			return cmdutil.PrintJSON(g.Stdout, &api.Killed{Destroyed: ids})
		}
		fmt.Fprintf(g.Stdout, "destroyed %d sandboxes\n", len(ids))
		return nil
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the tenant whose sandboxes to destroy (admin key)")
	c.Flags().BoolVar(&all, "all", false, "destroy every sandbox of every tenant (admin key)")
	return c
}

const rootHelp = "a host directory under which the tenant may name workspace, repo and image paths (repeatable; none by default); it must exist and stay apart from the daemon's own directories"

// absRoots makes the roots given on the command line absolute (the daemon
// runs on this host).
func absRoots(in []string) ([]string, error) {
	out := make([]string, 0, len(in))
	for _, r := range in {
		a, err := filepath.Abs(r)
		if err != nil || r == "" {
			return nil, errdefs.Invalid(fmt.Sprintf("--root %q: not a directory path", r))
		}
		out = append(out, a)
	}
	return out, nil
}

// quotaFlags are a tenant's quota flags (tenant create and update).
type quotaFlags struct {
	q               api.Quotas
	maxMem, maxSnap string
}

var quotaFlagNames = []string{"max-sandboxes", "max-memory", "max-cpus", "cpu-seconds", "max-snapshot-bytes", "cpu-period"}

func (qf *quotaFlags) bind(f *pflag.FlagSet) {
	f.IntVar(&qf.q.MaxSandboxes, "max-sandboxes", 0, "sandboxes at once (0: unlimited)")
	f.StringVar(&qf.maxMem, "max-memory", "", "sum of the sandboxes' memory limits (e.g. 16G)")
	f.Float64Var(&qf.q.MaxCPUs, "max-cpus", 0, "sum of the sandboxes' CPU limits")
	f.Float64Var(&qf.q.CPUSeconds, "cpu-seconds", 0, "CPU seconds per period; past it the tenant's sandboxes are stopped")
	f.StringVar(&qf.maxSnap, "max-snapshot-bytes", "", "file content of the tenant's snapshots in all (e.g. 10G)")
	f.StringVar(&qf.q.CPUPeriod, "cpu-period", "", "the CPU budget's period (default 1h)")
}

func (qf *quotaFlags) quotas() (api.Quotas, error) {
	q := qf.q
	var err error
	if q.MaxMemory, err = cmdutil.SizeFlag("max-memory", qf.maxMem); err != nil {
		return q, err
	}
	q.MaxSnapshotBytes, err = cmdutil.SizeFlag("max-snapshot-bytes", qf.maxSnap)
	return q, err
}

// isolationHelp is --isolation's on tenant create and update.
const isolationHelp = `the wall the tenant's sandboxes are held to at least: container (any wall) or gvisor (a create asking for less is refused, and audited as sandbox.refused)`

func tenantCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{Use: "tenant", Short: "Manage tenants (admin key)"}
	var cq quotaFlags
	var scanPolicy, cIsolation string
	var cRoots []string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Add a tenant and print its API key (shown once; stored hashed)",
		Args:  cobra.ExactArgs(1),
	}
	ck := cmdutil.AddConn(create, g, true)
	create.RunE = func(cmd *cobra.Command, args []string) error {
		q, err := cq.quotas()
		if err != nil {
			return err
		}
		cl, err := ck.Client(true)
		if err != nil {
			return err
		}
		roots, err := absRoots(cRoots)
		if err != nil {
			return err
		}
		t, err := cl.CreateTenant(cmd.Context(), &api.CreateTenant{Name: args[0], Quotas: q, ScanPolicy: scanPolicy, Roots: roots, Isolation: cIsolation})
		return ck.Show(t, err, func() error {
			fmt.Fprintln(g.Stdout, t.Key)
			fmt.Fprintf(g.Stderr, "airlock: tenant %s created; the key above is shown only this once\n", t.Name)
			return nil
		})
	}
	f := create.Flags()
	cq.bind(f)
	f.StringVar(&scanPolicy, "scan-policy", "block", "what a credential found in a call does: block (the call fails, naming the rule), redact, or record")
	f.StringArrayVar(&cRoots, "root", nil, rootHelp)
	f.StringVar(&cIsolation, "isolation", "container", isolationHelp)

	ls := &cobra.Command{Use: "ls", Short: "List tenants", Args: cobra.NoArgs}
	lk := cmdutil.AddConn(ls, g, true)
	ls.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := lk.Client(true)
		if err != nil {
			return err
		}
		ts, err := cl.Tenants(cmd.Context())
		return lk.Show(ts, err, func() error {
			w := tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tID\tSANDBOXES\tCPU-SECONDS\tSCAN\tISOLATION\tCREATED\tROOTS")
			for _, t := range ts {
				roots := strings.Join(t.Roots, ",")
				if roots == "" {
					roots = "-"
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%.1f\t%s\t%s\t%s\t%s\n", t.Name, t.ID, t.Sandboxes, t.CPUSeconds, t.ScanPolicy, t.Isolation, t.Created.Format(time.RFC3339), roots)
			}
			return w.Flush()
		})
	}
	var uq quotaFlags
	var uScan, uIsolation string
	var uRoots []string
	var noRoots bool
	update := &cobra.Command{
		Use:   "update NAME",
		Short: "Change a tenant's scan policy, isolation hold, quotas or host roots (quota flags given replace the whole set, --root flags all roots)",
		Args:  cobra.ExactArgs(1),
	}
	uk := cmdutil.AddConn(update, g, true)
	update.RunE = func(cmd *cobra.Command, args []string) error {
		req := api.UpdateTenant{ScanPolicy: uScan, Isolation: uIsolation}
		if slices.ContainsFunc(quotaFlagNames, cmd.Flags().Changed) {
			q, err := uq.quotas()
			if err != nil {
				return err
			}
			req.Quotas = &q
		}
		switch {
		case noRoots && len(uRoots) > 0:
			return errdefs.Invalid("--root and --no-roots exclude each other")
		case noRoots:
			req.Roots = &[]string{}
		case len(uRoots) > 0:
			roots, err := absRoots(uRoots)
			if err != nil {
				return err
			}
			req.Roots = &roots
		}
		if req.Quotas == nil && req.ScanPolicy == "" && req.Roots == nil && req.Isolation == "" {
			return errdefs.Invalid("nothing to change: give --scan-policy, --isolation, quota flags, --root or --no-roots")
		}
		cl, err := uk.Client(true)
		if err != nil {
			return err
		}
		t, err := cl.UpdateTenant(cmd.Context(), args[0], &req)
		return uk.Show(t, err, func() error {
			fmt.Fprintf(g.Stderr, "airlock: tenant %s updated (scan policy %s, isolation %s)\n", t.Name, t.ScanPolicy, t.Isolation)
			return nil
		})
	}
	uf := update.Flags()
	uf.StringVar(&uScan, "scan-policy", "", "block, redact or record")
	uf.StringVar(&uIsolation, "isolation", "", isolationHelp+"; container lifts a hold")
	uf.StringArrayVar(&uRoots, "root", nil, rootHelp+" (replaces the tenant's roots)")
	uf.BoolVar(&noRoots, "no-roots", false, "take every host root from the tenant")
	uq.bind(uf)
	rm := &cobra.Command{Use: "rm NAME", Short: "Destroy a tenant's sandboxes and remove it", Args: cobra.ExactArgs(1)}
	rk := cmdutil.AddConn(rm, g, true)
	rm.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := rk.Client(true)
		if err != nil {
			return err
		}
		err = cl.DeleteTenant(cmd.Context(), args[0])
		return rk.Show(map[string]any{"name": args[0], "removed": true}, err, func() error { return nil })
	}
	e2b := &cobra.Command{
		Use:   "e2b-key NAME",
		Short: "Give a tenant a new E2B-shaped key (e2b_<hex>, for E2B's Python SDK) and print it (shown once; the previous one stops working)",
		Args:  cobra.ExactArgs(1),
	}
	ek := cmdutil.AddConn(e2b, g, true)
	e2b.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := ek.Client(true)
		if err != nil {
			return err
		}
		k, err := cl.TenantE2BKey(cmd.Context(), args[0])
		return ek.Show(k, err, func() error {
			fmt.Fprintln(g.Stdout, k.Key)
			fmt.Fprintf(g.Stderr, "airlock: tenant %s's E2B key; shown only this once (docs/e2b.md)\n", k.Tenant)
			return nil
		})
	}
	c.AddCommand(create, ls, update, rm, e2b)
	return c
}
