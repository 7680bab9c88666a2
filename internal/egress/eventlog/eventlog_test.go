package eventlog

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

func TestRecorderCountsLostEvents(t *testing.T) {
	r := NewRecorder(failingWriter{}, nil)
	r.Record(Event{Kind: "http", Host: "a.test", Decision: "allowed"})
	r.Record(Event{Kind: "http", Host: "b.test", Decision: "denied"})
	if n, err := r.Lost(); n != 2 || err == nil {
		t.Fatalf("lost %d, %v", n, err)
	}
	if s := r.Summary(); s != "1 request allowed, 1 denied (b.test x1)" {
		t.Fatalf("summary %q", s)
	}
}

// A sandbox names the hosts of its denials: a new SNI of up to 64 KiB on
// every connection. The summary's table of denied hosts kept each for the
// sandbox's life (3000 connections held 187 MB of the daemon's heap), and
// printed them, escape sequences included, on the operator's terminal.
func TestRecorderBoundsTheHostsASandboxNames(t *testing.T) {
	r := NewRecorder(nil, nil)
	for i := 0; i < 10000; i++ {
		r.Record(Event{Kind: "tls", Decision: "denied", Host: fmt.Sprintf("\x1b]0;owned\x07%d.%s", i, strings.Repeat("a", 60000))})
	}
	r.Record(Event{Kind: "dns", Decision: "denied", Host: "evil.test"})
	r.mu.Lock()
	kept, bytes := len(r.denied), 0
	for h := range r.denied {
		bytes += len(h)
	}
	r.mu.Unlock()
	if kept > maxDeniedHosts || bytes > maxDeniedHosts*MaxRecordedHost {
		t.Errorf("the summary keeps %d hosts, %d bytes", kept, bytes)
	}
	s := r.Summary()
	if !strings.HasPrefix(s, "0 requests allowed, 10001 denied (") || strings.ContainsAny(s, "\x1b\x07") || len(s) > 2000 {
		t.Errorf("summary %q", s)
	}
}
