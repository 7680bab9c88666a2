package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"gopkg.in/yaml.v3"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// readSecretValue reads a secret from file ("-" or "": stdin), dropping one
// trailing newline (echo and editors add it).
func readSecretValue(g *globals, file string) (string, error) {
	var b []byte
	var err error
	if file == "" || file == "-" {
		if term.IsTerminal(int(os.Stdin.Fd())) {
			fmt.Fprint(g.stderr, "secret value (not echoed): ")
			b, err = term.ReadPassword(int(os.Stdin.Fd()))
			fmt.Fprintln(g.stderr)
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

func secretCmd(g *globals) *cobra.Command {
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
	ak := addConn(add, g, true)
	add.RunE = func(cmd *cobra.Command, args []string) error {
		v, err := readSecretValue(g, from)
		if err != nil {
			return err
		}
		cl, err := ak.client(false)
		if err != nil {
			return err
		}
		sec, err := cl.AddSecret(cmd.Context(), args[0], v)
		if err != nil {
			return apiErr(err)
		}
		if ak.asJSON {
			return printJSON(g.stdout, sec)
		}
		fmt.Fprintf(g.stderr, "airlock: secret %s stored (version %d)\n", sec.Name, sec.Version)
		return nil
	}
	add.Flags().StringVar(&from, "from-file", "", "read the value from FILE (default: stdin; a terminal is not echoed)")
	var rfrom string
	rotate := &cobra.Command{Use: "rotate NAME", Short: "Give a secret a new value (live grants use it from their next request)", Args: cobra.ExactArgs(1)}
	rok := addConn(rotate, g, true)
	rotate.RunE = func(cmd *cobra.Command, args []string) error {
		v, err := readSecretValue(g, rfrom)
		if err != nil {
			return err
		}
		cl, err := rok.client(false)
		if err != nil {
			return err
		}
		sec, err := cl.RotateSecret(cmd.Context(), args[0], v)
		if err != nil {
			return apiErr(err)
		}
		if rok.asJSON {
			return printJSON(g.stdout, sec)
		}
		fmt.Fprintf(g.stderr, "airlock: secret %s rotated (version %d)\n", sec.Name, sec.Version)
		return nil
	}
	rotate.Flags().StringVar(&rfrom, "from-file", "", "read the new value from FILE (default: stdin)")
	ls := &cobra.Command{Use: "ls", Short: "List your secrets (names and versions, never values)", Args: cobra.NoArgs}
	lk := addConn(ls, g, true)
	ls.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := lk.client(false)
		if err != nil {
			return err
		}
		ss, err := cl.Secrets(cmd.Context())
		if err != nil {
			return apiErr(err)
		}
		if lk.asJSON {
			return printJSON(g.stdout, ss)
		}
		w := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAME\tVERSION\tCREATED\tUPDATED")
		for _, s := range ss {
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", s.Name, s.Version, s.Created.Format(time.RFC3339), s.Updated.Format(time.RFC3339))
		}
		return w.Flush()
	}
	rm := &cobra.Command{Use: "rm NAME", Short: "Delete a secret (grants naming it fail from their next request)", Args: cobra.ExactArgs(1)}
	rk := addConn(rm, g, false)
	rm.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := rk.client(false)
		if err != nil {
			return err
		}
		return apiErr(cl.RemoveSecret(cmd.Context(), args[0]))
	}
	c.AddCommand(add, ls, rotate, rm)
	return c
}

// grantHelp documents --grant for create and run.
const grantHelp = `let the sandbox use secret SECRET at HOST without holding it:
'SECRET@HOST[:PORT] METHODS:/PATH... [env=VAR] [scheme=bearer|token|basic|raw] [header=NAME] [user=NAME] [ttl=DURATION]'
e.g. 'github-ro@api.github.com GET,HEAD:/repos/acme/shop/** env=GITHUB_TOKEN' (repeatable)`

// parseGrant reads the compact --grant form.
func parseGrant(s string) (api.Grant, error) {
	var g api.Grant
	fields := strings.Fields(s)
	bad := func(why string) (api.Grant, error) {
		return g, errdefs.Invalid(fmt.Sprintf("--grant %q: %s (want 'SECRET@HOST[:PORT] METHODS:/PATH... [env=VAR] [scheme=S] [header=H] [user=U] [ttl=D]')", s, why))
	}
	if len(fields) < 2 {
		return bad("no request rule")
	}
	secret, host, ok := strings.Cut(fields[0], "@")
	if !ok || secret == "" || host == "" {
		return bad("it starts with SECRET@HOST")
	}
	g.Secret = secret
	if h, p, ok := strings.Cut(host, ":"); ok {
		n, err := strconv.Atoi(p)
		if err != nil {
			return bad("bad port")
		}
		host, g.Port = h, n
	}
	g.Host = host
	for _, f := range fields[1:] {
		if methods, path, ok := strings.Cut(f, ":/"); ok && !strings.Contains(methods, "=") {
			g.Allow = append(g.Allow, methods+" /"+path)
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return bad(fmt.Sprintf("%q is neither METHODS:/PATH nor KEY=VALUE", f))
		}
		switch k {
		case "env":
			g.Env = v
		case "scheme":
			g.Scheme = v
		case "header":
			g.Header = v
		case "user":
			g.Username = v
		case "ttl":
			g.TTL = v
		default:
			return bad(fmt.Sprintf("unknown option %q", k))
		}
	}
	if len(g.Allow) == 0 {
		return bad("no request rule")
	}
	return g, nil
}

// grantsOf reads --grant flags and a --grants file (YAML or JSON: a list
// of grants with the API's field names).
func grantsOf(flags []string, file string) ([]api.Grant, error) {
	var out []api.Grant
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, errdefs.Invalid("--grants: " + err.Error())
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		var gs []struct {
			Secret   string   `yaml:"secret"`
			Env      string   `yaml:"env"`
			Host     string   `yaml:"host"`
			Port     int      `yaml:"port"`
			Header   string   `yaml:"header"`
			Scheme   string   `yaml:"scheme"`
			Username string   `yaml:"username"`
			Allow    []string `yaml:"allow"`
			TTL      string   `yaml:"ttl"`
		}
		if err := dec.Decode(&gs); err != nil {
			return nil, errdefs.Invalid("--grants " + file + ": " + err.Error())
		}
		for _, x := range gs {
			out = append(out, api.Grant{Secret: x.Secret, Env: x.Env, Host: x.Host, Port: x.Port, Header: x.Header, Scheme: x.Scheme, Username: x.Username, Allow: x.Allow, TTL: x.TTL})
		}
	}
	for _, f := range flags {
		g, err := parseGrant(f)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// specGrants turns API grants into the spec's (airlock run).
func specGrants(gs []api.Grant) ([]spec.Grant, error) {
	var out []spec.Grant
	for i, g := range gs {
		var ttl time.Duration
		if g.TTL != "" {
			d, err := time.ParseDuration(g.TTL)
			if err != nil || d <= 0 {
				return nil, errdefs.Invalid(fmt.Sprintf("grant %d: ttl %q: want a duration such as 15m", i+1, g.TTL))
			}
			ttl = d
		}
		out = append(out, spec.Grant{Secret: g.Secret, Env: g.Env, Host: g.Host, Port: g.Port, Header: g.Header, Scheme: g.Scheme, Username: g.Username, Allow: g.Allow, TTL: ttl})
	}
	return out, nil
}

// localSecrets reads run's --secret NAME=env:VAR or NAME=file:PATH: the
// value never appears on a command line.
func localSecrets(flags []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, f := range flags {
		name, src, ok := strings.Cut(f, "=")
		kind, ref, ok2 := strings.Cut(src, ":")
		if !ok || !ok2 || !spec.SecretNameOK(name) {
			return nil, errdefs.Invalid(fmt.Sprintf("--secret %q: want NAME=env:VARIABLE or NAME=file:PATH", f))
		}
		var v []byte
		switch kind {
		case "env":
			s, set := os.LookupEnv(ref)
			if !set || s == "" {
				return nil, errdefs.Invalid(fmt.Sprintf("--secret %s: variable %s is not set", name, ref))
			}
			v = []byte(s)
		case "file":
			b, err := os.ReadFile(ref)
			if err != nil {
				return nil, errdefs.Invalid(fmt.Sprintf("--secret %s: %v", name, err))
			}
			v = bytes.TrimSuffix(b, []byte("\n"))
		default:
			return nil, errdefs.Invalid(fmt.Sprintf("--secret %q: the source is env:VARIABLE or file:PATH", f))
		}
		if bytes.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return nil, errdefs.Invalid(fmt.Sprintf("--secret %s: the value holds a control character; it goes into request headers", name))
		}
		out[name] = v
	}
	return out, nil
}
