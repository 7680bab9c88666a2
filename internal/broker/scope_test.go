package broker

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// A placeholder-shaped string in the URL is stripped; if the grant judged
// the URL before that, ".<placeholder>." segments (a normal path) turn
// into ".." after it (a path outside the grant), and the real credential
// went with it. The grant must judge the URL that is sent.
func TestGrantJudgesTheURLAfterPlaceholdersAreStripped(t *testing.T) {
	now := time.Now()
	b := testBroker(&now)
	sp := grantSpec(t, 443, 0)
	sp.Grants = append(sp.Grants, spec.Grant{Secret: "github-ro", Env: "GIT_TOKEN", Host: "git.test", Port: 443,
		Allow: []string{"GET /acme/shop.git/info/refs?service=git-upload-pack"}})
	if err := sp.ValidateLongLived(); err != nil {
		t.Fatal(err)
	}
	sess, err := b.Session("sbx", sp, false)
	if err != nil {
		t.Fatal(err)
	}
	forged := "alk_" + strings.Repeat("A", 16) + "." + strings.Repeat("B", 43)
	seg := "." + forged + "."
	for _, c := range []struct{ name, host, url, tok string }{
		{"dot segments after stripping", "api.test", "https://api.test/repos/acme/shop/" + seg + "/" + seg + "/" + seg + "/orgs/acme/billing", sp.Grants[0].Token},
		{"a second query value after stripping", "git.test", "https://git.test/acme/shop.git/info/refs?service=git-upload-pack&serv" + forged + "ice=git-receive-pack", sp.Grants[1].Token},
	} {
		req, _ := http.NewRequest("GET", c.url, nil)
		req.Header.Set("Authorization", "Bearer "+c.tok)
		v := sess.Inspect(&egress.Inspected{Req: req, Host: c.host, Port: 443, TLS: true, Complete: true})
		if strings.Contains(req.Header.Get("Authorization"), realSecret) || v.Grant != "" {
			t.Errorf("%s: the credential went to %s (grant %q)", c.name, req.URL.RequestURI(), v.Grant)
		}
		if strings.Contains(req.URL.RequestURI(), "alk_") {
			t.Errorf("%s: the placeholder stayed in %s", c.name, req.URL.RequestURI())
		}
	}
}

// A grant covers its methods; a POST saying "X-HTTP-Method-Override:
// DELETE" (Google APIs, Laravel, Express's method-override) or carrying
// "_method=DELETE" (Rails, Laravel, Spring) is a DELETE to those servers,
// and gets no credential.
func TestGrantRefusesMethodOverrides(t *testing.T) {
	now := time.Now()
	b := testBroker(&now)
	sp := grantSpec(t, 443, 0)
	sp.Grants[0].Allow = []string{"GET,POST /repos/acme/shop/issues/**"}
	if err := sp.ValidateLongLived(); err != nil {
		t.Fatal(err)
	}
	sess, err := b.Session("sbx", sp, false)
	if err != nil {
		t.Fatal(err)
	}
	tok := sp.Grants[0].Token
	form := "application/x-www-form-urlencoded"
	multi := "multipart/form-data; boundary=XX"
	part := func(name string) string {
		return "--XX\r\nContent-Disposition: form-data; " + name + "\r\n\r\nDELETE\r\n--XX--\r\n"
	}
	for _, c := range []struct {
		name, query, header, ct, body string
		complete, want                bool
	}{
		{"plain", "", "", "", "", true, true},
		{"a form without _method", "", "", form, "title=x", true, true},
		{"a multipart form without _method", "", "", multi, part(`name="title"`), true, true},
		{"X-HTTP-Method-Override", "", "X-HTTP-Method-Override", "", "", true, false},
		{"X-HTTP-Method", "", "X-HTTP-Method", "", "", true, false},
		{"X-Method-Override", "", "X-Method-Override", "", "", true, false},
		{"_method in the query", "_method=DELETE", "", "", "", true, false},
		{"_method encoded in the query", "_m%65thod=DELETE", "", "", "", true, false},
		{"_method in a form", "", "", form, "a=1&%5Fmethod=DELETE", true, false},
		{"a form past what was read", "", "", form, "a=1", false, false},
		{"_method in a multipart form", "", "", multi, part(`name="_method"`), true, false},
		{"_method encoded in a multipart form", "", "", multi, part(`name*=utf-8''%5Fmethod`), true, false},
	} {
		u := "https://api.test/repos/acme/shop/issues/1"
		if c.query != "" {
			u += "?" + c.query
		}
		req, _ := http.NewRequest("POST", u, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if c.header != "" {
			req.Header.Set(c.header, "DELETE")
		}
		if c.ct != "" {
			req.Header.Set("Content-Type", c.ct)
		}
		sess.Inspect(&egress.Inspected{Req: req, Host: "api.test", Port: 443, TLS: true, Body: []byte(c.body), Complete: c.complete})
		if got := strings.Contains(req.Header.Get("Authorization"), realSecret); got != c.want {
			t.Errorf("%s: credential sent %v, want %v", c.name, got, c.want)
		}
	}
}
