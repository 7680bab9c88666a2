package spec

import (
	"net/url"
	"strings"
	"testing"
)

func TestRequestRuleMatches(t *testing.T) {
	api := "GET,HEAD /repos/acme/shop/**"
	refs := "GET /acme/shop.git/info/refs?service=git-upload-pack"
	pack := "POST /acme/shop.git/git-upload-pack"
	for _, c := range []struct {
		rule, method, url string
		want              bool
	}{
		{api, "GET", "/repos/acme/shop", true},
		{api, "GET", "/repos/acme/shop/", true},
		{api, "HEAD", "/repos/acme/shop/pulls/1", true},
		{api, "POST", "/repos/acme/shop/pulls", false},
		{api, "GET", "/repos/acme/shopx", false},
		{api, "GET", "/repos/acme/other", false},
		{api, "GET", "/repos/acme/shop/../other", false},
		{api, "GET", "/repos/acme/shop/%2e%2e/other", false},
		{api, "GET", "/repos/acme/shop%2f..%2fother", false},
		{api, "GET", "/repos/acme//shop", false},
		{api, "GET", "/repos/acme/shop/./x", false},
		{api, "GET", "/repos/ACME/shop", false},
		{api, "GET", "/repos/acme/sh%6fp", true}, // decoded: the same path
		{refs, "GET", "/acme/shop.git/info/refs?service=git-upload-pack", true},
		{refs, "GET", "/acme/shop.git/info/refs?service=git-receive-pack", false},
		{refs, "GET", "/acme/shop.git/info/refs?service=git-upload-pack&service=git-receive-pack", false},
		{refs, "GET", "/acme/shop.git/info/refs", false},
		{pack, "POST", "/acme/shop.git/git-upload-pack", true},
		{pack, "POST", "/acme/shop.git/git-receive-pack", false},
		{pack, "POST", "/acme/other.git/git-upload-pack", false},
		{"GET /a/*/c", "GET", "/a/b/c", true},
		{"GET /a/*/c", "GET", "/a/b/x/c", false},
		{"GET /", "GET", "/", true},
		{"GET /", "GET", "/x", false},
		{api, "GET", "/repos/acme/shop/a%20b", true}, // a blank is no dot
		{api, "GET", "/repos/acme/shop/v1.2", true},
		{api, "GET", "/repos/acme/shop/.well-known", true},
	} {
		r, err := ParseRequestRule(c.rule)
		if err != nil {
			t.Fatalf("%s: %v", c.rule, err)
		}
		u, err := url.ParseRequestURI(c.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Matches(c.method, u); got != c.want {
			t.Errorf("%s on %s %s: %v, want %v", c.rule, c.method, c.url, got, c.want)
		}
	}
}

// dotVariants are ways to write ".." (or another path separator trick)
// that some server reads as "..": every one, anywhere in a path, makes the
// path match no rule, so the credential is never sent with it.
var dotVariants = []string{
	"..;", "..;x", "..%3B", "..%3b", ";", "x;y", // path parameters (Tomcat, Jetty, Spring)
	"%252e%252e", "%252E%252E", "%25", "%2e%2e", ".%2e", "%2e.", // encoded and double-encoded dots
	"%c0%ae%c0%ae", "%C0%AE.", "%e0%80%ae%e0%80%ae", "%c0%2e", // overlong UTF-8 dots
	"．．", "%EF%BC%8E%EF%BC%8E", "‥", "%E2%80%A5", "。。", "︙", // fullwidth and other dots
	"...", "..%20", "%20..", "..%09", ". .", "..%00", "..%0a", "..%5c", "..\\", "..%2f", // dot-like and separators
	"é", "%C3%A9", "%ff", "%7f", // non-ASCII, control
}

func TestRequestRuleRefusesDotVariants(t *testing.T) {
	r, err := ParseRequestRule("GET,HEAD /repos/acme/shop/**")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range dotVariants {
		for _, target := range []string{
			"/repos/acme/shop/" + v + "/other/secrets",
			"/repos/acme/shop/" + v,
			"/repos/acme/shop/" + v + "/",
			"/repos/acme/shop/x/" + v + "/y",
		} {
			u, err := url.ParseRequestURI(target)
			if err != nil {
				continue // no client can send it
			}
			if r.Matches("GET", u) {
				t.Errorf("%q matched", target)
			}
		}
	}
	// Every variant from issue 12, by name, parsed as a proxy parses a
	// request line.
	for _, target := range []string{"/repos/acme/shop/..;/other", "/repos/acme/shop/..%3B/other", "/repos/acme/shop/%252e%252e/other",
		"/repos/acme/shop/%c0%ae%c0%ae/other", "/repos/acme/shop/．．/other", "/repos/acme/shop/‥/other"} {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if r.Matches("GET", u) {
			t.Errorf("%q matched", target)
		}
	}
}

func TestRequestRuleRefused(t *testing.T) {
	for _, s := range []string{"", "GET", "/x", "get /x", "GET x", "GET /a/../b", "GET /a/**/b", "GET /a/b*", "FETCH /", "GET /%2e", "GET /x?", "GET /x?a=1&a=2",
		"GET /a/.../b", "GET /a/..;/b", "GET /a;b", "GET /a/．．/b", "GET /é", "GET /a\x7f", "GET /a/. ./b", "GET /a b"} {
		if _, err := ParseRequestRule(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func TestGrantValidation(t *testing.T) {
	ok := Grant{Secret: "github-ro", Host: "api.github.com", Allow: []string{"GET /repos/acme/shop/**"}}
	s := Default()
	s.Grants = []Grant{ok}
	if err := s.ValidateLongLived(); err != nil {
		t.Fatal(err)
	}
	g := s.Grants[0]
	if g.Env != "AIRLOCK_GRANT_GITHUB_RO" || g.Port != 443 || g.Header != "Authorization" || g.Scheme != "bearer" || s.NetMode() != "proxy" {
		t.Errorf("defaults: %+v", g)
	}
	for name, mut := range map[string]func(*Grant){
		"wildcard host":   func(g *Grant) { g.Host = "*.github.com" },
		"ip host":         func(g *Grant) { g.Host = "10.0.0.1" },
		"bad secret":      func(g *Grant) { g.Secret = "../x" },
		"reserved header": func(g *Grant) { g.Header = "Host" },
		"bad scheme":      func(g *Grant) { g.Scheme = "digest" },
		"no rules":        func(g *Grant) { g.Allow = nil },
		"basic elsewhere": func(g *Grant) { g.Scheme, g.Header = "basic", "X-Token" },
		"bad env":         func(g *Grant) { g.Env = "1X" },
	} {
		s := Default()
		g := ok
		mut(&g)
		s.Grants = []Grant{g}
		if err := s.ValidateLongLived(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	s = Default()
	s.Env = []string{"GITHUB_TOKEN=x"}
	s.Grants = []Grant{ok}
	s.Grants[0].Env = "GITHUB_TOKEN"
	if err := s.ValidateLongLived(); err == nil || !strings.Contains(err.Error(), "already set") {
		t.Errorf("a grant over a set variable: %v", err)
	}
}

// FuzzRequestRule: whatever matches is in normal form and under the
// rule's fixed prefix; and a path that matched stops matching once any of
// dotVariants is put in as a segment of its own, or glued to a segment
// when it holds more than dots and blanks.
func FuzzRequestRule(f *testing.F) {
	f.Add("GET,HEAD /repos/acme/shop/**", "GET", "/repos/acme/shop/x", uint8(0), uint8(0))
	f.Add("GET /acme/shop.git/info/refs?service=git-upload-pack", "GET", "/acme/shop.git/info/refs?service=git-upload-pack", uint8(3), uint8(1))
	for i, v := range dotVariants {
		f.Add("GET /a/**", "GET", "/a/"+v+"/b", uint8(i), uint8(i))
	}
	f.Fuzz(func(t *testing.T, rule, method, target string, which, where uint8) {
		r, err := ParseRequestRule(rule)
		if err != nil {
			return
		}
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return
		}
		if !r.Matches(method, u) {
			return
		}
		// The same request with a variant in its path: never a match.
		v := dotVariants[int(which)%len(dotVariants)]
		p := u.EscapedPath()
		cuts := []int{}
		for i := 0; i <= len(p); i++ {
			if i == len(p) || p[i] == '/' {
				cuts = append(cuts, i)
			}
		}
		at := cuts[int(where)%len(cuts)]
		bads := []string{p[:at] + "/" + v + p[at:]}
		if d, err := url.PathUnescape(v); err != nil || strings.Trim(d, ". ") != "" {
			bads = append(bads, p[:at]+v+p[at:])
		}
		for _, bad := range bads {
			if bu, err := url.ParseRequestURI(bad); err == nil && r.Matches(method, bu) {
				t.Fatalf("%q matched %q, with %q put in", rule, bad, v)
			}
		}
		// Whatever matched is in normal form and under the rule's fixed
		// prefix: no dot segment or encoded separator got through.
		segs, ok := NormalPath(u)
		if !ok {
			t.Fatalf("%q matched %q outside normal form", rule, target)
		}
		if strings.Contains(strings.ToLower(u.EscapedPath()), "%25") {
			t.Fatalf("%q matched %q, double-encoded", rule, target)
		}
		for _, s := range segs {
			if strings.Contains(s, ".") && strings.Trim(s, " \t.") == "" || strings.ContainsAny(s, "/\\;%") || strings.ContainsFunc(s, func(c rune) bool { return c < 0x20 || c > 0x7e }) {
				t.Fatalf("%q matched %q with segment %q", rule, target, s)
			}
		}
		for i, s := range r.Segments {
			if s == "*" || s == "**" {
				break
			}
			if i >= len(segs) || segs[i] != s {
				t.Fatalf("%q matched %q outside its prefix", rule, target)
			}
		}
	})
}

// A request line such as "GET https:repos/acme/other" parses with an empty
// path and an opaque part, which a proxy sends on as the request target
// ("GET repos/acme/other"): it is no path in normal form, and matches no
// rule, "GET /" included.
func TestRequestRuleRefusesOpaqueTargets(t *testing.T) {
	for _, rule := range []string{"GET /", "GET /**", "GET /repos/**"} {
		r, err := ParseRequestRule(rule)
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range []string{"https:repos/acme/other", "http:repos/x", "foo:bar", "https:%2F%2Fevil.test/x"} {
			u, err := url.ParseRequestURI(target)
			if err != nil || u.Opaque == "" {
				t.Fatalf("%s: %v %#v", target, err, u)
			}
			if r.Matches("GET", u) {
				t.Errorf("%s matched %q (sent on as %q)", rule, target, u.RequestURI())
			}
		}
	}
}
