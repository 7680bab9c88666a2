package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/egress/policy"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/miekg/dns"
)

const realSecret = "ghp_REALsecretVALUEthatMUSTneverLEAVE0001"

// startProxy runs sandbox sbx's egress proxy on this run's loopback
// address, its decisions to rec, inspected by insp; upstream TLS is
// verified against roots (nil: the host's). The fake API is on loopback:
// this "host" has no address of its own.
func startProxy(t *testing.T, sbx string, pol *policy.Policy, rec *eventlog.Recorder, insp egress.Inspector, roots *x509.CertPool) *egress.Proxy {
	t.Helper()
	px, err := egress.Start(egress.Config{
		Sandbox: sbx, Listen: testListen, Interface: "lo", Peer: netip.MustParseAddr("127.0.0.1"), Policy: pol,
		Guard:    &policy.Guard{AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Local: func() ([]netip.Prefix, error) { return nil, nil }},
		Upstream: fakeDNS(t), Recorder: rec, Inspector: insp, UpstreamRoots: roots,
	})
	if err != nil {
		t.Fatal(err)
	}
	return px
}

// testListen is where the tests' proxies listen: an address of the
// loopback range of this run's own, so that two runs of these tests on one
// host do not take each other's ports.
var testListen = netip.AddrFrom4([4]byte{127, byte(1 + mrand.IntN(254)), byte(1 + mrand.IntN(254)), 4})

func testBroker(now *time.Time) *Broker {
	return New(Config{Keys: keys.Ephemeral(), Now: func() time.Time { return *now }, Secret: func(tenant, name string) ([]byte, error) {
		if tenant == "acme" && name == "github-ro" {
			return []byte(realSecret), nil
		}
		return nil, fmt.Errorf("secret %q not found", name)
	}})
}

func grantSpec(t *testing.T, port int, ttl time.Duration) *spec.Spec {
	t.Helper()
	s := spec.Default()
	s.Tenant, s.Scan, s.Timeout = "acme", "block", time.Hour
	s.Grants = []spec.Grant{{Secret: "github-ro", Env: "GITHUB_TOKEN", Host: "api.test", Port: port, Allow: []string{"GET,HEAD /repos/acme/shop/**"}, TTL: ttl}}
	if err := s.ValidateLongLived(); err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestTokens(t *testing.T) {
	now := time.Now()
	b := testBroker(&now)
	s1 := grantSpec(t, 443, 10*time.Minute)
	if _, err := b.Session("sbx1", s1, false); err != nil {
		t.Fatal(err)
	}
	s2 := grantSpec(t, 443, 0)
	if _, err := b.Session("sbx2", s2, false); err != nil {
		t.Fatal(err)
	}
	tok1, tok2 := s1.Grants[0].Token, s2.Grants[0].Token
	if !strings.HasPrefix(tok1, TokenPrefix) || tok1 == tok2 || !strings.Contains(strings.Join(s1.Env, "\n"), "GITHUB_TOKEN="+tok1) {
		t.Fatalf("tokens: %q %q env %v", tok1, tok2, s1.Env)
	}
	u, _ := url.Parse("/repos/acme/shop/pulls")
	c, err := b.Verify(tok1, "sbx1")
	if err != nil || !c.Allows("api.test", 443, "GET", u) {
		t.Fatalf("a good token: %v", err)
	}
	other, _ := url.Parse("/repos/acme/other")
	if c.Allows("api.test", 443, "GET", other) || c.Allows("api.test", 443, "POST", u) || c.Allows("evil.test", 443, "GET", u) || c.Allows("api.test", 8443, "GET", u) {
		t.Error("a token allowed a request outside its scope")
	}
	if _, err := b.Verify(tok2, "sbx1"); !errors.Is(err, ErrOtherSandbox) {
		t.Errorf("replayed from another sandbox: %v", err)
	}
	forged := tok1[:len(tok1)-2] + "AA"
	if _, err := b.Verify(forged, "sbx1"); !errors.Is(err, ErrForged) && !errors.Is(err, ErrMalformed) {
		t.Errorf("forged: %v", err)
	}
	if _, err := New(Config{Keys: keys.Ephemeral()}).Verify(tok1, "sbx1"); !errors.Is(err, ErrForged) {
		t.Errorf("another broker's key: %v", err)
	}
	now = now.Add(11 * time.Minute) // past the grant's TTL, within the sandbox's
	if _, err := b.Verify(tok1, "sbx1"); !errors.Is(err, ErrExpired) {
		t.Errorf("after its TTL: %v", err)
	}
	if _, err := b.Verify(tok2, "sbx2"); err != nil {
		t.Errorf("the sandbox-long token: %v", err)
	}
	// Past the sandbox's first TTL (it may have been extended): a token
	// without a TTL of its own ends with the sandbox, by revocation.
	now = now.Add(2 * time.Hour)
	if _, err := b.Verify(tok2, "sbx2"); err != nil {
		t.Errorf("the sandbox-long token of an extended sandbox: %v", err)
	}
	b.End("sbx2")
	if _, err := b.Verify(tok2, "sbx2"); !errors.Is(err, ErrRevoked) {
		t.Errorf("after destroy: %v", err)
	}
	// A restarted daemon takes the tokens back from the spec.
	b2 := testBroker(&now)
	b2.cfg.Keys = b.cfg.Keys
	b2.cfg.Dir = t.TempDir()
	s3 := grantSpec(t, 443, 0)
	if _, err := b2.Session("sbx3", s3, false); err != nil {
		t.Fatal(err)
	}
	b3 := New(Config{Keys: b.cfg.Keys, Dir: b2.cfg.Dir, Now: b2.cfg.Now})
	if _, err := b3.Verify(s3.Grants[0].Token, "sbx3"); !errors.Is(err, ErrRevoked) {
		t.Errorf("unknown to a new broker: %v", err)
	}
	ss, err := b3.Session("sbx3", s3, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b3.Verify(s3.Grants[0].Token, "sbx3"); err != nil || ss.CAPEM() == nil {
		t.Errorf("adopted: %v", err)
	}
	b3.End("sbx3")
	if _, err := os.Stat(b2.cfg.Dir + "/sbx3"); !os.IsNotExist(err) {
		t.Errorf("the CA outlived its sandbox: %v", err)
	}
}

func TestCANameConstraints(t *testing.T) {
	ca, err := NewCA("sbx", []string{"api.test"}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	leaf, err := ca.Leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: pool}); err != nil {
		t.Fatalf("the granted host: %v", err)
	}
	if _, err := ca.Leaf("evil.test"); err == nil {
		t.Error("a leaf was minted for a host without a grant")
	}
	// Even the CA's own key cannot vouch for another host or an address.
	for _, c := range []struct {
		name string
		tmpl *x509.Certificate
	}{
		{"evil.test", &x509.Certificate{DNSNames: []string{"evil.test"}}},
		{"10.0.0.1", &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}}},
	} {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		c.tmpl.SerialNumber, c.tmpl.NotBefore, c.tmpl.NotAfter = big.NewInt(9), time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
		c.tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		der, err := x509.CreateCertificate(rand.Reader, c.tmpl, ca.cert, &key.PublicKey, ca.key)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: c.name, Roots: pool}); err == nil {
			t.Errorf("a certificate for %s under the sandbox's CA verified", c.name)
		}
	}
}

// upstream is a fake API host that records the headers, URLs and bodies
// it receives.
type upstream struct {
	mu   sync.Mutex
	seen []string
	port int
	ca   *x509.CertPool
}

func (u *upstream) all() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return strings.Join(u.seen, "\n")
}

func (u *upstream) last() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) == 0 {
		return ""
	}
	return u.seen[len(u.seen)-1]
}

func startUpstream(t *testing.T) *upstream {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "upstream CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: []string{"api.test", "other.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, _ := x509.CreateCertificate(rand.Reader, lt, caCert, &key.PublicKey, caKey)
	u := &upstream{ca: x509.NewCertPool()}
	u.ca.AddCert(caCert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen = append(u.seen, fmt.Sprintf("%s %s %s auth=%q x=%q body=%q", r.Proto, r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), r.Header.Get("X-Note"), b))
		u.mu.Unlock()
		fmt.Fprintf(w, "ok %s", r.URL.Path)
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	u.port, _ = strconv.Atoi(port)
	return u
}

func fakeDNS(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if q := r.Question[0]; q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR(q.Name + " 60 IN A 127.0.0.1")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

// TestProxyActsForTheSandbox runs the egress proxy with a session and
// tries every way a placeholder could reach the wrong place.
func TestProxyActsForTheSandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the DNS forwarder binds port 53: needs root")
	}
	up := startUpstream(t)
	now := time.Now()
	b := testBroker(&now)
	sp := grantSpec(t, up.port, 10*time.Minute)
	sess, err := b.Session("sbx1", sp, false)
	if err != nil {
		t.Fatal(err)
	}
	tok := sp.Grants[0].Token
	other := grantSpec(t, up.port, 0)
	if _, err := b.Session("sbx2", other, false); err != nil {
		t.Fatal(err)
	}
	pol := &policy.Policy{}
	if err := pol.Add(true, fmt.Sprintf("api.test:%d", up.port), fmt.Sprintf("other.test:%d", up.port)); err != nil {
		t.Fatal(err)
	}
	var events []eventlog.Event
	var evMu sync.Mutex
	rec := eventlog.NewRecorder(nil, func(e eventlog.Event) { evMu.Lock(); events = append(events, e); evMu.Unlock() })
	px := startProxy(t, "sbx1", pol, rec, sess, up.ca)
	t.Cleanup(px.Close)

	// The sandbox trusts its own CA (for granted hosts) and the world's.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(sess.CAPEM())
	onlyOurs := roots
	pu, _ := url.Parse("http://" + testListen.String() + ":3128")
	client := func(h2 bool, pool *x509.CertPool) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu), ForceAttemptHTTP2: h2, TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	do := func(c *http.Client, method, u, auth, body string) (int, string, *http.Response) {
		t.Helper()
		req, _ := http.NewRequest(method, u, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error(), nil
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out), resp
	}
	api := fmt.Sprintf("https://api.test:%d", up.port)
	c1 := client(false, onlyOurs)

	code, body, _ := do(c1, "GET", api+"/repos/acme/shop/pulls", "Bearer "+tok, "")
	if code != 200 || !strings.HasSuffix(up.last(), ` GET /repos/acme/shop/pulls auth="Bearer `+realSecret+`" x="" body=""`) {
		t.Fatalf("a request the grant covers: %d %s; upstream saw %s", code, body, up.last())
	}
	for _, c := range []struct{ name, method, path, auth, body string }{
		{"another repository", "GET", "/repos/acme/other", "Bearer " + tok, ""},
		{"a method outside the grant", "POST", "/repos/acme/shop/pulls", "Bearer " + tok, ""},
		{"a dot-dot path", "GET", "/repos/acme/shop/%2e%2e/other", "Bearer " + tok, ""},
		{"the placeholder in the URL", "GET", "/repos/acme/shop/x?access_token=" + tok, "", ""},
		{"the placeholder in the body", "PUT", "/repos/acme/shop/x", "", `{"token":"` + tok + `"}`},
		{"the placeholder as basic auth", "GET", "/repos/acme/shop/x", "Basic " + base64Std("u:"+tok), ""},
		{"another sandbox's token", "GET", "/repos/acme/shop/x", "Bearer " + other.Grants[0].Token, ""},
	} {
		code, body, _ := do(c1, c.method, api+c.path, c.auth, c.body)
		if strings.Contains(up.last(), realSecret) || strings.Contains(up.last(), "alk_") {
			t.Errorf("%s: upstream saw %s (%d %s)", c.name, up.last(), code, body)
		}
	}
	// HTTP/2: each stream on one connection is judged on its own.
	c2 := client(true, onlyOurs)
	_, _, resp := do(c2, "GET", api+"/repos/acme/shop", "Bearer "+tok, "")
	if resp == nil || resp.ProtoMajor != 2 || !strings.Contains(up.last(), realSecret) {
		t.Errorf("HTTP/2 in scope: %v; upstream saw %s", resp, up.last())
	}
	do(c2, "GET", api+"/repos/acme/other", "Bearer "+tok, "")
	if strings.Contains(up.last(), realSecret) || strings.Contains(up.last(), "alk_") || !strings.Contains(up.last(), " GET /repos/acme/other") {
		t.Errorf("HTTP/2 out of scope: upstream saw %s", up.last())
	}
	// A host without a grant is a plain tunnel: its certificate is the
	// world's, which the sandbox's own CA cannot vouch for.
	if code, _, _ := do(c1, "GET", fmt.Sprintf("https://other.test:%d/", up.port), "", ""); code != 0 {
		t.Errorf("other.test verified under the sandbox's CA: intercepted (%d)", code)
	}
	world := client(false, up.ca)
	if code, _, _ := do(world, "GET", fmt.Sprintf("https://other.test:%d/x", up.port), "Bearer "+tok, ""); code != 200 || !strings.Contains(up.last(), "alk_") {
		t.Errorf("the tunnel to other.test: %d, upstream saw %s", code, up.last())
	}
	// Secret scanning (policy block): a pasted key does not leave.
	pasted := "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	n := len(up.all())
	code, body, _ = do(c1, "POST", api+"/repos/acme/shop/issues", "", `{"body":"my key is `+pasted+`"}`)
	if code != 403 || !strings.Contains(body, "github-pat") || strings.Contains(body, pasted) || len(up.all()) != n {
		t.Errorf("a pasted key in a body: %d %q", code, body)
	}
	// Expired (the grant's TTL): refused and stripped.
	now = now.Add(11 * time.Minute)
	do(c1, "GET", api+"/repos/acme/shop/pulls", "Bearer "+tok, "")
	if strings.Contains(up.last(), realSecret) {
		t.Errorf("an expired token was honoured: %s", up.last())
	}
	now = now.Add(-11 * time.Minute)
	b.End("sbx1")
	do(c1, "GET", api+"/repos/acme/shop/pulls", "Bearer "+tok, "")
	if strings.Contains(up.last(), realSecret) {
		t.Errorf("a revoked token was honoured: %s", up.last())
	}

	evMu.Lock()
	defer evMu.Unlock()
	j, _ := json.Marshal(events)
	for _, leak := range []string{realSecret, tok, pasted} {
		if strings.Contains(string(j), leak) {
			t.Errorf("the event log holds %q", leak)
		}
	}
	var granted, stripped int
	for _, e := range events {
		if e.Grant != "" {
			granted++
		}
		for _, f := range e.Findings {
			if f.Rule == PlaceholderRule && f.Action == "stripped" {
				stripped++
			}
		}
	}
	if granted != 2 || stripped < 8 {
		t.Errorf("events: %d with the grant (want 2), %d placeholders stripped:\n%s", granted, stripped, j)
	}
}

func base64Std(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// Redact and record on what the proxy reads: the key is replaced (or
// kept) where it was, and found in headers, URL and body alike.
func TestInspectRedactsAndRecords(t *testing.T) {
	key := "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	for _, policy := range []string{"redact", "record"} {
		now := time.Now()
		b := testBroker(&now)
		sp := grantSpec(t, 443, 0)
		sp.Scan = policy
		sess, err := b.Session("sbx", sp, false)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", "https://api.test/repos/acme/shop/x?k="+key, nil)
		req.Header.Set("X-Note", "token "+key)
		in := &egress.Inspected{Req: req, Host: "api.test", Port: 443, TLS: true, Body: []byte(`{"t":"` + key + `"}`), Complete: true}
		v := sess.Inspect(in)
		if v.Refuse != "" || len(v.Findings) != 3 {
			t.Fatalf("%s: %+v", policy, v)
		}
		got := req.Header.Get("X-Note") + " " + req.URL.RawQuery + " " + string(in.Body)
		if policy == "redact" && (strings.Contains(got, key) || strings.Count(got, "[REDACTED:github-pat]") != 3) {
			t.Errorf("redact left %q", got)
		}
		if policy == "record" && strings.Count(got, key) != 3 {
			t.Errorf("record changed the request: %q", got)
		}
		for _, f := range v.Findings {
			if f.Rule != "github-pat" || f.Action != map[string]string{"redact": "redacted", "record": "recorded"}[policy] {
				t.Errorf("%s: finding %+v", policy, f)
			}
		}
	}
}

// Findings of a joined scan land in the part they are in, with offsets
// local to its text (a prefix is context, not part of it).
func TestScanPartsAttributes(t *testing.T) {
	key := "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	b := New(Config{Keys: keys.Ephemeral()})
	parts := []Part{{Text: "curl"}, {Prefix: "X-Note: ", Text: "token " + key}, {Text: "https://x"}}
	fs, err := b.ScanParts(parts, '\n')
	if err != nil || len(fs) != 1 || fs[0].Part != 1 || parts[1].Text[fs[0].Start:fs[0].End] != key {
		t.Fatalf("%+v %v", fs, err)
	}
	texts := []string{parts[0].Text, parts[1].Text, parts[2].Text}
	RedactParts(texts, fs)
	if texts[1] != "token [REDACTED:github-pat]" || texts[0] != "curl" || texts[2] != "https://x" {
		t.Errorf("%q", texts)
	}
}
