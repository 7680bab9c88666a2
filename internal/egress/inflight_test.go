package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
)

// holdAll intercepts allowed.test with a self-signed certificate and
// holds every request it inspects until released, counting how many it
// holds at once.
type holdAll struct {
	cert    tls.Certificate
	now     atomic.Int32
	most    atomic.Int32
	release chan struct{}
}

func (h *holdAll) Intercepts(host string, _ int) bool           { return host == "allowed.test" }
func (h *holdAll) Certificate(string) (*tls.Certificate, error) { return &h.cert, nil }
func (h *holdAll) Redact([]string, []string) []eventlog.Finding { return nil }

func (h *holdAll) Inspect(*Inspected) Verdict {
	n := h.now.Add(1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-h.release
	h.now.Add(-1)
	return Verdict{Refuse: "test"}
}

func selfSigned(t *testing.T, name string) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Every request of an intercepted connection holds up to 256 KiB of body
// in the daemon while it is inspected and sent on, and HTTP/2 carries 250
// at once on each connection: 256 connections made 16 GB. Requests in
// flight through interception share the sandbox's connection cap.
func TestInterceptedRequestsShareTheConnectionCap(t *testing.T) {
	h := &holdAll{cert: selfSigned(t, "allowed.test"), release: make(chan struct{})}
	_, _, ports := startProxyWith(t, func(c *Config) { c.Inspector = h; c.MaxConns = 4 })
	tport := strings.Fields(ports)[1]
	pu, _ := url.Parse("http://" + testListen + ":3128")
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DialContext: d.DialContext,
		ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxConnsPerHost: 1}}
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Post("https://allowed.test:"+tport+"/x", "text/plain", strings.NewReader("body"))
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	most := h.most.Load()
	close(h.release)
	wg.Wait()
	if most == 0 || most > 4 {
		t.Errorf("%d requests inspected at once on one connection, cap 4", most)
	}
}
