package sni

import (
	"bytes"
	"crypto/tls"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/egress/internal/tlstest"
)

func TestReadClientHello(t *testing.T) {
	raw := tlstest.ClientHello(t, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true})
	ch, consumed, err := ReadClientHello(bytes.NewReader(raw))
	if err != nil || ch.SNI != "allowed.test" || ch.ECH || !bytes.Equal(consumed, raw) {
		t.Fatalf("%+v %v (consumed %d of %d)", ch, err, len(consumed), len(raw))
	}
	noSNI := tlstest.ClientHello(t, &tls.Config{InsecureSkipVerify: true})
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
	f.Add(tlstest.ClientHello(f, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true}))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ch, consumed, err := ReadClientHello(bytes.NewReader(b))
		if len(consumed) > len(b) || err == nil && ch == nil {
			t.Fatalf("consumed %d of %d, %v %v", len(consumed), len(b), ch, err)
		}
	})
}
