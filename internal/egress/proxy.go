// Package egress is a sandbox's only way out: an HTTP/CONNECT proxy
// (explicit and transparent) that enforces the sandbox's policy
// (internal/egress/policy), judging TLS by its ClientHello
// (internal/egress/sni) and terminating it only for the hosts an Inspector
// names, the DNS forwarder that answers only allowed names
// (internal/egress/dns), and the record of every decision
// (internal/egress/eventlog). It never connects to the host's own
// addresses, other sandboxes, loopback, private, link-local, CGNAT,
// metadata or other special addresses, whatever DNS says, and serves only
// its sandbox. It imports its subpackages and the standard library.
package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/dns"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/egress/policy"
	"github.com/airlock-sandbox/airlock/internal/egress/sni"
)

// Ports the proxy listens on, on the host end of the sandbox's veth. The
// sandbox's nftables rules redirect its TCP 80 and 443 to the transparent
// ones and let nothing else through.
const (
	PortExplicit        = 3128 // HTTP_PROXY / HTTPS_PROXY (plain HTTP and CONNECT)
	PortTransparentHTTP = 3129 // redirected port 80, judged by Host
	PortTransparentTLS  = 3130 // redirected port 443, judged by SNI
	PortDNS             = 53
)

// Config describes one sandbox's proxy.
type Config struct {
	Sandbox string
	Listen  netip.Addr // the host end of the sandbox's veth
	// Interface is that veth's host end: the listeners are bound to it
	// (SO_BINDTODEVICE), so nothing arriving another way (a process of the
	// host, through loopback) reaches them.
	Interface string
	// Peer is the sandbox's end of the veth: the only address served.
	// A connection or query from any other is dropped unanswered and is
	// not recorded as the sandbox's.
	Peer     netip.Addr
	Policy   *policy.Policy
	Guard    *policy.Guard
	Upstream string // DNS server (host:port) for the forwarder and the proxy's own lookups
	MaxConns int    // concurrent connections; 0: 256
	// MaxBytesOut caps the bytes the sandbox sends out through the proxy
	// (request bodies and tunnel traffic); 0: no cap.
	MaxBytesOut int64
	Recorder    *eventlog.Recorder
	// Inspector, when set, reads every request the proxy can: plain HTTP,
	// and TLS to the hosts it says to intercept (those with a grant).
	Inspector Inspector
	// UpstreamRoots verifies the servers of intercepted connections; nil:
	// the system's roots (which honour SSL_CERT_FILE).
	UpstreamRoots *x509.CertPool
}

// Proxy is one sandbox's egress proxy and DNS forwarder.
type Proxy struct {
	cfg       Config
	dialer    *net.Dialer
	transport *http.Transport
	tls       *http.Transport // upstream of intercepted connections
	mitm      *mitm
	listeners []net.Listener
	dns       *dns.Server
	conns     chan struct{}
	bytesOut  atomic.Int64
	wg        sync.WaitGroup
	closed    atomic.Bool
	active    sync.Map // net.Conn -> struct{}, closed on Close
}

// ErrByteLimit is returned when the sandbox exceeded --egress-bytes.
var ErrByteLimit = errors.New("egress byte limit reached")

// Start binds the proxy's listeners and the DNS forwarder.
func Start(cfg Config) (_ *Proxy, err error) {
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 256
	}
	if cfg.Interface == "" || !cfg.Peer.IsValid() {
		return nil, errors.New("egress proxy: no interface or peer address to serve")
	}
	p := &Proxy{cfg: cfg, conns: make(chan struct{}, cfg.MaxConns)}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, cfg.Upstream)
	}}
	p.dialer = &net.Dialer{Timeout: 15 * time.Second, Resolver: resolver, Control: cfg.Guard.Control}
	p.transport = &http.Transport{
		Proxy:                 nil,
		DialContext:           p.dialer.DialContext,
		DisableCompression:    true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		// Large buffers: the default 4 KiB ones cap a download's throughput.
		ReadBufferSize:  256 << 10,
		WriteBufferSize: 64 << 10,
	}
	if cfg.Inspector != nil {
		p.tls = p.transport.Clone()
		p.tls.TLSClientConfig = &tls.Config{RootCAs: cfg.UpstreamRoots, MinVersion: tls.VersionTLS12}
		p.tls.ForceAttemptHTTP2 = true
		p.mitm = newMITM(p)
	}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	for _, l := range []struct {
		port  int
		serve func(net.Conn)
	}{
		{PortExplicit, p.explicit},
		{PortTransparentHTTP, p.transparentHTTP},
		{PortTransparentTLS, p.transparentTLS},
	} {
		ln, err := p.listenConfig().Listen(context.Background(), "tcp", netip.AddrPortFrom(cfg.Listen, uint16(l.port)).String())
		if err != nil {
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
		p.listeners = append(p.listeners, ln)
		p.wg.Add(1)
		go p.accept(ln, l.serve)
	}
	if p.dns, err = dns.Start(dns.Config{
		Addr:     netip.AddrPortFrom(cfg.Listen, PortDNS).String(),
		Listen:   p.listenConfig(),
		FromPeer: p.fromPeer,
		Policy:   cfg.Policy,
		Guard:    cfg.Guard,
		Upstream: cfg.Upstream,
		Record:   p.record,
	}); err != nil {
		return nil, err
	}
	return p, nil
}

// Close stops every listener and ends every connection.
func (p *Proxy) Close() {
	if !p.closed.CompareAndSwap(false, true) {
		return
	}
	for _, ln := range p.listeners {
		ln.Close()
	}
	if p.dns != nil {
		p.dns.Close()
	}
	p.active.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	if p.mitm != nil {
		p.mitm.close()
		p.tls.CloseIdleConnections()
	}
	p.transport.CloseIdleConnections()
	p.wg.Wait()
}

// listenConfig binds a listener to the sandbox's veth.
func (p *Proxy) listenConfig() *net.ListenConfig {
	return &net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, p.cfg.Interface)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bind to %s: %w", p.cfg.Interface, serr)
		}
		return nil
	}}
}

// fromPeer reports whether a connection or query came from the sandbox.
func (p *Proxy) fromPeer(a net.Addr) bool {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	}
	return ip.Unmap() == p.cfg.Peer
}

// BytesOut is what the sandbox has sent out so far.
func (p *Proxy) BytesOut() int64 { return p.bytesOut.Load() }

func (p *Proxy) accept(ln net.Listener, serve func(net.Conn)) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !p.fromPeer(c.RemoteAddr()) {
			// Not the sandbox: neither served nor recorded as its own.
			c.Close()
			continue
		}
		select {
		case p.conns <- struct{}{}:
		default:
			p.cfg.Recorder.Limit("connections")
			p.record(eventlog.Event{Kind: "tcp", Decision: "denied", Reason: fmt.Sprintf("connection limit (%d) reached", p.cfg.MaxConns)})
			c.Close()
			continue
		}
		p.active.Store(c, struct{}{})
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-p.conns; p.active.Delete(c); c.Close() }()
			serve(c)
		}()
	}
}

func (p *Proxy) record(e eventlog.Event) {
	e.Time = time.Now().UTC()
	e.Sandbox = p.cfg.Sandbox
	eventlog.Recordable(&e, p.cfg.Inspector)
	p.cfg.Recorder.Record(e)
}

// addOut counts n bytes going out and fails past the cap.
func (p *Proxy) addOut(n int64) error {
	total := p.bytesOut.Add(n)
	if p.cfg.MaxBytesOut > 0 && total > p.cfg.MaxBytesOut {
		p.cfg.Recorder.Limit("bytes-out")
		return ErrByteLimit
	}
	return nil
}

// maxHeaderBytes bounds a request's line and headers, as net/http's
// server does (http.ReadRequest alone reads a line of any length into
// memory: a sandbox's gigabyte-long path was the daemon's gigabyte).
const maxHeaderBytes = http.DefaultMaxHeaderBytes + 4096

// readRequest reads one request from br, whose reads come from lr, with
// its line and headers held to maxHeaderBytes; the body and whatever
// follows (a tunnel) are not limited. ok is false when the connection is
// done (answered already when the header was too large).
func (p *Proxy) readRequest(c net.Conn, br *bufio.Reader, lr *io.LimitedReader) (*http.Request, bool) {
	lr.N = maxHeaderBytes
	req, err := http.ReadRequest(br)
	exhausted := lr.N <= 0
	lr.N = math.MaxInt64
	if err != nil {
		if exhausted {
			p.refuse(c, nil, eventlog.Event{Kind: "http"}, http.StatusRequestHeaderFieldsTooLarge,
				fmt.Sprintf("request line and headers longer than %d bytes", http.DefaultMaxHeaderBytes))
		}
		return nil, false
	}
	return req, true
}

// explicit serves HTTP_PROXY clients: absolute-form requests and CONNECT.
func (p *Proxy) explicit(c net.Conn) {
	lr := &io.LimitedReader{R: c}
	br := bufio.NewReader(lr)
	for {
		req, ok := p.readRequest(c, br, lr)
		if !ok {
			return
		}
		if req.Method == http.MethodConnect {
			p.connect(c, br, req)
			return
		}
		if req.URL.Scheme != "http" || req.URL.Host == "" {
			p.refuse(c, req, eventlog.Event{Kind: "http", Host: req.Host, Method: req.Method}, http.StatusBadRequest,
				"the proxy takes absolute http:// URLs; use CONNECT for https")
			return
		}
		// For an absolute URL the request's host is the URL's (a Host
		// header is ignored), and that is the host checked and sent on.
		host, port := splitHostPort(req.URL.Host, 80)
		req.Host = req.URL.Host
		if !p.forward(c, req, host, port) {
			return
		}
	}
}

// transparentHTTP serves port 80 traffic that ignored the proxy variables:
// every request on the connection is judged by its Host header.
func (p *Proxy) transparentHTTP(c net.Conn) {
	lr := &io.LimitedReader{R: c}
	br := bufio.NewReader(lr)
	for {
		req, ok := p.readRequest(c, br, lr)
		if !ok {
			return
		}
		host, _ := splitHostPort(req.Host, 80)
		if host == "" {
			p.refuse(c, req, eventlog.Event{Kind: "http", Method: req.Method}, http.StatusBadRequest, "request without a Host header")
			return
		}
		if !p.forward(c, req, host, 80) {
			return
		}
	}
}

// forward checks one plain HTTP request and relays it; it reports whether
// the connection may carry another request.
func (p *Proxy) forward(c net.Conn, req *http.Request, host string, port int) bool {
	start := time.Now()
	ev := eventlog.Event{Kind: "http", Host: host, Port: port, Method: req.Method, Path: req.URL.Path}
	d := p.cfg.Policy.Check(host, port)
	ev.Rule = d.Rule
	if !d.Allowed {
		p.refuse(c, req, ev, http.StatusForbidden, fmt.Sprintf("%s:%d %s", host, port, d.Reason))
		return false
	}
	if p.cfg.Inspector != nil {
		v := p.inspect(req, host, port, false, &ev)
		ev.Path = req.URL.Path // as inspected: stripped of placeholders, a found key redacted
		if v.Refuse != "" {
			p.refuse(c, req, ev, http.StatusForbidden, v.Refuse)
			return false
		}
	}
	if err := p.addOut(headerBytes(req)); err != nil {
		p.refuse(c, req, ev, http.StatusForbidden, fmt.Sprintf("egress byte limit (%d bytes) reached", p.cfg.MaxBytesOut))
		return false
	}
	out := req.Clone(req.Context())
	out.RequestURI = ""
	out.URL.Scheme = "http"
	out.URL.Host = net.JoinHostPort(host, strconv.Itoa(port))
	out.Host = req.Host
	dropHopHeaders(out.Header)
	body := &countReader{r: req.Body, add: p.addOut}
	if req.Body != nil {
		out.Body = body
	}
	resp, err := p.transport.RoundTrip(out)
	ev.BytesOut = body.n
	ev.DurationMS = ms(time.Since(start))
	if err != nil {
		status, reason := http.StatusBadGateway, err.Error()
		if errors.Is(err, policy.ErrBlockedAddress) {
			status = http.StatusForbidden
		}
		if errors.Is(err, ErrByteLimit) {
			status, reason = http.StatusForbidden, fmt.Sprintf("egress byte limit (%d bytes) reached", p.cfg.MaxBytesOut)
		}
		p.refuse(c, req, ev, status, reason)
		return false
	}
	defer resp.Body.Close()
	cw := &countWriter{w: c}
	bw := bufio.NewWriterSize(cw, 256<<10)
	resp.Close = resp.Close || req.Close
	err = resp.Write(bw)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	ev.BytesIn = cw.n
	ev.Decision = "allowed"
	ev.DurationMS = ms(time.Since(start))
	p.record(ev)
	return err == nil && !resp.Close
}

// refuse answers with a clear error the agent's tool can show, and logs.
func (p *Proxy) refuse(c net.Conn, req *http.Request, ev eventlog.Event, status int, reason string) {
	ev.Decision, ev.Reason = "denied", reason
	if status == http.StatusBadGateway {
		ev.Decision = "error"
	}
	if ev.Host == "" && req != nil {
		ev.Host = req.Host
	}
	p.record(ev)
	body := "airlock egress: " + reason + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Airlock-Decision: %s\r\n\r\n%s",
		status, http.StatusText(status), len(body), ev.Decision, body)
}

// connect serves CONNECT: a tunnel for TLS only, whose ClientHello must
// name the host the tunnel was asked for.
func (p *Proxy) connect(c net.Conn, br *bufio.Reader, req *http.Request) {
	host, port := splitHostPort(req.RequestURI, 443)
	ev := eventlog.Event{Kind: "connect", Host: host, Port: port, Method: "CONNECT"}
	d := p.cfg.Policy.Check(host, port)
	ev.Rule = d.Rule
	if !d.Allowed {
		p.refuse(c, req, ev, http.StatusForbidden, fmt.Sprintf("%s:%d %s", host, port, d.Reason))
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	p.tunnel(c, br, ev, host)
}

// transparentTLS serves port 443 traffic that ignored the proxy: judged by
// the ClientHello's SNI alone.
func (p *Proxy) transparentTLS(c net.Conn) {
	p.tunnel(c, bufio.NewReader(c), eventlog.Event{Kind: "tls", Port: 443}, "")
}

// tunnel reads the ClientHello, checks it, dials and splices. want is the
// CONNECT host the SNI must equal ("" for transparent mode).
func (p *Proxy) tunnel(c net.Conn, br *bufio.Reader, ev eventlog.Event, want string) {
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	ch, hello, err := sni.ReadClientHello(br)
	_ = c.SetReadDeadline(time.Time{})
	deny := func(reason string) {
		ev.Decision, ev.Reason, ev.DurationMS = "denied", reason, ms(time.Since(start))
		p.record(ev)
	}
	switch {
	case err != nil:
		deny("the tunnel does not start with a TLS ClientHello")
		return
	case ch.ECH:
		ev.SNI = ch.SNI
		deny("encrypted ClientHello (ECH) hides the server name")
		return
	case ch.SNI == "":
		deny("ClientHello without a server name (SNI)")
		return
	}
	ev.SNI = strings.ToLower(ch.SNI)
	// The host named, as every other decision reads it: no trailing dot.
	sni := strings.TrimSuffix(ev.SNI, ".")
	if want == "" {
		ev.Host = sni
		d := p.cfg.Policy.Check(ev.Host, ev.Port)
		ev.Rule = d.Rule
		if !d.Allowed {
			deny(fmt.Sprintf("%s:%d %s", ev.Host, ev.Port, d.Reason))
			return
		}
	} else if sni != want {
		deny(fmt.Sprintf("SNI %q does not match the CONNECT host %q", ev.SNI, want))
		return
	}
	if p.mitm != nil && p.cfg.Inspector.Intercepts(ev.Host, ev.Port) {
		p.mitm.serve(c, io.MultiReader(bytes.NewReader(hello), br), ev)
		return
	}
	up, err := p.dialer.Dial("tcp", net.JoinHostPort(ev.Host, strconv.Itoa(ev.Port)))
	if err != nil {
		ev.Decision, ev.Reason = "error", err.Error()
		if errors.Is(err, policy.ErrBlockedAddress) {
			ev.Decision = "denied"
		}
		ev.DurationMS = ms(time.Since(start))
		p.record(ev)
		return
	}
	p.active.Store(up, struct{}{})
	defer func() { p.active.Delete(up); up.Close() }()
	ev.Addr = up.RemoteAddr().String()
	if err := p.addOut(int64(len(hello))); err != nil {
		deny(err.Error())
		return
	}
	if _, err := up.Write(hello); err != nil {
		return
	}
	ev.BytesOut = int64(len(hello))
	var wg sync.WaitGroup
	var in int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		n, _ := io.Copy(c, up)
		in = n
		closeWrite(c)
	}()
	out, err := io.Copy(&limitWriter{w: up, add: p.addOut}, br)
	ev.BytesOut += out
	if errors.Is(err, ErrByteLimit) {
		ev.Reason = fmt.Sprintf("egress byte limit (%d bytes) reached: tunnel closed", p.cfg.MaxBytesOut)
		up.Close()
		c.Close()
	}
	closeWrite(up)
	wg.Wait()
	ev.BytesIn = in
	ev.Decision = "allowed"
	ev.DurationMS = ms(time.Since(start))
	p.record(ev)
}

// headerBytes is about what a request's line and headers take on the
// wire: they go out too, and count against the byte cap like a body (a
// megabyte of headers a request, and no body, passed any cap).
func headerBytes(r *http.Request) int64 {
	n := len(r.Method) + len(r.URL.RequestURI()) + len(r.Host) + 20
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n)
}

// hopHeaders belong to one hop and are not sent on.
var hopHeaders = []string{"Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"}

func dropHopHeaders(h http.Header) {
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// splitHostPort splits "host:port" or "[v6]:port" or a bare host; the
// host comes back in lower case without a trailing dot ("api.test." is
// "api.test" to DNS and servers, and must be to the policy and the
// inspector too).
func splitHostPort(s string, def int) (string, int) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return canonHost(strings.Trim(s, "[]")), def
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return canonHost(host), -1
	}
	return canonHost(host), n
}

func canonHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type countReader struct {
	r   io.ReadCloser
	n   int64
	add func(int64) error
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if lerr := c.add(int64(n)); lerr != nil {
		return n, lerr
	}
	return n, err
}

func (c *countReader) Close() error { return c.r.Close() }

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

type limitWriter struct {
	w   io.Writer
	add func(int64) error
}

func (l *limitWriter) Write(b []byte) (int, error) {
	if err := l.add(int64(len(b))); err != nil {
		return 0, err
	}
	return l.w.Write(b)
}
