// Package policy is what a sandbox may reach: the allowlist of names and
// ports (Policy, Rule, Presets, policy files) and the address guard (Guard),
// which refuses the host's own addresses, other sandboxes, loopback,
// private, link-local, CGNAT, metadata and other special addresses,
// whatever DNS says. The proxy and the DNS forwarder (internal/egress and
// internal/egress/dns) ask it; it imports internal/editdist, the
// standard library and yaml.
package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/airlock-sandbox/airlock/internal/editdist"
)

// Rule is one allow or deny pattern: an exact host, "*.suffix" (any
// subdomain, not the bare suffix), or an IP literal, with an optional port;
// no port means 80 and 443.
type Rule struct {
	Pattern string // as written, for messages
	Host    string // lower case, no trailing dot; "*.example.com" kept as is
	Port    int    // 0: 80 and 443
}

func (r Rule) String() string { return r.Pattern }

// Presets are named lists of hosts for common needs.
var Presets = map[string][]string{
	"pypi":   {"pypi.org", "files.pythonhosted.org"},
	"npm":    {"registry.npmjs.org", "registry.yarnpkg.com"},
	"go":     {"proxy.golang.org", "sum.golang.org", "storage.googleapis.com"},
	"github": {"github.com", "api.github.com", "codeload.github.com", "raw.githubusercontent.com", "objects.githubusercontent.com"},
	"debian": {"deb.debian.org", "security.debian.org"},
}

// presetLike is the preset a single-label name is a likely typo of (one
// edit away, two for names of four letters or more: transposed letters
// count as one), or "".
func presetLike(s string) string {
	if strings.ContainsAny(s, ".:[*") {
		return ""
	}
	s = strings.ToLower(s)
	for _, name := range presetNames() {
		most := 1
		if len(name) >= 4 {
			most = 2
		}
		if d := editdist.Distance(s, name); d > 0 && d <= most {
			return name
		}
	}
	return ""
}

// presetNames are the presets' names, sorted.
func presetNames() []string {
	names := make([]string, 0, len(Presets))
	for n := range Presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ParseRule parses "host", "*.suffix", "host:port", an IP literal or
// "[v6]:port".
func ParseRule(s string) (Rule, error) {
	r := Rule{Pattern: s}
	host, port := s, ""
	if strings.HasPrefix(s, "[") {
		i := strings.Index(s, "]")
		if i < 0 {
			return r, fmt.Errorf("rule %q: unclosed [", s)
		}
		host, port = s[1:i], strings.TrimPrefix(s[i+1:], ":")
	} else if i := strings.LastIndex(s, ":"); i >= 0 && strings.Count(s, ":") == 1 {
		host, port = s[:i], s[i+1:]
	}
	if port != "" {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return r, fmt.Errorf("rule %q: bad port", s)
		}
		r.Port = p
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip, err := netip.ParseAddr(host); err == nil {
		r.Host = ip.Unmap().String()
		return r, nil
	}
	name := strings.TrimPrefix(host, "*.")
	if !validName(name) || strings.Contains(name, "*") {
		return r, fmt.Errorf("rule %q: not a host name, *.suffix or IP address", s)
	}
	r.Host = host
	return r, nil
}

func validName(n string) bool {
	if n == "" || len(n) > 253 {
		return false
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// matches reports whether the rule covers host (lower case, no trailing
// dot) on port; port 0 asks about the name alone (DNS).
func (r Rule) matches(host string, port int) bool {
	if port != 0 {
		if r.Port == 0 && port != 80 && port != 443 || r.Port != 0 && r.Port != port {
			return false
		}
	}
	if suffix, ok := strings.CutPrefix(r.Host, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return host == r.Host
}

// Policy is a sandbox's egress policy. Deny wins over allow; nothing is
// allowed by default.
type Policy struct {
	Allow []Rule
	Deny  []Rule
}

// Decision is the outcome of a check, with the rule that decided.
type Decision struct {
	Allowed bool
	Rule    string // the deciding rule, or "" for the default deny
	Reason  string // human words for a denial
}

// Check decides host:port. host is a name or an IP literal.
func (p *Policy) Check(host string, port int) Decision {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		host = ip.Unmap().String()
	}
	for _, r := range p.Deny {
		if r.matches(host, port) {
			return Decision{Rule: "deny " + r.Pattern, Reason: fmt.Sprintf("denied by rule %q", r.Pattern)}
		}
	}
	for _, r := range p.Allow {
		if r.matches(host, port) {
			return Decision{Allowed: true, Rule: "allow " + r.Pattern}
		}
	}
	what := "no allow rule matches"
	if _, err := netip.ParseAddr(host); err == nil {
		what = "IP addresses are refused unless an allow rule names them"
	}
	return Decision{Reason: what}
}

// AllowsName reports whether DNS may answer for name: some allow rule, on
// any port, covers it and no deny rule without a port does.
func (p *Policy) AllowsName(name string) Decision {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, r := range p.Deny {
		if r.Port == 0 && r.matches(name, 0) {
			return Decision{Rule: "deny " + r.Pattern, Reason: fmt.Sprintf("denied by rule %q", r.Pattern)}
		}
	}
	for _, r := range p.Allow {
		if r.matches(name, 0) {
			return Decision{Allowed: true, Rule: "allow " + r.Pattern}
		}
	}
	return Decision{Reason: "no allow rule matches"}
}

// Empty reports whether the policy allows nothing at all.
func (p *Policy) Empty() bool { return len(p.Allow) == 0 }

// Add parses patterns (or preset names) into allow or deny rules.
func (p *Policy) Add(allow bool, patterns ...string) error {
	for _, s := range patterns {
		hosts := []string{s}
		if preset, ok := Presets[s]; ok {
			hosts = preset
		} else if like := presetLike(s); like != "" {
			return fmt.Errorf("%q is no preset: did you mean %q? (the presets: %s; for a host of that name write %q)", s, like, strings.Join(presetNames(), ", "), s+".")
		}
		for _, h := range hosts {
			r, err := ParseRule(h)
			if err != nil {
				return err
			}
			if allow {
				p.Allow = append(p.Allow, r)
			} else {
				p.Deny = append(p.Deny, r)
			}
		}
	}
	return nil
}

// policyFile is the on-disk form: YAML or JSON, unknown fields refused.
type policyFile struct {
	Allow []string `yaml:"allow" json:"allow"`
	Deny  []string `yaml:"deny" json:"deny"`
}

// LoadFile adds the rules of a policy file (JSON, or YAML).
func (p *Policy) LoadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	return p.Parse(path, b)
}

// Parse adds the rules of policy file content b (named name in errors).
func (p *Policy) Parse(name string, b []byte) error {
	var f policyFile
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			return fmt.Errorf("--policy %s: %w", name, err)
		}
		if dec.More() {
			return fmt.Errorf("--policy %s: trailing data", name)
		}
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&f); err != nil && err.Error() != "EOF" {
			return fmt.Errorf("--policy %s: %w", name, err)
		}
	}
	if err := p.Add(true, f.Allow...); err != nil {
		return fmt.Errorf("--policy %s: %w", name, err)
	}
	if err := p.Add(false, f.Deny...); err != nil {
		return fmt.Errorf("--policy %s: %w", name, err)
	}
	return nil
}

// Hosts lists the allow patterns, for messages.
func (p *Policy) Hosts() []string {
	var out []string
	for _, r := range p.Allow {
		if !slices.Contains(out, r.Pattern) {
			out = append(out, r.Pattern)
		}
	}
	return out
}
