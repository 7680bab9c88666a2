package egress

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
)

// allowAll intercepts allowed.test with a self-signed certificate and
// lets every request through.
type allowAll struct{ cert tls.Certificate }

func (a *allowAll) Intercepts(host string, _ int) bool           { return host == "allowed.test" }
func (a *allowAll) Certificate(string) (*tls.Certificate, error) { return &a.cert, nil }
func (a *allowAll) Redact([]string, []string) []eventlog.Finding { return nil }
func (a *allowAll) Inspect(*Inspected) Verdict                   { return Verdict{} }

// A request body on an intercepted connection (a granted host's) stops
// at the byte cap as a plain one does: the server never reads a body byte
// past it.
func TestInterceptedBodyStopsAtTheCap(t *testing.T) {
	const limit = 200000
	got := make(chan int, 1)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got <- int(n)
	}))
	serverCert := selfSigned(t, "allowed.test")
	up.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}}
	up.StartTLS()
	t.Cleanup(up.Close)
	leaf, err := x509.ParseCertificate(serverCert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	startProxyWith(t, func(c *Config) {
		c.Inspector = &allowAll{cert: selfSigned(t, "allowed.test")}
		c.UpstreamRoots = roots
		c.MaxBytesOut = limit
	}, "allowed.test:"+port)
	pu, _ := url.Parse("http://" + testListen + ":3128")
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Post("https://allowed.test:"+port+"/up", "text/plain", strings.NewReader(strings.Repeat("x", 1<<20)))
	if err == nil {
		resp.Body.Close()
	}
	select {
	case n := <-got:
		if n > limit {
			t.Errorf("the server read %d body bytes through interception, past the cap %d by %d", n, limit, n-limit)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the server")
	}
}
