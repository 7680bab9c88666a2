package egress

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
)

// What the proxy records (an audit record each, in the daemon: up to 500
// a second per sandbox) is bounded, whatever the sandbox names: an SNI of
// 60 KB made an event of 180 KB (host, SNI and the reason naming it).
func TestProxyBoundsWhatItRecords(t *testing.T) {
	var mu sync.Mutex
	var events []eventlog.Event
	startProxyWith(t, func(c *Config) {
		c.Recorder = eventlog.NewRecorder(nil, func(e eventlog.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
	})
	long := strings.Repeat("a", 60000) + ".test"
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).Dial("tcp", net.JoinHostPort(testListen, strconv.Itoa(PortTransparentTLS)))
	if err != nil {
		t.Fatal(err)
	}
	c.Write(helloWithSNI(long))
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	c.Read(make([]byte, 1))
	c.Close()
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 {
		t.Fatalf("events: %d", len(events))
	}
	e := events[0]
	if e.Decision != "denied" || !strings.HasPrefix(e.Host, "aaaa") || len(e.Host) > eventlog.MaxRecordedHost+30 || len(e.SNI) > eventlog.MaxRecordedHost+30 || len(e.Reason) > eventlog.MaxRecordedText+30 {
		t.Errorf("event of %d+%d+%d bytes: %.80q", len(e.Host), len(e.SNI), len(e.Reason), e.Host)
	}
}

// helloWithSNI builds a ClientHello (TLS 1.2 form, one cipher suite)
// naming sni, in records of at most 16 KiB.
func helloWithSNI(sni string) []byte {
	name := []byte(sni)
	sn := []byte{byte((len(name) + 3) >> 8), byte(len(name) + 3), 0, byte(len(name) >> 8), byte(len(name))}
	sn = append(sn, name...)
	ext := append([]byte{0, 0, byte(len(sn) >> 8), byte(len(sn))}, sn...)
	body := append([]byte{3, 3}, make([]byte, 32)...)
	body = append(body, 0, 0, 2, 0x13, 0x01, 1, 0, byte(len(ext)>>8), byte(len(ext)))
	body = append(body, ext...)
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	var out []byte
	for len(hs) > 0 {
		n := min(len(hs), 16384)
		out = append(out, 0x16, 3, 1, byte(n>>8), byte(n))
		out = append(out, hs[:n]...)
		hs = hs[n:]
	}
	return out
}

// http.ReadRequest reads a request line of any length into memory: 256
// connections each sending an endless path held the daemon's memory
// hostage. The proxy answers 431 past net/http's 1 MiB, itself, without
// reading further.
func TestProxyBoundsRequestHeaders(t *testing.T) {
	_, _, ports := startProxy(t)
	port := strings.Fields(ports)[0]
	for _, lport := range []int{PortExplicit, PortTransparentHTTP} {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).Dial("tcp", net.JoinHostPort(testListen, strconv.Itoa(lport)))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			fmt.Fprintf(c, "GET http://allowed.test:%s/", port)
			chunk := []byte(strings.Repeat("a", 64<<10))
			for i := 0; i < 64; i++ { // 4 MiB
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
			fmt.Fprintf(c, " HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", port)
		}()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 4096)
		n, _ := io.ReadAtLeast(c, b, 12)
		c.Close()
		if got := string(b[:n]); !strings.HasPrefix(got, "HTTP/1.1 431") || !strings.Contains(got, "X-Airlock-Decision: denied") {
			t.Errorf("port %d: a 4 MiB request line: %.200q", lport, got)
		}
	}
}
