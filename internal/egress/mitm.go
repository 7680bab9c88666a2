package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/egress/policy"
)

// mitm serves the connections the proxy intercepts: it terminates the
// sandbox's TLS with a certificate of the sandbox's own CA, and every
// request on the connection (HTTP/1.1 keep-alive or HTTP/2 stream) is
// inspected on its own and sent on over a new, verified TLS connection to
// the real host.
type mitm struct {
	p   *Proxy
	srv *http.Server
	ln  *chanListener
	// slots holds a place for each request in flight: HTTP/2 carries many
	// on one connection, each with up to MaxInspectBody of body in
	// memory, and all of them together get the connection cap.
	slots chan struct{}
}

// conn is one intercepted connection: where it goes, and a signal for the
// proxy's accept loop (which holds the connection's slot) that it ended.
type mitmConn struct {
	ev   eventlog.Event // the tunnel's event: host, port, SNI
	done chan struct{}
	once sync.Once
}

type mitmKey struct{}

func newMITM(p *Proxy) *mitm {
	m := &mitm{p: p, ln: newChanListener(), slots: make(chan struct{}, p.cfg.MaxConns)}
	conns := sync.Map{} // *tls.Conn -> *mitmConn
	m.srv = &http.Server{
		Handler:           http.HandlerFunc(m.handle),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // a sandbox's bad requests are its own business
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			mc, _ := conns.Load(c)
			return context.WithValue(ctx, mitmKey{}, mc)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				if mc, ok := conns.LoadAndDelete(c); ok {
					mc := mc.(*mitmConn)
					mc.once.Do(func() { close(mc.done) })
				}
			}
		},
	}
	m.ln.register = func(c net.Conn, mc *mitmConn) { conns.Store(c, mc) }
	go func() { _ = m.srv.Serve(m.ln) }()
	return m
}

func (m *mitm) close() {
	m.ln.Close()
	_ = m.srv.Close()
}

// serve terminates TLS on c (whose bytes, the ClientHello included, come
// from r) and waits until the connection is over.
func (m *mitm) serve(c net.Conn, r io.Reader, ev eventlog.Event) {
	start := time.Now()
	ev.Intercepted = true
	cert, err := m.p.cfg.Inspector.Certificate(ev.Host)
	if err != nil {
		ev.Decision, ev.Reason, ev.DurationMS = "error", err.Error(), ms(time.Since(start))
		m.p.record(ev)
		return
	}
	tc := tls.Server(&readerConn{Conn: c, r: r}, &tls.Config{
		Certificates: []tls.Certificate{*cert},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := tc.Handshake(); err != nil {
		ev.Decision, ev.DurationMS = "error", ms(time.Since(start))
		ev.Reason = "TLS handshake with the sandbox failed (does its client trust /etc/airlock/ca.pem?): " + err.Error()
		m.p.record(ev)
		return
	}
	_ = c.SetDeadline(time.Time{})
	mc := &mitmConn{ev: ev, done: make(chan struct{})}
	if !m.ln.push(tc, mc) {
		return
	}
	<-mc.done
}

// handle inspects and forwards one request of an intercepted connection.
func (m *mitm) handle(w http.ResponseWriter, r *http.Request) {
	mc, _ := r.Context().Value(mitmKey{}).(*mitmConn)
	if mc == nil {
		http.Error(w, "airlock egress: no connection", http.StatusInternalServerError)
		return
	}
	select {
	case m.slots <- struct{}{}:
		defer func() { <-m.slots }()
	case <-r.Context().Done():
		return
	}
	p := m.p
	start := time.Now()
	host, port := mc.ev.Host, mc.ev.Port
	ev := eventlog.Event{Kind: "https", Host: host, Port: port, SNI: mc.ev.SNI, Method: r.Method, Path: r.URL.Path, Intercepted: true, Rule: mc.ev.Rule}
	deny := func(status int, reason string) {
		ev.Decision, ev.Reason, ev.DurationMS = "denied", reason, ms(time.Since(start))
		p.record(ev)
		w.Header().Set("X-Airlock-Decision", "denied")
		http.Error(w, "airlock egress: "+reason, status)
	}
	if h, _ := splitHostPort(r.Host, port); h != host {
		deny(http.StatusMisdirectedRequest, fmt.Sprintf("Host %q does not match the TLS server name %q", r.Host, host))
		return
	}
	v := p.inspect(r, host, port, true, &ev)
	ev.Path = r.URL.Path // as inspected: stripped of placeholders, a found key redacted
	if v.Refuse != "" {
		deny(http.StatusForbidden, v.Refuse)
		return
	}
	if err := p.addOut(headerBytes(r)); err != nil {
		deny(http.StatusForbidden, fmt.Sprintf("egress byte limit (%d bytes) reached", p.cfg.MaxBytesOut))
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme = "https"
	out.URL.Host = host
	if port != 443 {
		out.URL.Host = net.JoinHostPort(host, strconv.Itoa(port))
	}
	out.Host = out.URL.Host
	dropHopHeaders(out.Header)
	body := &countReader{r: out.Body, p: p}
	if out.Body != nil && out.Body != http.NoBody {
		out.Body = body
	}
	resp, err := p.tls.RoundTrip(out)
	ev.BytesOut = body.n
	if err != nil {
		status, reason := http.StatusBadGateway, err.Error()
		ev.Decision = "error"
		switch {
		case errors.Is(err, policy.ErrBlockedAddress):
			status, ev.Decision = http.StatusForbidden, "denied"
		case errors.Is(err, ErrByteLimit):
			status, ev.Decision, reason = http.StatusForbidden, "denied", fmt.Sprintf("egress byte limit (%d bytes) reached", p.cfg.MaxBytesOut)
		}
		ev.Reason, ev.DurationMS = reason, ms(time.Since(start))
		p.record(ev)
		w.Header().Set("X-Airlock-Decision", ev.Decision)
		http.Error(w, "airlock egress: "+reason, status)
		return
	}
	defer resp.Body.Close()
	dropHopHeaders(resp.Header)
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	n, _ := io.Copy(flushWriter{w}, resp.Body)
	ev.BytesIn = n
	ev.Decision = "allowed"
	ev.DurationMS = ms(time.Since(start))
	p.record(ev)
}

// flushWriter sends each chunk at once (git and event streams wait on it).
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// readerConn is a connection whose first bytes were already read (the
// ClientHello): reads come from r, writes go to the connection.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// chanListener hands the http.Server the intercepted connections.
type chanListener struct {
	ch       chan net.Conn
	done     chan struct{}
	once     sync.Once
	register func(net.Conn, *mitmConn)
}

func newChanListener() *chanListener {
	return &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn, mc *mitmConn) bool {
	l.register(c, mc)
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{} }
