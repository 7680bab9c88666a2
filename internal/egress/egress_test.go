package egress

import (
	"bytes"
	"crypto/tls"
	"net"
	"net/netip"
	"testing"
	"time"
)

// noLocal is a host without addresses of its own, for guards in tests
// whose servers listen on loopback.
func noLocal() ([]netip.Prefix, error) { return nil, nil }

// clientHello captures the first flight of a real TLS client.
func clientHello(t testing.TB, cfg *tls.Config) []byte {
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
