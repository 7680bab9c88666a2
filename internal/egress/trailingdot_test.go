package egress

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/egress/internal/tlstest"
)

// interceptOne intercepts one host and fails its certificate: what the
// proxy asked it is what the test reads.
type interceptOne struct {
	host  string
	mu    sync.Mutex
	asked []string
}

func (i *interceptOne) Intercepts(h string, _ int) bool { return h == i.host }
func (i *interceptOne) Certificate(h string) (*tls.Certificate, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.asked = append(i.asked, h)
	return nil, fmt.Errorf("test: no certificate")
}
func (i *interceptOne) Redact([]string, []string) []eventlog.Finding { return nil }

func (i *interceptOne) Inspect(*Inspected) Verdict { return Verdict{} }

// "allowed.test." is the host "allowed.test" to the policy, to DNS and to
// every server; to the inspector it was another host, so a tunnel to
// a granted host written with a trailing dot went through unintercepted
// (unread by the secret scanner, the grant's placeholder sent as it was).
func TestProxyInterceptsAHostWithATrailingDot(t *testing.T) {
	in := &interceptOne{host: "allowed.test"}
	_, _, ports := startProxyWith(t, func(c *Config) { c.Inspector = in }, "allowed.test")
	tport := strings.Fields(ports)[1]
	hello := tlstest.ClientHello(t, &tls.Config{ServerName: "allowed.testX", InsecureSkipVerify: true})
	hello = bytes.Replace(hello, []byte("allowed.testX"), []byte("allowed.test."), 1)
	for _, c := range []struct{ name, connect string }{
		{"CONNECT", "allowed.test.:" + tport},
		{"transparent", ""},
	} {
		port := PortTransparentTLS
		if c.connect != "" {
			port = PortExplicit
		}
		conn, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).Dial("tcp", net.JoinHostPort(testListen, strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		if c.connect != "" {
			fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", c.connect, c.connect)
		}
		conn.Write(hello)
		_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		io.Copy(io.Discard, conn)
		conn.Close()
		in.mu.Lock()
		asked := strings.Join(in.asked, " ")
		in.asked = nil
		in.mu.Unlock()
		if asked != "allowed.test" {
			t.Errorf("%s with SNI allowed.test.: the inspector was asked for %q, want allowed.test", c.name, asked)
		}
	}
}
