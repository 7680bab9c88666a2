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
	"unsafe"

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
	if cfg.Inspector != nil {
		p.tls = &http.Transport{
			Proxy:                 nil,
			DialContext:           p.dialer.DialContext,
			TLSClientConfig:       &tls.Config{RootCAs: cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:     true,
			DisableCompression:    true,
			MaxIdleConnsPerHost:   8,
			IdleConnTimeout:       30 * time.Second,
			ResponseHeaderTimeout: responseHeaderTimeout,
			// Large buffers: the default 4 KiB ones cap a download's throughput.
			ReadBufferSize:  256 << 10,
			WriteBufferSize: 64 << 10,
		}
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
	var o origin
	defer o.close(p)
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
		if !p.forward(c, &o, req, host, port) {
			return
		}
	}
}

// transparentHTTP serves port 80 traffic that ignored the proxy variables:
// every request on the connection is judged by its Host header.
func (p *Proxy) transparentHTTP(c net.Conn) {
	lr := &io.LimitedReader{R: c}
	br := bufio.NewReader(lr)
	var o origin
	defer o.close(p)
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
		if !p.forward(c, &o, req, host, 80) {
			return
		}
	}
}

// forward checks one plain HTTP request and relays it on o, the client
// connection's connection to the server; it reports whether the client
// connection may carry another request.
func (p *Proxy) forward(c net.Conn, o *origin, req *http.Request, host string, port int) bool {
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
	body := &countReader{r: req.Body, p: p}
	if req.Body != nil && req.Body != http.NoBody {
		out.Body = body
	}
	resp, err := p.roundTrip(o, out)
	ev.BytesOut = body.n
	ev.DurationMS = ms(time.Since(start))
	if err != nil {
		status, reason := http.StatusBadGateway, err.Error()
		if errors.Is(err, policy.ErrBlockedAddress) {
			status = http.StatusForbidden
		}
		if body.err != nil {
			status, reason = http.StatusForbidden, fmt.Sprintf("egress byte limit (%d bytes) reached", p.cfg.MaxBytesOut)
		}
		p.refuse(c, req, ev, status, reason)
		return false
	}
	resp.Close = resp.Close || req.Close
	var n int64
	if spliceable(resp) {
		// The body is read past resp.Body, which is left unread.
		n, err = o.relay(c, resp)
		if err != nil || resp.Close {
			o.close(p)
		}
	} else {
		// Chunked, or delimited by the server's close: re-framed by
		// net/http (and so read through a buffer, not spliced).
		cw := &countWriter{w: c}
		bw := bufio.NewWriterSize(cw, 64<<10)
		err = resp.Write(bw)
		if ferr := bw.Flush(); err == nil {
			err = ferr
		}
		n = cw.n
		if err != nil || resp.Close {
			o.close(p) // before the body's Close, which would read the rest
		}
		resp.Body.Close()
	}
	ev.BytesIn = n
	ev.Decision = "allowed"
	ev.DurationMS = ms(time.Since(start))
	p.record(ev)
	return err == nil && !resp.Close
}

// responseHeaderTimeout bounds the wait for a server's answer once a
// request is sent.
const responseHeaderTimeout = 60 * time.Second

// origin is a client connection's connection to the server of its latest
// plain HTTP request, kept for the next one while both keep it alive.
type origin struct {
	addr string // host:port dialled
	conn net.Conn
	br   *bufio.Reader
}

func (o *origin) close(p *Proxy) {
	if o.conn != nil {
		p.active.Delete(o.conn)
		o.conn.Close()
		o.conn, o.br, o.addr = nil, nil, ""
	}
}

// roundTrip sends out to its server and reads the head of the answer
// (1xx interim answers skipped). A request that can be sent again (no
// body, an idempotent method) goes on the kept connection when it is to
// the same server, and once more on a new one if the server had closed
// it; any other request gets a new connection.
func (p *Proxy) roundTrip(o *origin, out *http.Request) (*http.Response, error) {
	addr := out.URL.Host
	replayable := (out.Body == nil || out.Body == http.NoBody) &&
		(out.Method == http.MethodGet || out.Method == http.MethodHead || out.Method == http.MethodOptions || out.Method == http.MethodTrace)
	for retry := true; ; retry = false {
		reused := o.conn != nil && o.addr == addr && replayable && o.clean()
		if !reused {
			o.close(p)
			up, err := p.dialer.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			p.active.Store(up, struct{}{})
			o.addr, o.conn, o.br = addr, up, bufio.NewReaderSize(up, 64<<10)
		}
		resp, err := o.exchange(out)
		if err == nil {
			return resp, nil
		}
		o.close(p)
		if !reused || !retry {
			return nil, err
		}
	}
}

// clean reports whether the kept connection holds nothing its server sent
// unasked: bytes past its last answer (a chunked body's trailing bytes, or
// more than a Content-Length) would be read as the next request's answer.
// A connection the server has closed is not clean either.
func (o *origin) clean() bool {
	if o.br.Buffered() > 0 {
		return false
	}
	sc, ok := o.conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	clean := false
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		clean = err == syscall.EAGAIN
	})
	return clean
}

// exchange writes out on o and reads the answer's head.
func (o *origin) exchange(out *http.Request) (*http.Response, error) {
	if err := out.Write(o.conn); err != nil {
		return nil, err
	}
	_ = o.conn.SetReadDeadline(time.Now().Add(responseHeaderTimeout))
	defer func() { _ = o.conn.SetReadDeadline(time.Time{}) }()
	for {
		resp, err := http.ReadResponse(o.br, out)
		switch {
		case err != nil:
			return nil, err
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("the server switched protocols, which the proxy does not relay")
		case resp.StatusCode >= 100 && resp.StatusCode < 200:
			continue
		}
		return resp, nil
	}
}

// spliceable says resp's body is a byte count read as is from the
// server's connection: relayed without being read into the proxy.
func spliceable(resp *http.Response) bool {
	return resp.ContentLength > 0 && len(resp.TransferEncoding) == 0 && resp.Body != http.NoBody &&
		resp.Request.Method != http.MethodHead
}

// relay sends resp to c: its head, what of the body o has read already,
// and the rest spliced from the server's connection to c. It returns the
// bytes sent.
func (o *origin) relay(c net.Conn, resp *http.Response) (int64, error) {
	var head bytes.Buffer
	writeHead(&head, resp)
	pre, _ := o.br.Peek(int(min(int64(o.br.Buffered()), resp.ContentLength)))
	head.Write(pre)
	_, _ = o.br.Discard(len(pre))
	n, err := c.Write(head.Bytes())
	sent := int64(n)
	if err != nil {
		return sent, err
	}
	if o.br.Buffered() > 0 {
		// The server sent past the body: the connection is not kept.
		resp.Close = true
	}
	m, err := io.CopyN(c, o.conn, resp.ContentLength-int64(len(pre)))
	return sent + m, err
}

// respExcluded are the header fields writeHead writes itself or drops,
// as http.Response.Write does.
var respExcluded = map[string]bool{"Content-Length": true, "Transfer-Encoding": true, "Trailer": true}

// writeHead writes the status line and header of a response whose body is
// resp.ContentLength bytes sent as they are: what http.Response.Write
// writes before such a body.
func writeHead(w *bytes.Buffer, resp *http.Response) {
	text := strings.TrimPrefix(resp.Status, strconv.Itoa(resp.StatusCode)+" ")
	if resp.Status == "" {
		text = http.StatusText(resp.StatusCode)
	}
	fmt.Fprintf(w, "HTTP/%d.%d %03d %s\r\n", resp.ProtoMajor, resp.ProtoMinor, resp.StatusCode, text)
	if resp.Close && !hasToken(resp.Header.Get("Connection"), "close") {
		w.WriteString("Connection: close\r\n")
	}
	fmt.Fprintf(w, "Content-Length: %d\r\n", resp.ContentLength)
	_ = resp.Header.WriteSubset(w, respExcluded)
	w.WriteString("\r\n")
}

// hasToken says the comma-separated list v holds token.
func hasToken(v, token string) bool {
	for _, t := range strings.Split(v, ",") {
		if strings.EqualFold(strings.TrimSpace(t), token) {
			return true
		}
	}
	return false
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
		n, _ := io.Copy(c, up) // spliced: both are TCP connections
		in = n
		closeWrite(c)
	}()
	// What the ClientHello's reads took past it, then the connection
	// itself: spliced.
	out, err := p.copyOut(up, io.LimitReader(br, int64(br.Buffered())), c)
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

// countReader counts a request body as it is read, each read first
// claiming its room under the byte cap: no byte past the cap is read, so
// none is sent.
type countReader struct {
	r   io.ReadCloser
	p   *Proxy
	n   int64
	err error // the cap's, once reached
}

func (c *countReader) Read(b []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if len(b) == 0 {
		return c.r.Read(b)
	}
	k := c.p.claim(int64(len(b)))
	if k == 0 {
		c.p.cfg.Recorder.Limit("bytes-out")
		c.err = ErrByteLimit
		return 0, c.err
	}
	n, err := c.r.Read(b[:k])
	c.p.bytesOut.Add(int64(n) - k) // what was claimed and not read
	c.n += int64(n)
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

// copyOut copies the sandbox's side of a tunnel, srcs one after the other,
// to dst. Each round sends only bytes already queued on the source, after
// claiming them from the byte cap: nothing past the cap goes out, a claim
// is never held while waiting for the sandbox, and between two TCP
// connections the copy is a splice. It returns the bytes sent, and
// ErrByteLimit when the sandbox had more to send than the cap left.
func (p *Proxy) copyOut(dst io.Writer, srcs ...io.Reader) (int64, error) {
	var sent int64
	for _, src := range srcs {
		for {
			avail, err := queued(src)
			if err != nil {
				return sent, err
			}
			if avail == 0 {
				break // end of this source
			}
			// A chunk at a time: a claim is held while its bytes are
			// written, which a server that does not read may block, and
			// what one tunnel holds the sandbox's other connections lack.
			k := p.claim(min(avail, claimChunk))
			if k == 0 {
				p.cfg.Recorder.Limit("bytes-out")
				return sent, ErrByteLimit
			}
			n, err := io.CopyN(dst, src, k)
			p.bytesOut.Add(n - k) // what was claimed and not sent
			sent += n
			if err != nil {
				if err == io.EOF {
					break
				}
				return sent, err
			}
		}
	}
	return sent, nil
}

// claimChunk is the most a tunnel claims of the byte cap at once.
const claimChunk = 256 << 10

// claim takes up to want bytes from what the byte cap has left, counting
// them as sent; the caller gives back what it does not send.
func (p *Proxy) claim(want int64) int64 {
	if p.cfg.MaxBytesOut <= 0 {
		p.bytesOut.Add(want)
		return want
	}
	for {
		total := p.bytesOut.Load()
		k := min(want, p.cfg.MaxBytesOut-total)
		if k <= 0 {
			return 0
		}
		if p.bytesOut.CompareAndSwap(total, total+k) {
			return k
		}
	}
}

// queued waits until r has something to read and says how much: a TCP
// connection's queued bytes, read by neither (0 at the end of the
// stream); a LimitedReader's remaining count.
func queued(r io.Reader) (int64, error) {
	switch r := r.(type) {
	case *io.LimitedReader:
		return max(r.N, 0), nil
	case syscall.Conn:
		rc, err := r.SyscallConn()
		if err != nil {
			return 0, err
		}
		var n int
		var serr error
		err = rc.Read(func(fd uintptr) bool {
			var b [1]byte
			m, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EAGAIN:
				return false // nothing yet: wait until readable
			case err != nil:
				serr = err
			case m > 0:
				if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e != 0 {
					serr = fmt.Errorf("ioctl TIOCINQ: %w", e)
				}
			}
			return true
		})
		if err == nil {
			err = serr
		}
		return int64(n), err
	}
	return 0, fmt.Errorf("egress proxy: cannot see what %T holds", r)
}
