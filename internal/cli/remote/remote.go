// Package remote holds the commands that work on a daemon's sandboxes
// through the Go SDK (client): create, ps, exec, attach, signal, cat,
// write, edit, ls, cp, diff, rm, pause, resume, extend, snapshot, logs,
// inspect, stats, port and port-forward. It imports api, client, internal/cli/cmdutil,
// internal/spec, internal/errdefs, internal/progress and
// internal/untrusted, nothing of the engine.
package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/progress"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// onDaemon makes c a command on the daemon's sandboxes: it adds the
// connection flags (and --json when jsonFlag) and runs run with a client.
func onDaemon(g *cmdutil.Globals, c *cobra.Command, jsonFlag bool, run func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error) *cobra.Command {
	k := cmdutil.AddConn(c, g, jsonFlag)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := k.Client(false)
		if err != nil {
			return err
		}
		return run(cmd.Context(), cl, k, args)
	}
	return c
}

// Commands are the commands that work on a daemon's sandboxes.
func Commands(g *cmdutil.Globals) []*cobra.Command {
	return []*cobra.Command{
		createCmd(g), psCmd(g), inspectCmd(g), statsCmd(g), execCmd(g), attachCmd(g), logsCmd(g), signalCmd(g),
		catCmd(g), writeCmd(g), editCmd(g), lsCmd(g), cpCmd(g), diffCmd(g), snapshotCmd(g), forkCmd(g), poolCmd(g),
		eachCmd(g, "rm SANDBOX...", "Destroy sandboxes (returns when they are gone)", func(ctx context.Context, cl *client.Client, id string) error { return cl.Destroy(ctx, id) }),
		eachCmd(g, "pause SANDBOX...", "Freeze every process of sandboxes", func(ctx context.Context, cl *client.Client, id string) error {
			_, err := cl.Pause(ctx, id)
			return err
		}),
		eachCmd(g, "resume SANDBOX...", "Thaw paused sandboxes", func(ctx context.Context, cl *client.Client, id string) error {
			_, err := cl.Resume(ctx, id)
			return err
		}),
		extendCmd(g), portCmd(g), portForwardCmd(g),
	}
}

func createCmd(g *cmdutil.Globals) *cobra.Command {
	var sf cmdutil.SandboxFlags
	req := &sf.Req // what only create sets is written straight into it
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
	f := c.Flags()
	sf.Bind(f)
	f.StringVar(&req.Network.Mode, "net", "", `network: "none" (default) or "proxy" (only --allow'ed hosts, through airlock's proxy)`)
	f.StringVar(&req.TTL, "ttl", "", "lifetime (Go duration; default 1h, at most 168h)")
	f.StringVar(&req.IdleTimeout, "idle-timeout", "", "end the sandbox after this long without a call on it (default: never)")
	f.StringArrayVar(&meta, "meta", nil, "metadata KEY=VALUE (repeatable)")
	f.StringVar(&req.Trigger.TaskID, "task-id", "", "trigger record: the task this sandbox serves")
	f.StringVar(&req.Trigger.PromptDigest, "prompt-digest", "", "trigger record: digest of the prompt")
	f.StringArrayVar(&inputs, "input", nil, "trigger record: input KEY=VALUE (repeatable)")
	f.StringArrayVar(&req.AllowDegraded, "allow-degraded", nil, "run without a degradable control (landlock) on a host that lacks it")
	f.StringVar(&req.Pool, "pool", "", "take a sandbox made ahead in this pool of yours (airlock pool); a create whose spec cannot be given to one is made afresh")
	f.BoolVar(&req.PoolOnly, "pool-only", false, "with --pool: fail rather than make a sandbox afresh when the pool has none ready")
	f.StringVar(&req.ExternalID, "external-id", "", "your own id for the sandbox (A-Za-z0-9._:/-, at most 128): if one of your sandboxes has it, print that one's id and make nothing")
	return onDaemon(g, c, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, _ []string) error {
		var err error
		if req.Metadata, err = cmdutil.KVMap("--meta", meta); err != nil {
			return err
		}
		if req.Trigger.Inputs, err = cmdutil.KVMap("--input", inputs); err != nil {
			return err
		}
		spec, err := sf.Spec()
		if err != nil {
			return err
		}
		// The image's pull and unpack, as the daemon reports them, draw on
		// stderr; they are erased before the id is printed.
		pctx, clearProgress := g.Progress(ctx, k.AsJSON)
		var sb *api.Sandbox
		if progress.Enabled(pctx) {
			sb, err = cl.CreateSandboxProgress(ctx, spec, relay(pctx))
		} else {
			sb, err = cl.CreateSandbox(ctx, spec)
		}
		clearProgress()
		return k.Show(sb, err, func() error {
			fmt.Fprintln(g.Stdout, sb.ID)
			return nil
		})
	})
}

// relay draws the daemon's reports of long work on the sink of ctx
// (Globals.Progress).
func relay(ctx context.Context) func(*api.Progress) {
	return func(p *api.Progress) {
		progress.Report(ctx, progress.Event{Op: p.Op, Subject: p.Subject, Message: p.Message, Stays: p.Stays, Layer: p.Layer, Layers: p.Layers, Bytes: p.Bytes, Total: p.Total, Done: p.Done})
	}
}

func psCmd(g *cmdutil.Globals) *cobra.Command {
	var filter api.ListSandboxes
	c := &cobra.Command{
		Use:   "ps [SANDBOX]",
		Short: "List your sandboxes, or the running commands of one",
		Args:  cobra.MaximumNArgs(1),
	}
	c.Flags().BoolVar(&filter.All, "all", false, "every tenant's sandboxes (admin key)")
	c.Flags().StringVar(&filter.ExternalID, "external-id", "", "only the sandboxes of this external id (an ended one still on record too)")
	return onDaemon(g, c, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		if len(args) == 1 && (filter.All || filter.ExternalID != "") {
			return errdefs.Invalid("--all and --external-id list sandboxes: give no SANDBOX")
		}
		if len(args) == 1 {
			ps, err := cl.Processes(ctx, args[0])
			return k.Show(ps, err, func() error {
				w := tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
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
			})
		}
		sbs, err := cl.ListSandboxes(ctx, filter)
		return k.Show(sbs, err, func() error {
			w := tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tTENANT\tSTATE\tIMAGE\tCREATED\tEXPIRES")
			for _, s := range sbs {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Tenant, s.State, s.Image, s.Created.Format(time.RFC3339), time.Until(s.Expires).Round(time.Second))
			}
			return w.Flush()
		})
	})
}

func execCmd(g *cmdutil.Globals) *cobra.Command {
	var req api.Exec
	var env []string
	var interactive, tty bool
	c := &cobra.Command{
		Use:   "exec [flags] SANDBOX -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox; exits with its exit code",
		Long: `exec runs one command in a long-lived sandbox and streams its output. The
exit code is the command's (124 on --timeout). -i passes this terminal's
stdin; -t gives the command a terminal; -d leaves it running in the
background and prints its pid (see ps, attach, logs and signal).

--json prints, after the command's output, one JSON object on stdout:
sandbox_id, pid, exec_id (its id in the audit log), exit_code, status,
and when they apply error, timed_out, sandbox_ended and end_reason, and
duration_ms; with -d, sandbox_id, pid and exec_id.`,
		Args: cobra.MinimumNArgs(2),
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
	return onDaemon(g, cmdutil.Relays(c), true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		id := args[0]
		req.Cmd = args[1:]
		if flag := cmdutil.MisplacedFlag(c.Flags(), req.Cmd[0]); flag != "" {
			return errdefs.Invalid(fmt.Sprintf("%s comes after the sandbox id, where the command starts: put exec's flags before the id (airlock exec %s ... %s -- COMMAND), or write -- before a command named %s", flag, flag, id, flag))
		}
		if req.Cmd[0] == "--" {
			req.Cmd = req.Cmd[1:]
		}
		if len(req.Cmd) == 0 {
			return errdefs.Invalid("no command given: airlock exec SANDBOX -- COMMAND [ARG...]")
		}
		var err error
		if req.Env, err = cmdutil.KVMap("-e", env); err != nil {
			return err
		}
		stdinFD := int(os.Stdin.Fd())
		if tty {
			if !term.IsTerminal(stdinFD) {
				return errdefs.Invalid("-t needs a terminal on stdin")
			}
			rows, cols := cmdutil.TermSize(stdinFD)
			req.TTY = &api.TTY{Rows: rows, Cols: cols}
			interactive = true
		}
		req.KeepStdin = interactive && !tty
		ctx, stop := signal.NotifyContext(ctx, unix.SIGINT, unix.SIGTERM)
		defer stop()
		t0 := time.Now()
		s, err := cl.ExecStream(ctx, id, &req)
		if err != nil {
			return cmdutil.APIErr(err)
		}
		defer s.Close()
		first, err := s.Next()
		if err != nil {
			return err
		}
		if first.End != nil { // it could not start
			fmt.Fprintf(g.Stderr, "airlock: %s\n", first.End.Error)
			return endOf(g, k, &execResult{SandboxID: id, ExecEnd: first.End}, t0)
		}
		if req.Background {
			if k.AsJSON {
				return cmdutil.PrintJSON(g.Stdout, &execResult{SandboxID: id, PID: first.PID, ExecID: first.ExecID})
			}
			fmt.Fprintln(g.Stdout, first.PID)
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
						rows, cols := cmdutil.TermSize(stdinFD)
						_ = cl.Resize(ctx, id, first.PID, rows, cols)
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
		end, err := client.Drain(s, g.Stdout, g.Stderr)
		if err != nil {
			if ctx.Err() != nil {
				return cmdutil.ExitError{Code: 130}
			}
			return err
		}
		if end.SandboxEnded {
			fmt.Fprintf(g.Stderr, "airlock: the sandbox ended: %s\n", end.EndReason)
		} else if end.TimedOut || end.Limit != "" {
			fmt.Fprintf(g.Stderr, "airlock: %s\n", end.Status)
		} else if end.Error != "" {
			fmt.Fprintf(g.Stderr, "airlock: %s\n", end.Error)
		}
		return endOf(g, k, &execResult{SandboxID: id, PID: first.PID, ExecID: first.ExecID, ExecEnd: end}, t0)
	})
}

// execResult is how a command of exec or attach ended, for --json.
type execResult struct {
	SandboxID string `json:"sandbox_id"`
	PID       uint32 `json:"pid,omitempty"`
	ExecID    string `json:"exec_id,omitempty"`
	*api.ExecEnd
	DurationMS float64 `json:"duration_ms,omitempty"`
}

// endOf prints, under --json, how the command ended (after its output),
// and exits with its exit code.
func endOf(g *cmdutil.Globals, k *cmdutil.Conn, r *execResult, t0 time.Time) error {
	if k.AsJSON {
		r.DurationMS = float64(time.Since(t0).Microseconds()) / 1000
		if err := cmdutil.PrintJSON(g.Stdout, r); err != nil {
			return err
		}
	}
	return cmdutil.Exit(r.ExitCode)
}

func attachCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "attach SANDBOX PID",
		Short: "Stream a background command's output until it ends; exits with its exit code",
		Args:  cobra.ExactArgs(2),
	}
	return onDaemon(g, cmdutil.Relays(c), true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		pid, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil {
			return errdefs.Invalid("PID: " + err.Error())
		}
		t0 := time.Now()
		s, err := cl.Attach(ctx, args[0], uint32(pid))
		if err != nil {
			return cmdutil.APIErr(err)
		}
		defer s.Close()
		end, err := client.Drain(s, g.Stdout, g.Stderr)
		if err != nil {
			return err
		}
		return endOf(g, k, &execResult{SandboxID: args[0], PID: uint32(pid), ExecEnd: end}, t0)
	})
}

func logsCmd(g *cmdutil.Globals) *cobra.Command {
	var follow bool
	c := &cobra.Command{
		Use:   "logs [--follow] SANDBOX PID",
		Short: "Print what a background command has printed since it started",
		Long: `logs prints the output of a background command (exec -d): stdout to stdout,
stderr to stderr, in the order it came. The daemon keeps the newest 1 MiB
of each command's output (16 MiB per sandbox, 64 MiB per tenant; a line on
stderr says how much earlier output is no longer kept), from when the
command started, and an ended command's too, until its sandbox ends.
--follow goes on with new output until the command ends. logs exits 0
whatever the command's status (attach exits with it).

  pid=$(airlock exec -d "$id" -- make serve)
  airlock logs -f "$id" "$pid"`,
		Args: cobra.ExactArgs(2),
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "go on with new output until the command ends")
	return onDaemon(g, c, false, func(ctx context.Context, cl *client.Client, _ *cmdutil.Conn, args []string) error {
		pid, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil {
			return errdefs.Invalid("PID: " + err.Error())
		}
		ctx, stop := signal.NotifyContext(ctx, unix.SIGINT, unix.SIGTERM)
		defer stop()
		s, err := cl.Logs(ctx, args[0], uint32(pid), follow)
		if err != nil {
			return cmdutil.APIErr(err)
		}
		defer s.Close()
		for {
			ev, err := s.Next()
			switch {
			case err == io.EOF && !follow:
				return nil
			case err != nil && ctx.Err() != nil:
				return nil // interrupted: what came is printed
			case err == io.EOF:
				return io.ErrUnexpectedEOF
			case err != nil:
				return err
			}
			if ev.Dropped > 0 {
				g.Warn(fmt.Sprintf("%d bytes of earlier output are no longer kept", ev.Dropped))
			}
			if _, err := g.Stdout.Write(append(ev.Stdout, ev.PTY...)); err != nil {
				return err
			}
			if _, err := g.Stderr.Write(ev.Stderr); err != nil {
				return err
			}
			if ev.End != nil {
				return nil
			}
		}
	})
}

func signalCmd(g *cmdutil.Globals) *cobra.Command {
	var sig string
	c := &cobra.Command{
		Use:   "signal [--signal TERM|KILL] SANDBOX PID",
		Short: "Send a signal to a command's process group in a sandbox",
		Args:  cobra.ExactArgs(2),
	}
	c.Flags().StringVarP(&sig, "signal", "s", "TERM", "TERM or KILL")
	return onDaemon(g, c, false, func(ctx context.Context, cl *client.Client, _ *cmdutil.Conn, args []string) error {
		pid, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil {
			return errdefs.Invalid("PID: " + err.Error())
		}
		return cmdutil.APIErr(cl.Signal(ctx, args[0], uint32(pid), sig))
	})
}

func catCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "cat SANDBOX PATH",
		Short: "Print a file of a sandbox",
		Args:  cobra.ExactArgs(2),
	}
	return onDaemon(g, c, false, func(ctx context.Context, cl *client.Client, _ *cmdutil.Conn, args []string) error {
		r, err := cl.OpenFile(ctx, args[0], args[1], 0)
		if err != nil {
			return cmdutil.APIErr(err)
		}
		defer r.Close()
		_, err = io.Copy(g.Stdout, r)
		return err
	})
}

func writeCmd(g *cmdutil.Globals) *cobra.Command {
	var mode string
	c := &cobra.Command{
		Use:   "write SANDBOX PATH < DATA",
		Short: "Write stdin to a file of a sandbox (replacing it once stdin ends)",
		Args:  cobra.ExactArgs(2),
	}
	c.Flags().StringVar(&mode, "mode", "644", "permissions of a new file (octal)")
	return onDaemon(g, c, false, func(ctx context.Context, cl *client.Client, _ *cmdutil.Conn, args []string) error {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m > 0o777 {
			return errdefs.Invalid("--mode: want octal permissions such as 644")
		}
		return cmdutil.APIErr(cl.WriteFileFrom(ctx, args[0], args[1], os.Stdin, os.FileMode(m)))
	})
}

func editCmd(g *cmdutil.Globals) *cobra.Command {
	var old, new string
	c := &cobra.Command{
		Use:   "edit SANDBOX PATH --old TEXT --new TEXT",
		Short: "Replace one exact, unique occurrence of a text in a file of a sandbox",
		Args:  cobra.ExactArgs(2),
	}
	c.Flags().StringVar(&old, "old", "", "the text to replace (must occur exactly once)")
	c.Flags().StringVar(&new, "new", "", "its replacement")
	return onDaemon(g, c, false, func(ctx context.Context, cl *client.Client, _ *cmdutil.Conn, args []string) error {
		return cmdutil.APIErr(cl.Edit(ctx, args[0], args[1], old, new))
	})
}

func lsCmd(g *cmdutil.Globals) *cobra.Command {
	var depth int
	c := &cobra.Command{
		Use:   "ls SANDBOX [PATH]",
		Short: "List a directory of a sandbox (default /workspace)",
		Args:  cobra.RangeArgs(1, 2),
	}
	c.Flags().IntVar(&depth, "depth", 1, "levels to descend (1: the directory's entries)")
	return onDaemon(g, c, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		p := "/workspace"
		if len(args) == 2 {
			p = args[1]
		}
		es, err := cl.ListDir(ctx, args[0], p, depth)
		return k.Show(es, err, func() error {
			sort.Slice(es, func(i, j int) bool { return es[i].Path < es[j].Path })
			w := tabwriter.NewWriter(g.Stdout, 2, 4, 1, ' ', tabwriter.AlignRight)
			for _, e := range es {
				// Names, owners and targets are the sandbox's: quoted.
				name := untrusted.Quote(e.Path)
				if e.Target != "" {
					name += " -> " + untrusted.Quote(e.Target)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t %s\t %s\n", untrusted.Quote(e.Mode), untrusted.Quote(e.Owner), untrusted.Quote(e.Group), e.Size, e.Modified.Format("Jan _2 15:04"), name)
			}
			return w.Flush()
		})
	})
}

func diffCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "diff SANDBOX",
		Short: "Print the unified diff of a sandbox's /workspace since it was created",
		Long: `diff prints the unified diff of a sandbox's /workspace since it was created
(on a terminal, with the sandbox's control characters made visible). --json
prints {"sandbox_id": ..., "patch": ...}, the patch as it is.`,
		Args: cobra.ExactArgs(1),
	}
	return onDaemon(g, c, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		d, err := cl.Diff(ctx, args[0])
		if err != nil {
			return cmdutil.APIErr(err)
		}
		if k.AsJSON {
			return cmdutil.PrintJSON(g.Stdout, map[string]string{"sandbox_id": args[0], "patch": d})
		}
		_, err = io.WriteString(cmdutil.ForTerminal(g.Stdout), d)
		return err
	})
}

// eachCmd is a command that does one thing to each of its arguments (use
// names them), going on past a failure; it fails if any did. Under --json
// it prints a list: each argument's id, ok, and error when it failed.
func eachCmd(g *cmdutil.Globals, use, short string, do func(ctx context.Context, cl *client.Client, id string) error) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Args: cobra.MinimumNArgs(1)}
	type outcome struct {
		ID    string `json:"id"`
		OK    bool   `json:"ok"`
		Error string `json:"error,omitempty"`
	}
	return onDaemon(g, c, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		var errs []error
		out := make([]outcome, 0, len(args))
		for _, id := range args {
			err := do(ctx, cl, id)
			if err != nil {
				err = fmt.Errorf("%s: %w", id, cmdutil.APIErr(err))
				errs = append(errs, err)
				out = append(out, outcome{ID: id, Error: err.Error()})
				continue
			}
			out = append(out, outcome{ID: id, OK: true})
		}
		err := errors.Join(errs...)
		if !k.AsJSON {
			return err
		}
		if perr := cmdutil.PrintJSON(g.Stdout, out); perr != nil {
			return perr
		}
		// The list says what failed; stderr says it too, and the exit
		// status is the table's.
		for _, e := range errs {
			g.Warn(e.Error())
		}
		return cmdutil.Exit(cmdutil.ExitCode(c, err))
	})
}

func extendCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{Use: "extend SANDBOX TTL", Short: "Set a sandbox's expiry to TTL (a Go duration) from now", Args: cobra.ExactArgs(2)}
	return onDaemon(g, c, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		sb, err := cl.Extend(ctx, args[0], args[1])
		return k.Show(sb, err, func() error {
			fmt.Fprintf(g.Stdout, "%s expires %s\n", sb.ID, sb.Expires.Format(time.RFC3339))
			return nil
		})
	})
}

func snapshotCmd(g *cmdutil.Globals) *cobra.Command {
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
	var memory bool
	create := &cobra.Command{Use: "create SANDBOX", Short: "Save a sandbox's filesystem state and print the snapshot's id", Args: cobra.ExactArgs(1),
		Long: `Save a sandbox's filesystem state and print the snapshot's id. The bytes
copied are drawn on stderr when it is a terminal (a line each couple of
seconds with --progress, never with --json). Interrupting it stops the
copy and leaves no snapshot.

With --memory (gvisor sandboxes only) the running sandbox is checkpointed
with its files, while paused, and runs on: a sandbox created from the
snapshot is restored running (its processes, open files, /tmp and
/workspace as they were). Calls in flight on the sandbox at that moment
(a streamed exec's output, an attach, a watch) are cut; the commands run on.`}
	onDaemon(g, create, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		// The copy's bytes, as the daemon reports them, draw on stderr;
		// they are erased before the id is printed.
		pctx, clearProgress := g.Progress(ctx, k.AsJSON)
		var sn *api.Snapshot
		var err error
		switch {
		case memory:
			sn, err = cl.SnapshotWith(ctx, args[0], &api.CreateSnapshot{Name: name, Memory: true})
		case progress.Enabled(pctx):
			sn, err = cl.SnapshotProgress(ctx, args[0], name, relay(pctx))
		default:
			sn, err = cl.Snapshot(ctx, args[0], name)
		}
		clearProgress()
		if err == nil && sn.Memory {
			g.Warn(fmt.Sprintf("snapshot: saved the sandbox's memory (%s MiB) in %d ms", progress.MiB(sn.MemoryBytes), sn.CheckpointMillis))
		}
		if err == nil {
			for _, s := range sn.Skipped {
				g.Warn("snapshot: skipped " + untrusted.Quote(s) + " (not a file, directory or symlink)")
			}
		}
		return k.Show(sn, err, func() error {
			fmt.Fprintln(g.Stdout, sn.ID)
			return nil
		})
	})
	create.Flags().StringVar(&name, "name", "", "a name to remember it by")
	create.Flags().BoolVar(&memory, "memory", false, "save the running sandbox's memory too (gvisor sandboxes): a sandbox created from the snapshot is restored running, its processes, open files and /tmp as they were")
	ls := &cobra.Command{Use: "ls", Short: "List your snapshots", Args: cobra.NoArgs}
	onDaemon(g, ls, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, _ []string) error {
		sns, err := cl.Snapshots(ctx)
		return k.Show(sns, err, func() error {
			w := tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tNAME\tSANDBOX\tBASE\tSIZE\tCREATED")
			for _, s := range sns {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Name, s.Sandbox, s.Base, spec.FormatSize(s.Bytes), s.Created.Format(time.RFC3339))
			}
			return w.Flush()
		})
	})
	rm := eachCmd(g, "rm SNAPSHOT...", "Delete snapshots (refused while a sandbox runs from one)", func(ctx context.Context, cl *client.Client, id string) error { return cl.DeleteSnapshot(ctx, id) })
	c.AddCommand(create, ls, rm)
	return c
}
