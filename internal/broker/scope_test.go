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
