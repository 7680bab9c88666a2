package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// headerSlack is what the cap may be off by per request: a request's head
// is counted as estimated (headerBytes), its body exactly.
const headerSlack = 64

// A plain HTTP request body stops at the byte cap: the server gets no body
// byte past it (a read that crossed the cap used to be sent whole: 28 KiB
// past a 200 kB cap).
func TestPlainBodyStopsAtTheCap(t *testing.T) {
	const limit = 200000
	port, got := sink(t, 0)
	startProxyWith(t, func(c *Config) { c.MaxBytesOut = limit }, "allowed.test:"+port)
	c, err := dialExplicit()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := strings.Repeat("x", 1<<20)
	go fmt.Fprintf(c, "POST http://allowed.test:%s/ HTTP/1.1\r\nHost: allowed.test:%s\r\nContent-Length: %d\r\n\r\n%s", port, port, len(body), body)
	select {
	case n := <-got:
		t.Logf("server received %d bytes; cap %d", n, limit)
		if n > limit+headerSlack {
			t.Errorf("server received %d bytes, past the cap %d by %d", n, limit, n-limit)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no upstream end")
	}
}

// A server's bytes past an answer's Content-Length, arriving after the
// body, never answer the next request on the kept connection: it is not
// kept (they did, once the proxy kept connections of its own).
func TestUnaskedBytesNeverAnswerTheNextRequest(t *testing.T) {
	port := serveConns(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		time.Sleep(200 * time.Millisecond)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
		r2, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
		_ = r2
		io.Copy(io.Discard, br)
	})
	startProxyWith(t, nil, "allowed.test:"+port)
	c, err := dialExplicit()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i, path := range []string{"/a", "/b"} {
		fmt.Fprintf(c, "GET http://allowed.test:%s%s HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", port, path, port)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		b, _ := io.ReadAll(resp.Body)
		t.Logf("request %s answered %q", path, b)
		if i == 1 && string(b) == "stale" {
			t.Errorf("request /b was answered with the bytes the server sent past /a's Content-Length")
		}
		time.Sleep(400 * time.Millisecond)
	}
}

// Bytes past a chunked answer's end, sent with it, never answer the next
// request on the kept connection.
func TestChunkedTrailingBytesNeverAnswerTheNextRequest(t *testing.T) {
	port := serveConns(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if r.URL.Path == "/a" {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
			} else {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
			}
		}
	})
	startProxyWith(t, nil, "allowed.test:"+port)
	c, err := dialExplicit()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i, path := range []string{"/a", "/b"} {
		fmt.Fprintf(c, "GET http://allowed.test:%s%s HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", port, path, port)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		b, _ := io.ReadAll(resp.Body)
		t.Logf("request %s answered %q", path, b)
		if i == 1 && string(b) != "fresh" {
			t.Errorf("request /b answered %q, not the server's answer to it", b)
		}
	}
}

// Concurrent uploads stop at the cap together (each overshot it by up to
// one read).
func TestConcurrentBodiesStopAtTheCap(t *testing.T) {
	const limit = 100000
	port, got := sink(t, 0)
	startProxyWith(t, func(c *Config) { c.MaxBytesOut = limit }, "allowed.test:"+port)
	const k = 16
	body := strings.Repeat("x", 1<<20)
	for i := 0; i < k; i++ {
		c, err := dialExplicit()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go fmt.Fprintf(c, "POST http://allowed.test:%s/ HTTP/1.1\r\nHost: allowed.test:%s\r\nContent-Length: %d\r\n\r\n%s", port, port, len(body), body)
	}
	var total int64
	deadline := time.After(10 * time.Second)
	for i := 0; i < k; i++ {
		select {
		case n := <-got:
			total += n
		case <-deadline:
			t.Logf("only %d upstream connections ended", i)
			i = k
		}
	}
	t.Logf("servers received %d bytes in all; cap %d", total, limit)
	if total > limit+k*headerSlack {
		t.Errorf("past the cap by %d", total-limit)
	}
}

// serveConns serves every connection to a new loopback listener with
// handle, each on a goroutine of its own and closed after it, and returns
// the listener's port.
func serveConns(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// dialExplicit connects to the proxy's explicit port from the sandbox's
// address.
func dialExplicit() (net.Conn, error) {
	return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).Dial("tcp", net.JoinHostPort(testListen, strconv.Itoa(PortExplicit)))
}
