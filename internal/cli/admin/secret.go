package admin

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// readSecretValue reads a secret from file ("-" or "": stdin), dropping one
// trailing newline (echo and editors add it).
func readSecretValue(g *cmdutil.Globals, file string) (string, error) {
	var b []byte
	var err error
	if file == "" || file == "-" {
		if term.IsTerminal(int(os.Stdin.Fd())) {
			fmt.Fprint(g.Stderr, "secret value (not echoed): ")
			b, err = term.ReadPassword(int(os.Stdin.Fd()))
			fmt.Fprintln(g.Stderr)
		} else {
			b, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
		}
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return "", errdefs.Invalid("the secret's value: " + err.Error())
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	return string(b), nil
}

func secretCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "secret",
		Short: "Keep credentials in the daemon, for sandboxes' grants (tenant key)",
		Long: `A secret is a credential the daemon keeps for your tenant, sealed at rest
(AES-256-GCM under a key file no sandbox can reach). It never enters a
sandbox and the API never returns it: a sandbox created with a grant on it
holds only a placeholder, which the egress proxy swaps for the real value
on the requests the grant covers (see airlock create --help, --grant).

  airlock secret add github-ro --from-file ~/.config/gh-ro-token
  printf %s "$TOKEN" | airlock secret add ci-token
  airlock secret rotate github-ro --from-file new-token
  airlock secret ls
  airlock secret rm ci-token`,
	}
	var from string
	add := &cobra.Command{Use: "add NAME", Short: "Store a new secret (value from --from-file, or stdin)", Args: cobra.ExactArgs(1)}
	ak := cmdutil.AddConn(add, g, true)
	add.RunE = func(cmd *cobra.Command, args []string) error {
		v, err := readSecretValue(g, from)
		if err != nil {
			return err
		}
		cl, err := ak.Client(false)
		if err != nil {
			return err
		}
		sec, err := cl.AddSecret(cmd.Context(), args[0], v)
		return ak.Show(sec, err, func() error {
			fmt.Fprintf(g.Stderr, "airlock: secret %s stored (version %d)\n", sec.Name, sec.Version)
			return nil
		})
	}
	add.Flags().StringVar(&from, "from-file", "", "read the value from FILE (default: stdin; a terminal is not echoed)")
	var rfrom string
	rotate := &cobra.Command{Use: "rotate NAME", Short: "Give a secret a new value (live grants use it from their next request)", Args: cobra.ExactArgs(1)}
	rok := cmdutil.AddConn(rotate, g, true)
	rotate.RunE = func(cmd *cobra.Command, args []string) error {
		v, err := readSecretValue(g, rfrom)
		if err != nil {
			return err
		}
		cl, err := rok.Client(false)
		if err != nil {
			return err
		}
		sec, err := cl.RotateSecret(cmd.Context(), args[0], v)
		return rok.Show(sec, err, func() error {
			fmt.Fprintf(g.Stderr, "airlock: secret %s rotated (version %d)\n", sec.Name, sec.Version)
			return nil
		})
	}
	rotate.Flags().StringVar(&rfrom, "from-file", "", "read the new value from FILE (default: stdin)")
	ls := &cobra.Command{Use: "ls", Short: "List your secrets (names and versions, never values)", Args: cobra.NoArgs}
	lk := cmdutil.AddConn(ls, g, true)
	ls.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := lk.Client(false)
		if err != nil {
			return err
		}
		ss, err := cl.Secrets(cmd.Context())
		return lk.Show(ss, err, func() error {
			w := tabwriter.NewWriter(g.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tVERSION\tCREATED\tUPDATED")
			for _, s := range ss {
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", s.Name, s.Version, s.Created.Format(time.RFC3339), s.Updated.Format(time.RFC3339))
			}
			return w.Flush()
		})
	}
	rm := &cobra.Command{Use: "rm NAME", Short: "Delete a secret (grants naming it fail from their next request)", Args: cobra.ExactArgs(1)}
	rk := cmdutil.AddConn(rm, g, true)
	rm.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := rk.Client(false)
		if err != nil {
			return err
		}
		err = cl.RemoveSecret(cmd.Context(), args[0])
		return rk.Show(map[string]any{"name": args[0], "removed": true}, err, func() error { return nil })
	}
	c.AddCommand(add, ls, rotate, rm)
	return c
}
