package sni

import (
	"bytes"
	"crypto/tls"
	"net"
	"testing"
	"time"
)

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

func TestReadClientHello(t *testing.T) {
	raw := clientHello(t, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true})
	ch, consumed, err := ReadClientHello(bytes.NewReader(raw))
	if err != nil || ch.SNI != "allowed.test" || ch.ECH || !bytes.Equal(consumed, raw) {
		t.Fatalf("%+v %v (consumed %d of %d)", ch, err, len(consumed), len(raw))
	}
	noSNI := clientHello(t, &tls.Config{InsecureSkipVerify: true})
	if ch, _, err := ReadClientHello(bytes.NewReader(noSNI)); err != nil || ch.SNI != "" {
		t.Fatalf("no SNI: %+v %v", ch, err)
	}
	// Split into two records: still one ClientHello.
	body := raw[5:]
	split := append([]byte{0x16, 3, 1, 0, 10}, body[:10]...)
	split = append(split, 0x16, 3, 1, byte((len(body)-10)>>8), byte(len(body)-10))
	split = append(split, body[10:]...)
	if ch, _, err := ReadClientHello(bytes.NewReader(split)); err != nil || ch.SNI != "allowed.test" {
		t.Fatalf("fragmented: %+v %v", ch, err)
	}
	for name, in := range map[string][]byte{
		"http":      []byte("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
		"truncated": raw[:len(raw)/2],
		"empty":     nil,
	} {
		if _, _, err := ReadClientHello(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzReadClientHello(f *testing.F) {
	f.Add(clientHello(f, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true}))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ch, consumed, err := ReadClientHello(bytes.NewReader(b))
		if len(consumed) > len(b) || err == nil && ch == nil {
			t.Fatalf("consumed %d of %d, %v %v", len(consumed), len(b), ch, err)
		}
	})
}
