package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
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

	"github.com/miekg/dns"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/egress/policy"
)

// fakeDNS answers A queries from a table, on 127.0.0.1.
func fakeDNS(t testing.TB, table map[string]string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if ip, ok := table[strings.TrimSuffix(q.Name, ".")]; ok && q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR(fmt.Sprintf("%s 60 IN A %s", q.Name, ip))
			m.Answer = append(m.Answer, rr)
		} else if q.Qtype == dns.TypeTXT {
			rr, _ := dns.NewRR(q.Name + ` 60 IN TXT "exfil"`)
			m.Answer = append(m.Answer, rr)
		} else if !ok {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

func startProxy(t *testing.T, allow ...string) (*Proxy, *eventlog.Recorder, string) {
	t.Helper()
	return startProxyWith(t, nil, allow...)
}

// testListen is where the latest test proxy listens: a loopback address
// of its own, drawn anew for every proxy, so that neither another run of
// these tests on the host (two checkouts, CI beside a developer) nor a
// socket some other process holds on one address's port 53 can make a
// later test's proxy fail to bind. The tests do not run in parallel.
var testListen string

func newTestListen() string {
	return fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(254), 1+rand.IntN(254), 2+rand.IntN(252))
}

// startProxyWith is startProxy with mod applied to the config first.
func startProxyWith(t testing.TB, mod func(*Config), allow ...string) (*Proxy, *eventlog.Recorder, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the DNS forwarder binds port 53: needs root")
	}
	testListen = newTestListen()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "hello %s %s %d", r.Host, r.URL.Path, len(b))
	}))
	t.Cleanup(upstream.Close)
	_, port, _ := net.SplitHostPort(upstream.Listener.Addr().String())
	tlsUp := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "secure hello") }))
	t.Cleanup(tlsUp.Close)
	_, tport, _ := net.SplitHostPort(tlsUp.Listener.Addr().String())
	dnsAddr := fakeDNS(t, map[string]string{"allowed.test": "127.0.0.1", "evil.test": "127.0.0.1", "rebind.test": "10.0.0.1", "other.test": "127.0.0.1"})
	p := &policy.Policy{}
	rules := []string{"allowed.test:" + port, "allowed.test:" + tport, "rebind.test:" + port, "other.test:" + tport}
	if err := p.Add(true, append(rules, allow...)...); err != nil {
		t.Fatal(err)
	}
	rec := eventlog.NewRecorder(nil, nil)
	cfg := Config{
		Sandbox: "test", Listen: netip.MustParseAddr(testListen), Interface: "lo", Peer: netip.MustParseAddr("127.0.0.1"), Policy: p,
		// The test's servers are on loopback: this "host" has no address
		// of its own (TestGuard covers the host's addresses).
		Guard:    &policy.Guard{AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Local: noLocal},
		Upstream: dnsAddr, MaxBytesOut: 1 << 20, Recorder: rec,
	}
	if mod != nil {
		mod(&cfg)
	}
	px, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	return px, rec, port + " " + tport
}

func proxyClient() *http.Client {
	u, _ := url.Parse("http://" + testListen + ":3128")
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProxyDecisions(t *testing.T) {
	_, rec, ports := startProxy(t)
	port, tport := strings.Fields(ports)[0], strings.Fields(ports)[1]
	c := proxyClient()
	if code, body := get(t, c, "http://allowed.test:"+port+"/x"); code != 200 || body != "hello allowed.test:"+port+" /x 0" {
		t.Errorf("allowed: %d %q", code, body)
	}
	if code, body := get(t, c, "http://evil.test:"+port+"/"); code != 403 || !strings.Contains(body, "evil.test:"+port+" no allow rule matches") {
		t.Errorf("denied: %d %q", code, body)
	}
	if code, body := get(t, c, "http://rebind.test:"+port+"/"); code != 403 || !strings.Contains(body, "10.0.0.1") {
		t.Errorf("DNS rebinding: %d %q", code, body)
	}
	if code, body := get(t, c, "http://127.0.0.1:"+port+"/"); code != 403 || !strings.Contains(body, "IP addresses") {
		t.Errorf("IP literal: %d %q", code, body)
	}
	if code, body := get(t, c, "https://allowed.test:"+tport+"/"); code != 200 || body != "secure hello" {
		t.Errorf("CONNECT: %d %q", code, body)
	}
	if code, _ := get(t, c, "https://evil.test:"+tport+"/"); code != 0 {
		t.Errorf("CONNECT to a denied host: %d", code)
	}

	// Domain fronting: CONNECT to an allowed host, SNI of another.
	conn, err := net.Dial("tcp", testListen+":3128")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "CONNECT allowed.test:%s HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", tport, tport)
	br := bufio.NewReader(conn)
	if line, _ := br.ReadString('\n'); !strings.Contains(line, "200") {
		t.Fatalf("CONNECT: %q", line)
	}
	tc := tls.Client(&bufConn{conn, br}, &tls.Config{ServerName: "other.test", InsecureSkipVerify: true})
	if err := tc.Handshake(); err == nil {
		t.Error("SNI other.test through a CONNECT to allowed.test was tunnelled")
	}
	conn.Close()

	// Plain HTTP through a CONNECT tunnel: refused.
	conn, _ = net.Dial("tcp", testListen+":3128")
	fmt.Fprintf(conn, "CONNECT allowed.test:%s HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", port)
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, _ := io.ReadAll(conn)
	if strings.Contains(string(b), "hello") {
		t.Errorf("plain HTTP inside CONNECT was relayed: %q", b)
	}
	conn.Close()

	// A second request on a kept-alive connection is checked again.
	conn, _ = net.Dial("tcp", testListen+":3128")
	fmt.Fprintf(conn, "GET http://allowed.test:%s/a HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\nGET http://evil.test:%s/b HTTP/1.1\r\nHost: evil.test:%s\r\n\r\n", port, port, port, port)
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, _ = io.ReadAll(conn)
	if !strings.Contains(string(b), "hello allowed.test") || !strings.Contains(string(b), "403 Forbidden") {
		t.Errorf("keep-alive: %q", b)
	}
	conn.Close()

	// A Host header that disagrees with the URL is not what goes upstream:
	// the checked host is.
	conn, _ = net.Dial("tcp", testListen+":3128")
	fmt.Fprintf(conn, "GET http://allowed.test:%s/ HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n", port)
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, _ = io.ReadAll(conn)
	if strings.Contains(string(b), "evil.test") || !strings.Contains(string(b), "hello allowed.test") {
		t.Errorf("Host mismatch: %q", b)
	}
	conn.Close()

	if s := rec.Summary(); !strings.HasPrefix(s, "3 requests allowed") || !strings.Contains(s, "evil.test x") {
		t.Errorf("summary %q", s)
	}
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func TestProxyByteLimit(t *testing.T) {
	_, rec, ports := startProxy(t)
	port := strings.Fields(ports)[0]
	c := proxyClient()
	resp, err := c.Post("http://allowed.test:"+port+"/up", "application/octet-stream", strings.NewReader(strings.Repeat("x", 2<<20)))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatalf("2 MiB upload passed a 1 MiB cap: %s", b)
		}
	}
	if l := rec.Limits(); len(l) != 1 || l[0] != "bytes-out" {
		t.Fatalf("limits %v", l)
	}
}

func TestDNSForwarder(t *testing.T) {
	startProxy(t)
	c := &dns.Client{Timeout: 3 * time.Second}
	ask := func(name string, qt uint16) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qt)
		r, _, err := c.Exchange(m, testListen+":53")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return r
	}
	if r := ask("allowed.test", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("allowed A: %v", r)
	}
	if r := ask("evil.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("denied name: %v", r)
	}
	if r := ask("allowed.test", dns.TypeTXT); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
		t.Errorf("TXT: %v", r)
	}
	if r := ask("allowed.test", dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("AAAA: %v", r)
	}
	c.Net = "tcp"
	if r := ask("allowed.test", dns.TypeA); len(r.Answer) != 1 {
		t.Errorf("TCP: %v", r)
	}
}

func TestProxyConnectionCap(t *testing.T) {
	_, rec, _ := startProxyWith(t, func(c *Config) { c.MaxConns = 2 })
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", testListen+":3128")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond)
	c, err := net.Dial("tcp", testListen+":3128")
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a third connection was served")
	}
	c.Close()
	for _, h := range held {
		h.Close()
	}
	if l := rec.Limits(); len(l) != 1 || l[0] != "connections" {
		t.Fatalf("limits %v", l)
	}
}

// Only the sandbox's own end of the veth is served: a connection or a DNS
// query from any other address (another process of the host) gets nothing
// and is not recorded as the sandbox's.
func TestProxyServesOnlyItsPeer(t *testing.T) {
	var events []eventlog.Event
	var mu sync.Mutex
	_, _, ports := startProxyWith(t, func(c *Config) {
		c.Peer = netip.MustParseAddr("127.0.0.2")
		c.Recorder = eventlog.NewRecorder(nil, func(e eventlog.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
	})
	port := strings.Fields(ports)[0]
	from := func(src string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		u, _ := url.Parse("http://" + testListen + ":3128")
		return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(u), DialContext: d.DialContext}}
	}
	for _, p := range []int{PortExplicit, PortTransparentHTTP, PortTransparentTLS} {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).Dial("tcp", net.JoinHostPort(testListen, strconv.Itoa(p)))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET http://allowed.test:%s/x HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", port, port)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Errorf("port %d answered a stranger: %q", p, b)
		}
		c.Close()
	}
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	for _, network := range []string{"udp", "tcp"} {
		dc := &dns.Client{Net: network, Timeout: time.Second, Dialer: &net.Dialer{Timeout: time.Second}}
		if r, _, err := dc.Exchange(m, testListen+":53"); err == nil {
			t.Errorf("DNS over %s answered a stranger: %v", network, r)
		}
	}
	mu.Lock()
	if len(events) != 0 {
		t.Errorf("a stranger's traffic recorded as the sandbox's: %+v", events)
	}
	mu.Unlock()
	if code, body := get(t, from("127.0.0.2"), "http://allowed.test:"+port+"/x"); code != 200 {
		t.Errorf("the peer itself: %d %q", code, body)
	}
	dc := &dns.Client{Timeout: 3 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP("127.0.0.2")}}}
	if r, _, err := dc.Exchange(m, testListen+":53"); err != nil || len(r.Answer) != 1 {
		t.Errorf("DNS for the peer itself: %v %v", r, err)
	}
	// The request's record is written when its connection ends, which the
	// client's pool decides: wait for it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(events)
		mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
	}
	// The proxy records a request once its answer is written: the client
	// may read the answer first.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(events)
		mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 {
		t.Errorf("the peer's traffic: %+v", events)
	}
}

// The host's own addresses are neither dialled nor given out by DNS.
func TestProxyRefusesTheHostsAddresses(t *testing.T) {
	_, rec, ports := startProxyWith(t, func(c *Config) {
		c.Guard.Local = func() ([]netip.Prefix, error) { return []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil }
	})
	port := strings.Fields(ports)[0]
	if code, body := get(t, proxyClient(), "http://allowed.test:"+port+"/x"); code != 403 || !strings.Contains(body, "127.0.0.1 is an address of this host") {
		t.Errorf("the host's address dialled: %d %q", code, body)
	}
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	if r, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, testListen+":53"); err != nil || len(r.Answer) != 0 {
		t.Errorf("the host's address given by DNS: %v %v", r, err)
	}
	if s := rec.Summary(); !strings.HasPrefix(s, "0 requests allowed, 2 denied") {
		t.Errorf("summary %q", s)
	}
}

// The byte cap counted bodies only: a request's line and headers (up to a
// megabyte each) went out uncounted, so requests without a body passed
// any cap.
func TestProxyByteLimitCountsHeaders(t *testing.T) {
	_, rec, ports := startProxy(t)
	port := strings.Fields(ports)[0]
	c := proxyClient()
	refused := false
	for i := 0; i < 40 && !refused; i++ { // 40 x 64 KiB: 2.5 MiB against a 1 MiB cap
		req, _ := http.NewRequest("GET", "http://allowed.test:"+port+"/x", nil)
		req.Header.Set("X-Data", strings.Repeat("x", 64<<10))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		refused = resp.StatusCode == 403
	}
	if l := rec.Limits(); !refused || len(l) != 1 || l[0] != "bytes-out" {
		t.Fatalf("2.5 MiB of headers passed a 1 MiB cap (limits %v)", l)
	}
}
