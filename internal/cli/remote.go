package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// conn are the flags of every command that talks to the daemon.
type conn struct {
	g       *globals
	address string
	key     string
	keyFile string
	asJSON  bool
}

func addConn(c *cobra.Command, g *globals, jsonFlag bool) *conn {
	k := &conn{g: g}
	c.Flags().StringVar(&k.address, "address", "", "daemon address: a unix socket path or https://host:port (default $AIRLOCK_ADDRESS, or "+api.DefaultSocket+")")
	c.Flags().StringVar(&k.keyFile, "key-file", "", "file holding the API key (default $AIRLOCK_API_KEY; for admin commands, the daemon's admin key file)")
	if jsonFlag {
		c.Flags().BoolVar(&k.asJSON, "json", false, "print JSON")
	}
	return k
}

// client connects with the first key found: --key-file, $AIRLOCK_API_KEY,
// and for admin commands the daemon's admin key file.
func (k *conn) client(admin bool) (*client.Client, error) {
	addr := k.address
	if addr == "" {
		addr = os.Getenv("AIRLOCK_ADDRESS")
	}
	key := os.Getenv("AIRLOCK_API_KEY")
	file := k.keyFile
	if file == "" && (admin || key == "") {
		if _, err := os.Stat(k.g.adminKeyPath()); err == nil && (admin || key == "") {
			file = k.g.adminKeyPath()
		}
	}
	if file != "" && (k.keyFile != "" || admin || key == "") {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, errdefs.Invalid("API key: " + err.Error())
		}
		key = strings.TrimSpace(string(b))
	}
	return client.New(client.Config{Address: addr, Key: key})
}

// apiErr turns a daemon error into the CLI's error classes (exit codes).
func apiErr(err error) error {
	var ae *api.Error
	if !errors.As(err, &ae) {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
			return errdefs.Unavailable("the daemon is not running (start it with: sudo airlock serve): " + err.Error())
		}
		return err
	}
	class := map[api.Code]error{
		api.CodeInvalidArgument: errdefs.ErrInvalidArgument, api.CodeNotFound: errdefs.ErrNotFound,
		api.CodeQuotaExceeded: errdefs.ErrResourceExhausted, api.CodeUnavailable: errdefs.ErrUnavailable,
	}[ae.Code]
	if class == nil {
		return errors.New(ae.Message + " (" + string(ae.Code) + ")")
	}
	return errdefs.New(class, ae.Message)
}

func kvMap(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, errdefs.Invalid(fmt.Sprintf("%s %q: want KEY=VALUE", flag, kv))
		}
		m[k] = v
	}
	return m, nil
}

func sizeFlag(name, v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := spec.ParseSize(v)
	if err != nil {
		return 0, errdefs.Invalid("--" + name + ": " + err.Error())
	}
	return n, nil
}

func createCmd(g *globals) *cobra.Command {
	var sf sandboxFlags
	req := &sf.req // what only create sets is written straight into it
	var meta, inputs []string
	c := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a long-lived sandbox in the daemon and print its id",
		Long: `create asks the daemon (airlock serve) for a sandbox that lives until it is
removed, its TTL passes, or it sits idle too long. Run commands in it with
exec, move files with cp, cat and write, and see what changed with diff.

  id=$(airlock create --workspace "$PWD" --ttl 2h --idle-timeout 15m)
  airlock exec "$id" -- make test
  airlock rm "$id"

A grant lets the sandbox use one of your secrets (airlock secret add) at one
host without ever holding it: the sandbox gets a placeholder in a variable,
and the egress proxy, which terminates TLS for that host alone (with a CA of
the sandbox's own, in its trust store and SSL_CERT_FILE), puts the real value
in the header only on requests the grant's rules cover:

  airlock create --repo ~/src/shop \
    --grant 'git-ro@github.com GET:/acme/shop.git/info/refs?service=git-upload-pack POST:/acme/shop.git/git-upload-pack scheme=basic env=GIT_TOKEN'
  airlock exec "$id" -- sh -c 'git fetch "https://x:$GIT_TOKEN@github.com/acme/shop.git"'`,
		Args: cobra.NoArgs,
	}
	k := addConn(c, g, true)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		var err error
		if req.Metadata, err = kvMap("--meta", meta); err != nil {
			return err
		}
		if req.Trigger.Inputs, err = kvMap("--input", inputs); err != nil {
			return err
		}
		spec, err := sf.spec()
		if err != nil {
			return err
		}
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		sb, err := cl.CreateSandbox(cmd.Context(), spec)
		if err != nil {
			return apiErr(err)
		}
		if k.asJSON {
			return printJSON(g.stdout, sb)
		}
		fmt.Fprintln(g.stdout, sb.ID)
		return nil
	}
	f := c.Flags()
	sf.bind(f)
	f.StringVar(&req.Network.Mode, "net", "", `network: "none" (default) or "proxy" (only --allow'ed hosts, through airlock's proxy)`)
	f.StringVar(&req.TTL, "ttl", "", "lifetime (Go duration; default 1h, at most 168h)")
	f.StringVar(&req.IdleTimeout, "idle-timeout", "", "end the sandbox after this long without a call on it (default: never)")
	f.StringArrayVar(&meta, "meta", nil, "metadata KEY=VALUE (repeatable)")
	f.StringVar(&req.Trigger.TaskID, "task-id", "", "trigger record: the task this sandbox serves")
	f.StringVar(&req.Trigger.PromptDigest, "prompt-digest", "", "trigger record: digest of the prompt")
	f.StringArrayVar(&inputs, "input", nil, "trigger record: input KEY=VALUE (repeatable)")
	f.StringArrayVar(&req.AllowDegraded, "allow-degraded", nil, "run without a degradable control (landlock) on a host that lacks it")
	return c
}

func psCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "ps [SANDBOX]",
		Short: "List your sandboxes, or the running commands of one",
		Args:  cobra.MaximumNArgs(1),
	}
	k := addConn(c, g, true)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		if len(args) == 1 {
			ps, err := cl.Processes(cmd.Context(), args[0])
			if err != nil {
				return apiErr(err)
			}
			if k.asJSON {
				return printJSON(g.stdout, ps)
			}
			w := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PID\tTAG\tCOMMAND")
			for _, p := range ps {
				// What the agent reports is the sandbox's word: quoted.
				argv := make([]string, len(p.Cmd))
				for i, a := range p.Cmd {
					argv[i] = untrusted.Quote(a)
				}
				fmt.Fprintf(w, "%d\t%s\t%s\n", p.PID, untrusted.Quote(p.Tag), strings.Join(argv, " "))
			}
			return w.Flush()
		}
		sbs, err := cl.Sandboxes(cmd.Context())
		if err != nil {
			return apiErr(err)
		}
		if k.asJSON {
			return printJSON(g.stdout, sbs)
		}
		w := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tTENANT\tSTATE\tIMAGE\tCREATED\tEXPIRES")
		for _, s := range sbs {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Tenant, s.State, s.Image, s.Created.Format(time.RFC3339), time.Until(s.Expires).Round(time.Second))
		}
		return w.Flush()
	}
	return c
}

func execCmd(g *globals) *cobra.Command {
	var req api.Exec
	var env []string
	var interactive, tty bool
	c := &cobra.Command{
		Use:   "exec [flags] SANDBOX -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox; exits with its exit code",
		Long: `exec runs one command in a long-lived sandbox and streams its output. The
exit code is the command's (124 on --timeout). -i passes this terminal's
stdin; -t gives the command a terminal; -d leaves it running in the
background and prints its pid (see ps, attach and signal).`,
		Args: cobra.MinimumNArgs(2),
	}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		id := args[0]
		req.Cmd = args[1:]
		if req.Cmd[0] == "--" {
			req.Cmd = req.Cmd[1:]
		}
		if len(req.Cmd) == 0 {
			return errdefs.Invalid("no command given: airlock exec SANDBOX -- COMMAND [ARG...]")
		}
		var err error
		if req.Env, err = kvMap("-e", env); err != nil {
			return err
		}
		stdinFD := int(os.Stdin.Fd())
		if tty {
			if !term.IsTerminal(stdinFD) {
				return errdefs.Invalid("-t needs a terminal on stdin")
			}
			cols, rows, err := term.GetSize(stdinFD)
			if err != nil {
				return err
			}
			req.TTY = &api.TTY{Rows: uint16(rows), Cols: uint16(cols)}
			interactive = true
		}
		req.KeepStdin = interactive && !tty
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), unix.SIGINT, unix.SIGTERM)
		defer stop()
		s, err := cl.ExecStream(ctx, id, &req)
		if err != nil {
			return apiErr(err)
		}
		defer s.Close()
		first, err := s.Next()
		if err != nil {
			return err
		}
		if first.End != nil { // it could not start
			fmt.Fprintf(g.stderr, "airlock: %s\n", first.End.Error)
			return exitError{first.End.ExitCode}
		}
		if req.Background {
			fmt.Fprintln(g.stdout, first.PID)
			return nil
		}
		if interactive {
			if tty {
				old, err := term.MakeRaw(stdinFD)
				if err != nil {
					return err
				}
				defer func() { _ = term.Restore(stdinFD, old) }()
				winch := make(chan os.Signal, 1)
				signal.Notify(winch, unix.SIGWINCH)
				defer signal.Stop(winch)
				go func() {
					for range winch {
						if cols, rows, err := term.GetSize(stdinFD); err == nil {
							_ = cl.Resize(ctx, id, first.PID, uint16(rows), uint16(cols))
						}
					}
				}()
			}
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := os.Stdin.Read(buf)
					if n > 0 {
						if cl.Input(ctx, id, first.PID, append([]byte(nil), buf[:n]...), false) != nil {
							return
						}
					}
					if err != nil {
						if !tty {
							_ = cl.Input(ctx, id, first.PID, nil, true)
						}
						return
					}
				}
			}()
		}
		end, err := client.Drain(s, g.stdout, g.stderr)
		if err != nil {
			if ctx.Err() != nil {
				return exitError{130}
			}
			return err
		}
		if end.SandboxEnded {
			fmt.Fprintf(g.stderr, "airlock: the sandbox ended: %s\n", end.EndReason)
		} else if end.TimedOut {
			fmt.Fprintf(g.stderr, "airlock: %s\n", end.Status)
		} else if end.Error != "" {
			fmt.Fprintf(g.stderr, "airlock: %s\n", end.Error)
		}
		if end.ExitCode != 0 {
			return exitError{end.ExitCode}
		}
		return nil
	}
	f := c.Flags()
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&req.Cwd, "cwd", "", "working directory (default /workspace)")
	f.StringVarP(&req.User, "user", "u", "", `"user" (default, uid 1000) or "root" (root inside, a small capability set)`)
	f.StringVar(&req.Timeout, "timeout", "", "kill the command after this long (Go duration)")
	f.BoolVarP(&interactive, "interactive", "i", false, "pass stdin to the command")
	f.BoolVarP(&tty, "tty", "t", false, "give the command a terminal")
	f.BoolVarP(&req.Background, "detach", "d", false, "start in the background and print the pid")
	f.StringVar(&req.Tag, "tag", "", "a name for the process (background commands)")
	c.Flags().SetInterspersed(false)
	return c
}

func attachCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "attach SANDBOX PID",
		Short: "Stream a background command's output until it ends",
		Args:  cobra.ExactArgs(2),
	}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		pid, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil {
			return errdefs.Invalid("PID: " + err.Error())
		}
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		s, err := cl.Attach(cmd.Context(), args[0], uint32(pid))
		if err != nil {
			return apiErr(err)
		}
		defer s.Close()
		end, err := client.Drain(s, g.stdout, g.stderr)
		if err != nil {
			return err
		}
		if end.ExitCode != 0 {
			return exitError{end.ExitCode}
		}
		return nil
	}
	return c
}

func signalCmd(g *globals) *cobra.Command {
	var sig string
	c := &cobra.Command{
		Use:   "signal [--signal TERM|KILL] SANDBOX PID",
		Short: "Send a signal to a command's process group in a sandbox",
		Args:  cobra.ExactArgs(2),
	}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		pid, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil {
			return errdefs.Invalid("PID: " + err.Error())
		}
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		return apiErr(cl.Signal(cmd.Context(), args[0], uint32(pid), sig))
	}
	c.Flags().StringVarP(&sig, "signal", "s", "TERM", "TERM or KILL")
	return c
}

func catCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "cat SANDBOX PATH",
		Short: "Print a file of a sandbox",
		Args:  cobra.ExactArgs(2),
	}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		b, err := cl.ReadFile(cmd.Context(), args[0], args[1])
		if err != nil {
			return apiErr(err)
		}
		_, err = g.stdout.Write(b)
		return err
	}
	return c
}

func writeCmd(g *globals) *cobra.Command {
	var mode string
	c := &cobra.Command{
		Use:   "write SANDBOX PATH < DATA",
		Short: "Write stdin to a file of a sandbox (replacing it)",
		Args:  cobra.ExactArgs(2),
	}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m > 0o777 {
			return errdefs.Invalid("--mode: want octal permissions such as 644")
		}
		data, err := io.ReadAll(io.LimitReader(os.Stdin, 64<<20+1))
		if err != nil {
			return err
		}
		if len(data) > 64<<20 {
			return errdefs.Invalid("write takes at most 64 MiB: use cp for more")
		}
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		return apiErr(cl.WriteFile(cmd.Context(), args[0], args[1], data, os.FileMode(m)))
	}
	c.Flags().StringVar(&mode, "mode", "644", "permissions of a new file (octal)")
	return c
}

func editCmd(g *globals) *cobra.Command {
	var old, new string
	c := &cobra.Command{
		Use:   "edit SANDBOX PATH --old TEXT --new TEXT",
		Short: "Replace one exact, unique occurrence of a text in a file of a sandbox",
		Args:  cobra.ExactArgs(2),
	}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		return apiErr(cl.Edit(cmd.Context(), args[0], args[1], old, new))
	}
	c.Flags().StringVar(&old, "old", "", "the text to replace (must occur exactly once)")
	c.Flags().StringVar(&new, "new", "", "its replacement")
	return c
}

func lsCmd(g *globals) *cobra.Command {
	var depth int
	c := &cobra.Command{
		Use:   "ls SANDBOX [PATH]",
		Short: "List a directory of a sandbox (default /workspace)",
		Args:  cobra.RangeArgs(1, 2),
	}
	k := addConn(c, g, true)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		p := "/workspace"
		if len(args) == 2 {
			p = args[1]
		}
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		es, err := cl.ListDir(cmd.Context(), args[0], p, depth)
		if err != nil {
			return apiErr(err)
		}
		if k.asJSON {
			return printJSON(g.stdout, es)
		}
		sort.Slice(es, func(i, j int) bool { return es[i].Path < es[j].Path })
		w := tabwriter.NewWriter(g.stdout, 2, 4, 1, ' ', tabwriter.AlignRight)
		for _, e := range es {
			// Names, owners and targets are the sandbox's: quoted.
			name := untrusted.Quote(e.Path)
			if e.Target != "" {
				name += " -> " + untrusted.Quote(e.Target)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t %s\t %s\n", untrusted.Quote(e.Mode), untrusted.Quote(e.Owner), untrusted.Quote(e.Group), e.Size, e.Modified.Format("Jan _2 15:04"), name)
		}
		return w.Flush()
	}
	c.Flags().IntVar(&depth, "depth", 1, "levels to descend (1: the directory's entries)")
	return c
}

func diffCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "diff SANDBOX",
		Short: "Print the unified diff of a sandbox's /workspace since it was created",
		Args:  cobra.ExactArgs(1),
	}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		d, err := cl.Diff(cmd.Context(), args[0])
		if err != nil {
			return apiErr(err)
		}
		_, err = io.WriteString(forTerminal(g.stdout), d)
		return err
	}
	return c
}

func lifecycleCmd(g *globals, use, short string, do func(ctx context.Context, cl *client.Client, id string) error) *cobra.Command {
	c := &cobra.Command{Use: use + " SANDBOX...", Short: short, Args: cobra.MinimumNArgs(1)}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		var errs []error
		for _, id := range args {
			if err := do(cmd.Context(), cl, id); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, apiErr(err)))
			}
		}
		return errors.Join(errs...)
	}
	return c
}

func extendCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "extend SANDBOX TTL", Short: "Set a sandbox's expiry to TTL (a Go duration) from now", Args: cobra.ExactArgs(2)}
	k := addConn(c, g, false)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := k.client(false)
		if err != nil {
			return err
		}
		sb, err := cl.Extend(cmd.Context(), args[0], args[1])
		if err != nil {
			return apiErr(err)
		}
		fmt.Fprintf(g.stdout, "%s expires %s\n", sb.ID, sb.Expires.Format(time.RFC3339))
		return nil
	}
	return c
}

func killAllCmd(g *globals) *cobra.Command {
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
	k := addConn(c, g, true)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if all && tenant != "" {
			return errdefs.Invalid("--all and --tenant exclude each other")
		}
		cl, err := k.client(all || tenant != "")
		if err != nil {
			return err
		}
		ids, err := cl.KillAll(cmd.Context(), tenant)
		if err != nil {
			return apiErr(err)
		}
		if k.asJSON {
			return printJSON(g.stdout, &api.Killed{Destroyed: ids})
		}
		fmt.Fprintf(g.stdout, "destroyed %d sandboxes\n", len(ids))
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
	if q.MaxMemory, err = sizeFlag("max-memory", qf.maxMem); err != nil {
		return q, err
	}
	q.MaxSnapshotBytes, err = sizeFlag("max-snapshot-bytes", qf.maxSnap)
	return q, err
}

func tenantCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "tenant", Short: "Manage tenants (admin key)"}
	var cq quotaFlags
	var scanPolicy string
	var cRoots []string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Add a tenant and print its API key (shown once; stored hashed)",
		Args:  cobra.ExactArgs(1),
	}
	ck := addConn(create, g, true)
	create.RunE = func(cmd *cobra.Command, args []string) error {
		q, err := cq.quotas()
		if err != nil {
			return err
		}
		cl, err := ck.client(true)
		if err != nil {
			return err
		}
		roots, err := absRoots(cRoots)
		if err != nil {
			return err
		}
		t, err := cl.CreateTenant(cmd.Context(), &api.CreateTenant{Name: args[0], Quotas: q, ScanPolicy: scanPolicy, Roots: roots})
		if err != nil {
			return apiErr(err)
		}
		if ck.asJSON {
			return printJSON(g.stdout, t)
		}
		fmt.Fprintln(g.stdout, t.Key)
		fmt.Fprintf(g.stderr, "airlock: tenant %s created; the key above is shown only this once\n", t.Name)
		return nil
	}
	f := create.Flags()
	cq.bind(f)
	f.StringVar(&scanPolicy, "scan-policy", "block", "what a credential found in a call does: block (the call fails, naming the rule), redact, or record")
	f.StringArrayVar(&cRoots, "root", nil, rootHelp)

	ls := &cobra.Command{Use: "ls", Short: "List tenants", Args: cobra.NoArgs}
	lk := addConn(ls, g, true)
	ls.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := lk.client(true)
		if err != nil {
			return err
		}
		ts, err := cl.Tenants(cmd.Context())
		if err != nil {
			return apiErr(err)
		}
		if lk.asJSON {
			return printJSON(g.stdout, ts)
		}
		w := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAME\tID\tSANDBOXES\tCPU-SECONDS\tSCAN\tCREATED\tROOTS")
		for _, t := range ts {
			roots := strings.Join(t.Roots, ",")
			if roots == "" {
				roots = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%.1f\t%s\t%s\t%s\n", t.Name, t.ID, t.Sandboxes, t.CPUSeconds, t.ScanPolicy, t.Created.Format(time.RFC3339), roots)
		}
		return w.Flush()
	}
	var uq quotaFlags
	var uScan string
	var uRoots []string
	var noRoots bool
	update := &cobra.Command{
		Use:   "update NAME",
		Short: "Change a tenant's scan policy, quotas or host roots (quota flags given replace the whole set, --root flags all roots)",
		Args:  cobra.ExactArgs(1),
	}
	uk := addConn(update, g, true)
	update.RunE = func(cmd *cobra.Command, args []string) error {
		req := api.UpdateTenant{ScanPolicy: uScan}
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
		if req.Quotas == nil && req.ScanPolicy == "" && req.Roots == nil {
			return errdefs.Invalid("nothing to change: give --scan-policy, quota flags, --root or --no-roots")
		}
		cl, err := uk.client(true)
		if err != nil {
			return err
		}
		t, err := cl.UpdateTenant(cmd.Context(), args[0], &req)
		if err != nil {
			return apiErr(err)
		}
		if uk.asJSON {
			return printJSON(g.stdout, t)
		}
		fmt.Fprintf(g.stderr, "airlock: tenant %s updated (scan policy %s)\n", t.Name, t.ScanPolicy)
		return nil
	}
	uf := update.Flags()
	uf.StringVar(&uScan, "scan-policy", "", "block, redact or record")
	uf.StringArrayVar(&uRoots, "root", nil, rootHelp+" (replaces the tenant's roots)")
	uf.BoolVar(&noRoots, "no-roots", false, "take every host root from the tenant")
	uq.bind(uf)
	rm := &cobra.Command{Use: "rm NAME", Short: "Destroy a tenant's sandboxes and remove it", Args: cobra.ExactArgs(1)}
	rk := addConn(rm, g, false)
	rm.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := rk.client(true)
		if err != nil {
			return err
		}
		return apiErr(cl.DeleteTenant(cmd.Context(), args[0]))
	}
	c.AddCommand(create, ls, update, rm)
	return c
}

func snapshotCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "snapshot",
		Short: "Save sandboxes' filesystem state as images; list and delete them",
		Long: `A snapshot saves a sandbox's filesystem state (on the frozen sandbox): for an
OCI or directory image, the whole root with the sandbox's changes; and its
/workspace. New sandboxes start from it with --image snapshot:ID.

  snap=$(airlock snapshot create "$id" --name deps-installed)
  airlock create --image "snapshot:$snap"`,
	}
	var name string
	create := &cobra.Command{Use: "create SANDBOX", Short: "Save a sandbox's filesystem state and print the snapshot's id", Args: cobra.ExactArgs(1)}
	ck := addConn(create, g, true)
	create.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := ck.client(false)
		if err != nil {
			return err
		}
		sn, err := cl.Snapshot(cmd.Context(), args[0], name)
		if err != nil {
			return apiErr(err)
		}
		for _, s := range sn.Skipped {
			g.warn("snapshot: skipped " + untrusted.Quote(s) + " (not a file, directory or symlink)")
		}
		if ck.asJSON {
			return printJSON(g.stdout, sn)
		}
		fmt.Fprintln(g.stdout, sn.ID)
		return nil
	}
	create.Flags().StringVar(&name, "name", "", "a name to remember it by")
	ls := &cobra.Command{Use: "ls", Short: "List your snapshots", Args: cobra.NoArgs}
	lk := addConn(ls, g, true)
	ls.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := lk.client(false)
		if err != nil {
			return err
		}
		sns, err := cl.Snapshots(cmd.Context())
		if err != nil {
			return apiErr(err)
		}
		if lk.asJSON {
			return printJSON(g.stdout, sns)
		}
		w := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tSANDBOX\tBASE\tSIZE\tCREATED")
		for _, s := range sns {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Name, s.Sandbox, s.Base, spec.FormatSize(s.Bytes), s.Created.Format(time.RFC3339))
		}
		return w.Flush()
	}
	rm := &cobra.Command{Use: "rm SNAPSHOT...", Short: "Delete snapshots (refused while a sandbox runs from one)", Args: cobra.MinimumNArgs(1)}
	rk := addConn(rm, g, false)
	rm.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := rk.client(false)
		if err != nil {
			return err
		}
		var errs []error
		for _, id := range args {
			if err := cl.DeleteSnapshot(cmd.Context(), id); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, apiErr(err)))
			}
		}
		return errors.Join(errs...)
	}
	c.AddCommand(create, ls, rm)
	return c
}

// remoteCmds are the commands that talk to the daemon.
func remoteCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{
		serveCmd(g), mcpCmd(g), tenantCmd(g), secretCmd(g), createCmd(g), psCmd(g), execCmd(g), attachCmd(g), signalCmd(g),
		catCmd(g), writeCmd(g), editCmd(g), lsCmd(g), cpCmd(g), diffCmd(g), snapshotCmd(g),
		lifecycleCmd(g, "rm", "Destroy sandboxes (returns when they are gone)", func(ctx context.Context, cl *client.Client, id string) error { return cl.Destroy(ctx, id) }),
		lifecycleCmd(g, "pause", "Freeze every process of sandboxes", func(ctx context.Context, cl *client.Client, id string) error {
			_, err := cl.Pause(ctx, id)
			return err
		}),
		lifecycleCmd(g, "resume", "Thaw paused sandboxes", func(ctx context.Context, cl *client.Client, id string) error {
			_, err := cl.Resume(ctx, id)
			return err
		}),
		extendCmd(g), killAllCmd(g), auditCmd(g),
	}
}
