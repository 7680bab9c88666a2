// Package tlstest is what the egress packages' tests (internal/egress and
// its sni) share: the first flight of a real TLS client, to feed the
// proxy's and the ClientHello reader's tests; for tests only. It imports
// the standard library only.
package tlstest

import (
	"bytes"
	"crypto/tls"
	"net"
	"testing"
	"time"
)

// ClientHello captures the first flight of a real TLS client.
func ClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c1, c2 := net.Pipe()
	go func() {
		_ = tls.Client(c1, cfg).Handshake()
		c1.Close()
	}()
	_ = c2.SetReadDeadline(time.Now().Add(2 * time.Second))
	var buf bytes.Buffer
	b := make([]byte, 4096)
	for {
		n, err := c2.Read(b)
		buf.Write(b[:n])
		if err != nil || buf.Len() > 5 && buf.Len() >= 5+int(buf.Bytes()[3])<<8+int(buf.Bytes()[4]) {
			break
		}
	}
	c2.Close()
	return buf.Bytes()
}
