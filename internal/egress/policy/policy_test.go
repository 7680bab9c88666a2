package policy

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// noLocal is a host without addresses of its own, for guards in tests
// whose servers listen on loopback.
func noLocal() ([]netip.Prefix, error) { return nil, nil }

func policy(t *testing.T, allow, deny []string) *Policy {
	t.Helper()
	p := &Policy{}
	if err := p.Add(true, allow...); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(false, deny...); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicy(t *testing.T) {
	p := policy(t, []string{"allowed.test", "*.cdn.test", "api.test:8443", "192.0.2.10", "pypi"}, []string{"bad.cdn.test", "*.evil.test"})
	for _, c := range []struct {
		host string
		port int
		ok   bool
	}{
		{"allowed.test", 443, true}, {"ALLOWED.TEST.", 80, true}, {"allowed.test", 22, false},
		{"x.allowed.test", 443, false}, {"a.cdn.test", 443, true}, {"cdn.test", 443, false},
		{"bad.cdn.test", 443, false}, {"api.test", 8443, true}, {"api.test", 443, false},
		{"192.0.2.10", 443, true}, {"192.0.2.11", 443, false}, {"::ffff:192.0.2.10", 443, true},
		{"pypi.org", 443, true}, {"files.pythonhosted.org", 443, true}, {"x.evil.test", 443, false},
		{"evil.test", 443, false}, {"", 443, false},
	} {
		if got := p.Check(c.host, c.port); got.Allowed != c.ok {
			t.Errorf("Check(%q, %d) = %+v, want allowed=%v", c.host, c.port, got, c.ok)
		}
	}
	if d := p.Check("evil.test", 443); d.Reason != "no allow rule matches" {
		t.Errorf("reason %q", d.Reason)
	}
	if d := p.Check("bad.cdn.test", 443); !strings.Contains(d.Reason, "bad.cdn.test") || !strings.HasPrefix(d.Rule, "deny") {
		t.Errorf("deny rule not named: %+v", d)
	}
	if !p.AllowsName("api.test").Allowed || p.AllowsName("x.evil.test").Allowed || p.AllowsName("nothing.test").Allowed {
		t.Error("AllowsName")
	}
	for _, bad := range []string{"*", "*.", "a..b", "-a.test", "a.test:0", "a.test:99999", "a b", "*.*.test", "[::1"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}

func TestPolicyFile(t *testing.T) {
	p := &Policy{}
	if err := p.Parse("p.yaml", []byte("allow:\n  - allowed.test\n  - github\ndeny:\n  - gist.github.com\n")); err != nil {
		t.Fatal(err)
	}
	if !p.Check("api.github.com", 443).Allowed || p.Check("gist.github.com", 443).Allowed {
		t.Fatalf("%+v", p)
	}
	if err := (&Policy{}).Parse("p.json", []byte(`{"allow": ["a.test"], "deny": []}`)); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"unknown yaml field": "allow: [a.test]\nallwo: [b.test]\n",
		"unknown json field": `{"allow": ["a.test"], "alow": []}`,
		"bad rule":           "allow: ['*']\n",
		"json trailing":      `{"allow": []} {}`,
	} {
		if err := (&Policy{}).Parse("p", []byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestGuard(t *testing.T) {
	g := &Guard{Local: noLocal}
	for _, s := range []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "::1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "fe80::1", "fd00::1", "224.0.0.1", "255.255.255.255",
		// The documentation ranges, IPv4 and IPv6 (docs/network.md).
		"192.0.2.10", "198.51.100.7", "203.0.113.1", "2001:db8::1", "3fff::1",
		// Ways to an embedded IPv4 address.
		"::10.0.0.1", "2002:a00:1::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.88.99.1",
		"198.18.0.1", "2001:2::1", "fec0::1", "192.0.0.170",
		// Azure's WireServer; IPv4-translated (SIIT) and the rest of ::/8.
		"168.63.129.16", "::ffff:0:a00:1", "::ffff:0:a9fe:a9fe", "ff:ff::1"} {
		if err := g.Check(netip.MustParseAddr(s)); !errors.Is(err, ErrBlockedAddress) {
			t.Errorf("%s allowed", s)
		}
	}
	for _, s := range []string{"1.1.1.1", "8.8.8.8", "2606:4700::1111", "192.0.3.1", "198.51.101.1"} {
		if err := g.Check(netip.MustParseAddr(s)); err != nil {
			t.Errorf("%s refused: %v", s, err)
		}
	}
	g.AllowNets = []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}
	if err := g.Check(netip.MustParseAddr("10.99.0.5")); err != nil {
		t.Errorf("operator exception ignored: %v", err)
	}
}

// The host's own addresses and the sandboxes' pool are refused whatever
// the operator opened, and the host's addresses are read at each decision.
func TestGuardRefusesTheHostAndOtherSandboxes(t *testing.T) {
	own := []netip.Prefix{netip.MustParsePrefix("203.0.113.5/32")}
	g := &Guard{
		AllowNets: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
		Sandboxes: netip.MustParsePrefix("10.234.0.0/16"),
		Local:     func() ([]netip.Prefix, error) { return own, nil },
	}
	for _, s := range []string{"203.0.113.5", "::ffff:203.0.113.5", "10.234.0.1", "10.234.7.2"} {
		if err := g.Check(netip.MustParseAddr(s)); !errors.Is(err, ErrBlockedAddress) {
			t.Errorf("%s allowed: %v", s, err)
		}
	}
	if err := g.Check(netip.MustParseAddr("203.0.113.6")); err != nil {
		t.Errorf("an opened address refused: %v", err)
	}
	// An address added to the host a moment ago counts at once.
	own = append(own, netip.MustParsePrefix("203.0.113.6/32"))
	if err := g.Check(netip.MustParseAddr("203.0.113.6")); err == nil || !strings.Contains(err.Error(), "an address of this host") {
		t.Errorf("a new host address allowed: %v", err)
	}
	// Not knowing the host's addresses refuses everything.
	g.Local = func() ([]netip.Prefix, error) { return nil, errors.New("netlink down") }
	if err := g.Check(netip.MustParseAddr("1.1.1.1")); !errors.Is(err, ErrBlockedAddress) {
		t.Errorf("dialled without knowing the host's addresses: %v", err)
	}
}

// LocalPrefixes sees every address the standard library sees on the
// host's interfaces, and loopback's whole /8 (a local route).
func TestLocalPrefixesSeeEveryInterface(t *testing.T) {
	got, err := LocalPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	contains := func(a netip.Addr) bool {
		for _, p := range got {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.(*net.IPNet).IP)
		if !contains(ip.Unmap()) {
			t.Errorf("%s (on an interface) missing from %v", ip, got)
		}
	}
	if !contains(netip.MustParseAddr("127.0.0.7")) {
		t.Errorf("127.0.0.7 (local route) missing from %v", got)
	}
	// The default guard reads them: this host is never dialled.
	if err := (&Guard{AllowNets: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}).Check(netip.MustParseAddr("127.0.0.1")); err == nil {
		t.Error("the default guard dials loopback when the operator opens everything")
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"a.test", "*.a.test", "a.test:443", "192.0.2.1", "[2001:db8::1]:443", "*", "a..b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		if r.Host == "" || r.Host == "*" || r.Port < 0 || r.Port > 65535 {
			t.Fatalf("ParseRule(%q) = %+v", s, r)
		}
		p := &Policy{Allow: []Rule{r}}
		// A rule never allows a name outside what it names.
		if p.Check("airlock-unrelated.invalid", 443).Allowed && r.Host != "airlock-unrelated.invalid" && r.Host != "*.invalid" {
			t.Fatalf("rule %q allows an unrelated host", s)
		}
	})
}

// Regression (issue 14): `--allow pipy` (a preset misspelt) was taken as
// a host and the sandbox's pip failed with no word of why; a single-label
// name an edit or two from a preset is refused, naming the preset, and a
// host of that name is still written with its trailing dot.
func TestPresetTyposAreNamed(t *testing.T) {
	for typo, want := range map[string]string{"pipy": "pypi", "PyPl": "pypi", "npn": "npm", "nmp": "npm", "debain": "debian", "githb": "github", "og": "go"} {
		err := (&Policy{}).Add(true, typo)
		if err == nil || !strings.Contains(err.Error(), `did you mean "`+want+`"`) || !strings.Contains(err.Error(), `write "`+typo+`."`) {
			t.Errorf("--allow %s: %v", typo, err)
		}
	}
	for _, ok := range []string{"pypi", "npm", "go", "pipy.", "pypi.org", "files.pythonhosted.org", "localhost", "git", "gitea", "*.npm.test", "npm.test:8443", "192.0.2.1"} {
		p := &Policy{}
		if err := p.Add(true, ok); err != nil {
			t.Errorf("--allow %s: %v", ok, err)
		}
	}
	// A tenant's huge name costs a bounded look, and is refused as no
	// host name, not offered as a preset.
	if err := (&Policy{}).Add(true, strings.Repeat("p", 1<<20)); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("a 1 MiB name: %.200v", err)
	}
	p := &Policy{}
	if err := p.Add(true, "pipy."); err != nil || !p.Check("pipy", 443).Allowed {
		t.Errorf("a host named pipy, written pipy.: %v %+v", err, p)
	}
}
