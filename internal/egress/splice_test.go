package egress

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
)

// events collects what a test proxy records.
func events(c *Config) chan eventlog.Event {
	ch := make(chan eventlog.Event, 64)
	c.Recorder = eventlog.NewRecorder(nil, func(e eventlog.Event) { ch <- e })
	return ch
}

func nextEvent(t *testing.T, ch chan eventlog.Event, kind string) eventlog.Event {
	t.Helper()
	for {
		select {
		case e := <-ch:
			if e.Kind == kind {
				return e
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s event", kind)
		}
	}
}

// sink is a server that counts what each connection sends it until the
// end of its stream, then answers with reply bytes.
func sink(t *testing.T, reply int) (port string, got chan int64) {
	got = make(chan int64, 4)
	port = serveConns(t, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		got <- n
		_, _ = c.Write(make([]byte, reply))
	})
	return port, got
}

// openTunnel opens a CONNECT tunnel to allowed.test:port and sends a
// ClientHello naming it.
func openTunnel(t *testing.T, port string) (net.Conn, *bufio.Reader, int) {
	t.Helper()
	c, err := dialExplicit()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT allowed.test:%s HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", port, port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	hello := helloWithSNI("allowed.test")
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	return c, br, len(hello)
}

// A tunnel is spliced, and still counted to the byte: what the sandbox
// sent (its ClientHello and 3 MiB and 7 bytes after it) is the tunnel's
// record, the proxy's total and what the server got, with a cap of
// exactly that total and another tunnel open and idle (a claim on the cap
// is never held while waiting, so the idle tunnel takes none of it).
func TestTunnelCountsSplicedBytesExactly(t *testing.T) {
	port, got := sink(t, 12345)
	const payload = 3<<20 + 7
	hello := len(helloWithSNI("allowed.test"))
	var ch chan eventlog.Event
	var rec *eventlog.Recorder
	px, _, _ := startProxyWith(t, func(c *Config) {
		ch = events(c)
		rec = c.Recorder
		c.MaxBytesOut = int64(2*hello + payload)
	}, "allowed.test:"+port)
	idle, _, _ := openTunnel(t, port)
	c, br, _ := openTunnel(t, port)
	go func() {
		_, _ = c.Write(bytes.Repeat([]byte("x"), payload))
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	in, err := io.Copy(io.Discard, br)
	if err != nil || in != 12345 {
		t.Fatalf("read %d bytes back: %v", in, err)
	}
	if n := <-got; n != int64(hello+payload) {
		t.Errorf("the server got %d bytes, want %d", n, hello+payload)
	}
	e := nextEvent(t, ch, "connect")
	if e.BytesOut != int64(hello+payload) || e.BytesIn != 12345 || e.Decision != "allowed" || e.Reason != "" {
		t.Errorf("recorded out %d in %d %s %q, want out %d in 12345", e.BytesOut, e.BytesIn, e.Decision, e.Reason, hello+payload)
	}
	if l := rec.Limits(); len(l) != 0 {
		t.Errorf("limits %v", l)
	}
	idle.Close()
	nextEvent(t, ch, "connect")
	if px.BytesOut() != int64(2*hello+payload) {
		t.Errorf("proxy total %d, want %d", px.BytesOut(), 2*hello+payload)
	}
}

// The cap cuts a spliced tunnel mid-stream, at the cap's byte.
func TestTunnelCapCutsMidStream(t *testing.T) {
	port, got := sink(t, 0)
	var ch chan eventlog.Event
	var rec *eventlog.Recorder
	const limit = 1 << 20
	px, _, _ := startProxyWith(t, func(c *Config) { ch = events(c); rec = c.Recorder; c.MaxBytesOut = limit }, "allowed.test:"+port)
	c, br, _ := openTunnel(t, port)
	go func() { _, _ = c.Write(make([]byte, 3<<20)) }()
	_, _ = io.Copy(io.Discard, br)
	if n := <-got; n != limit {
		t.Errorf("the server got %d bytes through a cap of %d", n, limit)
	}
	e := nextEvent(t, ch, "connect")
	if e.BytesOut != limit || !strings.Contains(e.Reason, "egress byte limit") {
		t.Errorf("recorded out %d, reason %q", e.BytesOut, e.Reason)
	}
	if l := rec.Limits(); len(l) != 1 || l[0] != "bytes-out" || px.BytesOut() != limit {
		t.Errorf("limits %v, total %d", l, px.BytesOut())
	}
}

// countingConn counts what is read from it.
type countingConn struct {
	net.Conn
	n int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n += int64(n)
	return n, err
}

// Plain HTTP answers reach the client as the server sent them, spliced
// (a Content-Length body) or re-framed (chunked), on one kept connection
// to the server, each recorded with the bytes the client got.
func TestProxyRelaysPlainAnswersExactly(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 5<<16) // 5 MiB
	big = append(big, "end"...)
	conns := make(chan string, 16)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conns <- r.RemoteAddr
			switch r.URL.Path {
			case "/big":
				w.Header().Set("Content-Length", strconv.Itoa(len(big)))
				w.Write(big)
			case "/chunked":
				for i := 0; i < 3; i++ {
					fmt.Fprintf(w, "part %d\n", i)
					w.(http.Flusher).Flush()
				}
			}
		}),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	var ch chan eventlog.Event
	startProxyWith(t, func(c *Config) { ch = events(c) }, "allowed.test:"+port)
	raw, err := dialExplicit()
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	cc := &countingConn{Conn: raw}
	br := bufio.NewReader(cc)
	for _, c := range []struct {
		method, path, body string
	}{
		{"GET", "/big", string(big)},
		{"GET", "/chunked", "part 0\npart 1\npart 2\n"},
		{"HEAD", "/big", ""},
		{"GET", "/big", string(big)},
	} {
		before := cc.n
		fmt.Fprintf(raw, "%s http://allowed.test:%s%s HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", c.method, port, c.path, port)
		req := &http.Request{Method: c.method}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != c.body || resp.StatusCode != 200 {
			t.Fatalf("%s %s: %d, %d bytes (%v)", c.method, c.path, resp.StatusCode, len(b), err)
		}
		e := nextEvent(t, ch, "http")
		if got := cc.n - before; e.BytesIn != got || br.Buffered() != 0 {
			t.Errorf("%s %s: recorded %d bytes in, the client got %d", c.method, c.path, e.BytesIn, got)
		}
	}
	first := <-conns
	for i := 0; i < 3; i++ {
		if a := <-conns; a != first {
			t.Errorf("request %d came on another connection to the server (%s, not %s)", i+2, a, first)
		}
	}
}

// A kept connection the server has closed meanwhile is dialled anew for
// a request that can be sent again.
func TestProxyRedialsAClosedKeptConnection(t *testing.T) {
	// One answer, then the connection is closed, unannounced.
	port := serveConns(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	startProxyWith(t, nil, "allowed.test:"+port)
	c, err := dialExplicit()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; i < 3; i++ {
		fmt.Fprintf(c, "GET http://allowed.test:%s/ HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", port, port)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("request %d: %d %q", i+1, resp.StatusCode, b)
		}
	}
}

// What the proxy writes before a spliced body is what net/http would.
func TestSplicedHeadIsResponseWrite(t *testing.T) {
	for _, raw := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello",
		"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 299 Odd Text\r\nContent-Length: 5\r\nTrailer: X-T\r\nKeep-Alive: timeout=5\r\n\r\nhello",
		"HTTP/1.1 404 \r\nContent-Length: 5\r\n\r\nhello",
	} {
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), &http.Request{Method: "GET"})
		if err != nil {
			t.Fatal(err)
		}
		if !spliceable(resp) {
			t.Fatalf("%q: not spliceable", raw)
		}
		var want, got bytes.Buffer
		if err := resp.Write(&want); err != nil {
			t.Fatal(err)
		}
		writeHead(&got, resp)
		got.WriteString("hello")
		if got.String() != want.String() {
			t.Errorf("%q:\n got %q\nwant %q", raw, got.String(), want.String())
		}
	}
}
