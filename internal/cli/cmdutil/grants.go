package cmdutil

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// GrantHelp documents --grant for create, run and mcp.
const GrantHelp = `let the sandbox use secret SECRET at HOST without holding it:
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

// GrantsOf reads --grant flags and a --grants file (YAML or JSON: a list
// of grants with the API's field names).
func GrantsOf(flags []string, file string) ([]api.Grant, error) {
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

// SpecGrants turns API grants into the spec's (airlock run).
func SpecGrants(gs []api.Grant) ([]spec.Grant, error) {
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

// LocalSecrets reads run's and mcp's --secret NAME=env:VAR or NAME=file:PATH: the
// value never appears on a command line.
func LocalSecrets(flags []string) (map[string][]byte, error) {
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
