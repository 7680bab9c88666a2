// Package sni reads a TLS ClientHello far enough to name the server it
// asks for (SNI) and whether it hides it (ECH), without consuming what the
// tunnel must pass on. It imports the standard library only.
package sni

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ErrNotTLS is returned when a stream does not start with a TLS handshake.
var ErrNotTLS = errors.New("not a TLS ClientHello")

const (
	maxHello        = 64 << 10
	extServerName   = 0x0000
	extECH          = 0xfe0d
	recordHandshake = 0x16
)

// ClientHello is what the proxy learns from the first flight of a TLS
// connection.
type ClientHello struct {
	SNI string
	ECH bool // an encrypted ClientHello: the real server name is hidden
}

// ReadClientHello reads the TLS records holding the ClientHello from r and
// returns it with every byte read, which the caller replays upstream. The
// handshake may span several records; at most 64 KiB is read.
func ReadClientHello(r io.Reader) (*ClientHello, []byte, error) {
	var raw, msg []byte
	for {
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(r, hdr); err != nil {
			return nil, raw, fmt.Errorf("%w: %v", ErrNotTLS, err)
		}
		raw = append(raw, hdr...)
		if hdr[0] != recordHandshake || hdr[1] != 3 {
			return nil, raw, ErrNotTLS
		}
		n := int(binary.BigEndian.Uint16(hdr[3:5]))
		if n == 0 || len(raw)+n > maxHello {
			return nil, raw, fmt.Errorf("%w: record of %d bytes", ErrNotTLS, n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, raw, fmt.Errorf("%w: %v", ErrNotTLS, err)
		}
		raw = append(raw, body...)
		msg = append(msg, body...)
		if len(msg) >= 4 {
			if msg[0] != 1 { // client_hello
				return nil, raw, fmt.Errorf("%w: handshake type %d", ErrNotTLS, msg[0])
			}
			need := 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
			if need > maxHello {
				return nil, raw, fmt.Errorf("%w: ClientHello of %d bytes", ErrNotTLS, need)
			}
			if len(msg) >= need {
				ch, err := parseClientHello(msg[4:need])
				return ch, raw, err
			}
		}
	}
}

// parseClientHello parses the body of a ClientHello handshake message.
func parseClientHello(b []byte) (*ClientHello, error) {
	p := &parser{b: b}
	p.skip(2 + 32)       // legacy_version, random
	p.skip(int(p.u8()))  // session id
	p.skip(int(p.u16())) // cipher suites
	p.skip(int(p.u8()))  // compression methods
	if p.err == nil && len(p.b) == 0 {
		return &ClientHello{}, nil // no extensions at all
	}
	ext := &parser{b: p.bytes(int(p.u16()))}
	if p.err != nil {
		return nil, fmt.Errorf("%w: truncated", ErrNotTLS)
	}
	ch := &ClientHello{}
	seen := map[uint16]bool{}
	for len(ext.b) > 0 && ext.err == nil {
		typ, data := ext.u16(), ext.bytes(int(ext.u16()))
		if ext.err != nil {
			break
		}
		if seen[typ] {
			return nil, fmt.Errorf("%w: extension %#x repeated", ErrNotTLS, typ)
		}
		seen[typ] = true
		switch typ {
		case extECH:
			ch.ECH = true
		case extServerName:
			sn := &parser{b: data}
			list := &parser{b: sn.bytes(int(sn.u16()))}
			for len(list.b) > 0 && list.err == nil {
				kind, name := list.u8(), list.bytes(int(list.u16()))
				if kind == 0 && list.err == nil {
					if ch.SNI != "" {
						return nil, fmt.Errorf("%w: two server names", ErrNotTLS)
					}
					ch.SNI = string(name)
				}
			}
			if sn.err != nil || list.err != nil {
				return nil, fmt.Errorf("%w: bad server_name extension", ErrNotTLS)
			}
		}
	}
	if ext.err != nil {
		return nil, fmt.Errorf("%w: truncated extensions", ErrNotTLS)
	}
	return ch, nil
}

type parser struct {
	b   []byte
	err error
}

func (p *parser) take(n int) []byte {
	if p.err != nil || n < 0 || n > len(p.b) {
		p.err = io.ErrUnexpectedEOF
		return nil
	}
	v := p.b[:n]
	p.b = p.b[n:]
	return v
}

func (p *parser) skip(n int)         { p.take(n) }
func (p *parser) bytes(n int) []byte { return p.take(n) }
func (p *parser) u8() uint8 {
	if v := p.take(1); v != nil {
		return v[0]
	}
	return 0
}
func (p *parser) u16() uint16 {
	if v := p.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}
