package broker

import (
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

// The proxy's record of a request (an audit record in the daemon) took
// the path as the sandbox sent it, before the inspector read it: a pasted
// key in a path the scanner blocked or redacted, and a placeholder the
// broker stripped, were written to the record all the same.
func TestRecordHoldsNoSecretOfThePath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the DNS forwarder binds port 53: needs root")
	}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	t.Cleanup(plain.Close)
	_, port, _ := net.SplitHostPort(plain.Listener.Addr().String())
	key := "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	for _, scanPolicy := range []string{"block", "redact"} {
		now := time.Now()
		b := testBroker(&now)
		sp := grantSpec(t, 443, 0)
		sp.Scan = scanPolicy
		sess, err := b.Session("sbx", sp, false)
		if err != nil {
			t.Fatal(err)
		}
		tok := sp.Grants[0].Token
		pol := &policy.Policy{}
		if err := pol.Add(true, "plain.test:"+port); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var events []eventlog.Event
		rec := eventlog.NewRecorder(nil, func(e eventlog.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
		px := startProxy(t, "sbx", pol, rec, sess, nil)
		pu, _ := url.Parse("http://" + testListen.String() + ":3128")
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
		for _, p := range []string{"/keys/" + key, "/tokens/" + tok} {
			resp, err := c.Get("http://plain.test:" + port + p)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		c.CloseIdleConnections()
		px.Close()
		mu.Lock()
		j, _ := json.Marshal(events)
		mu.Unlock()
		if len(events) != 2 {
			t.Errorf("%s: %d events, want 2: %s", scanPolicy, len(events), j)
		}
		for _, leak := range []string{key, tok} {
			if strings.Contains(string(j), leak) {
				t.Errorf("%s: the record holds %.12s...: %s", scanPolicy, leak, j)
			}
		}
	}
}
