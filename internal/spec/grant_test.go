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

func TestRequestRuleRefused(t *testing.T) {
	for _, s := range []string{"", "GET", "/x", "get /x", "GET x", "GET /a/../b", "GET /a/**/b", "GET /a/b*", "FETCH /", "GET /%2e", "GET /x?", "GET /x?a=1&a=2"} {
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

func FuzzRequestRule(f *testing.F) {
	f.Add("GET,HEAD /repos/acme/shop/**", "GET", "/repos/acme/shop/x")
	f.Add("GET /acme/shop.git/info/refs?service=git-upload-pack", "GET", "/acme/shop.git/info/refs?service=git-upload-pack")
	f.Fuzz(func(t *testing.T, rule, method, target string) {
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
		// Whatever matched is in normal form and under the rule's fixed
		// prefix: no dot segment or encoded separator got through.
		segs, ok := NormalPath(u)
		if !ok {
			t.Fatalf("%q matched %q outside normal form", rule, target)
		}
		for _, s := range segs {
			if s == ".." || s == "." || strings.ContainsAny(s, "/\\") {
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
