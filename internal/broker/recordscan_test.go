package broker

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/egress/policy"
)

// Under the record policy a request goes on unchanged, and its record
// kept the credential pasted in its path: in the event's path, in the
// "out of scope" reason of a grant's refused placeholder; a request the
// egress policy denied was recorded without being scanned at all, under
// every policy (its path, its host, the reason naming the host). The
// record of a decision holds no credential the scanner finds, whatever
// the policy; the request under record is still sent as it was.
func TestRecordHoldsNoCredentialWhateverThePolicy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the DNS forwarder binds port 53: needs root")
	}
	const aws = "AKIAQ4ZT6WX2LR7NPJ3V"
	const ghp = "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	var plainMu sync.Mutex
	var plainSeen []string
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainMu.Lock()
		plainSeen = append(plainSeen, r.URL.Path)
		plainMu.Unlock()
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(plain.Close)
	_, port, _ := net.SplitHostPort(plain.Listener.Addr().String())
	up := startUpstream(t)
	// A path the record cuts (2048 bytes) with the key across the cut:
	// no part of it may stay.
	cut := "/" + strings.Repeat("a/", 1007) + aws + "/" + strings.Repeat("b", 100)
	for _, scanPolicy := range []string{"block", "redact", "record"} {
		t.Run(scanPolicy, func(t *testing.T) {
			now := time.Now()
			b := testBroker(&now)
			sp := grantSpec(t, up.port, 0)
			sp.Scan = scanPolicy
			sess, err := b.Session("sbx", sp, false)
			if err != nil {
				t.Fatal(err)
			}
			tok := sp.Grants[0].Token
			pol := &policy.Policy{}
			if err := pol.Add(true, "plain.test:"+port, fmt.Sprintf("api.test:%d", up.port)); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var events []eventlog.Event
			rec := eventlog.NewRecorder(nil, func(e eventlog.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
			px := startProxy(t, "sbx", pol, rec, sess, up.ca)
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(sess.CAPEM())
			pu, _ := url.Parse("http://" + testListen.String() + ":3128")
			c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: roots}}}
			get := func(u, auth string) {
				t.Helper()
				req, _ := http.NewRequest("GET", u, nil)
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("%.80s: %v", u, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			get("http://plain.test:"+port+"/keys/"+aws+"/"+ghp, "")
			get("http://plain.test:"+port+cut, "")
			get("http://denied.test/keys/"+aws+"?k="+ghp, "")
			get("http://"+ghp+".denied.test/x", "")
			get("http://denied.test/tokens/"+tok, "")
			if scanPolicy != "block" {
				// Outside the grant's rules: the placeholder is refused,
				// and the reason names the path.
				get(fmt.Sprintf("https://api.test:%d/repos/acme/other/%s", up.port, aws), "Bearer "+tok)
			}
			c.CloseIdleConnections()
			px.Close()
			mu.Lock()
			j, _ := json.Marshal(events)
			n := len(events)
			mu.Unlock()
			if n < 5 {
				t.Errorf("%d events: %s", n, j)
			}
			for _, leak := range []string{aws, aws[:10], ghp, strings.ToLower(ghp), tok} {
				if strings.Contains(string(j), leak) {
					t.Errorf("the record holds %.12s...: %s", leak, j)
				}
			}
			for _, want := range []string{"[REDACTED:aws-access-token]", "[REDACTED:github-pat]", "[REDACTED:" + PlaceholderRule + "]", `"fingerprint"`} {
				if !strings.Contains(string(j), want) {
					t.Errorf("the record has no %s: %s", want, j)
				}
			}
			plainMu.Lock()
			seen := strings.Join(plainSeen, "\n")
			plainSeen = nil
			plainMu.Unlock()
			if sent := strings.Contains(seen, "/keys/"+aws+"/"+ghp); sent != (scanPolicy == "record") {
				t.Errorf("the server saw %q", seen)
			}
		})
	}
}
