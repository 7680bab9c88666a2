// Package eventlog is the record of a sandbox's egress decisions: the
// Event (one request, tunnel or DNS query) and the Findings in it, their
// bounds and redaction before they are recorded (Recordable), and the
// Recorder that writes them as JSON lines, passes them on and sums them up
// for the end of a run. It imports internal/untrusted and the standard
// library.
package eventlog

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// Event is one egress decision: a request, a tunnel or a DNS query.
type Event struct {
	Time       time.Time `json:"time"`
	Sandbox    string    `json:"sandbox"`
	Kind       string    `json:"kind"` // http, connect, tls, dns
	Host       string    `json:"host"`
	Port       int       `json:"port,omitempty"`
	Method     string    `json:"method,omitempty"`
	Path       string    `json:"path,omitempty"`
	SNI        string    `json:"sni,omitempty"`
	QType      string    `json:"qtype,omitempty"`
	Addr       string    `json:"addr,omitempty"` // the address dialled
	BytesOut   int64     `json:"bytes_out"`
	BytesIn    int64     `json:"bytes_in"`
	DurationMS float64   `json:"duration_ms"`
	Decision   string    `json:"decision"` // allowed, denied, error
	Rule       string    `json:"rule,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	// Intercepted: TLS the proxy terminated (the host has a grant).
	Intercepted bool      `json:"intercepted,omitempty"`
	Grant       string    `json:"grant,omitempty"` // the grant whose credential was put in
	Findings    []Finding `json:"findings,omitempty"`
}

// Finding is a credential (or a grant's placeholder) seen where it does
// not belong. It names the value by a keyed fingerprint, never the value.
type Finding struct {
	Rule        string `json:"rule"`
	Fingerprint string `json:"fingerprint"`
	Where       string `json:"where"`  // "header Authorization", "url", "body"
	Action      string `json:"action"` // blocked, redacted, recorded, stripped
	Reason      string `json:"reason,omitempty"`
}

// Redactor finds credentials in what is about to be recorded.
type Redactor interface {
	// Redact replaces, in place, every credential it finds in texts
	// (what a sandbox chose that goes into the record of a decision: a
	// host, a path, a reason naming them) with [REDACTED:rule], and
	// returns a finding for each, named by where[i]. Whatever the scan
	// policy did to the request, its record never holds the value.
	Redact(texts, where []string) []Finding
}

// Recorder writes events as JSON lines (when given a writer) and keeps the
// counts for the end-of-run summary. It is safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	enc     *json.Encoder
	allowed int
	denied  map[string]int
	// deniedOther counts denials of hosts past the first maxDeniedHosts.
	deniedOther int
	limits      []string
	sink        func(Event)
	// lost counts events the log writer refused (a full disk, say), and
	// writeErr is its first error: the run says so instead of going on
	// as if the record were whole.
	lost     int
	writeErr error
}

// NewRecorder returns a recorder writing JSON lines to w (may be nil) and
// passing every event to sink (may be nil).
func NewRecorder(w io.Writer, sink func(Event)) *Recorder {
	r := &Recorder{denied: map[string]int{}, sink: sink}
	if w != nil {
		r.enc = json.NewEncoder(w)
	}
	return r
}

// Record logs one event.
func (r *Recorder) Record(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.enc != nil {
		if err := r.enc.Encode(e); err != nil {
			r.lost++
			if r.writeErr == nil {
				r.writeErr = err
			}
		}
	}
	switch {
	case e.Decision == "allowed" && e.Kind != "dns":
		r.allowed++
	case e.Decision == "denied":
		// Names come from the sandbox (an SNI of 64 KiB, a new one each
		// time): the summary keeps a bounded number of short ones.
		h := clip(e.Host, MaxRecordedHost)
		if _, ok := r.denied[h]; ok || len(r.denied) < maxDeniedHosts {
			r.denied[h]++
		} else {
			r.deniedOther++
		}
	}
	if r.sink != nil {
		r.sink(e)
	}
}

// Limit notes a limit that was hit (reported once).
func (r *Recorder) Limit(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.limits {
		if l == what {
			return
		}
	}
	r.limits = append(r.limits, what)
}

// Lost reports how many events the log could not write, and why.
func (r *Recorder) Lost() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost, r.writeErr
}

// Limits lists the egress limits that were hit.
func (r *Recorder) Limits() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string{}, r.limits...)
}

// Summary is the one-line account printed after a run:
// "12 requests allowed, 3 denied (evil.example x2, 169.254.169.254 x1)".
func (r *Recorder) Summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.deniedOther
	type hc struct {
		host  string
		count int
	}
	var hosts []hc
	for h, c := range r.denied {
		n += c
		hosts = append(hosts, hc{h, c})
	}
	sort.Slice(hosts, func(i, j int) bool {
		if hosts[i].count != hosts[j].count {
			return hosts[i].count > hosts[j].count
		}
		return hosts[i].host < hosts[j].host
	})
	s := fmt.Sprintf("%d %s allowed, %d denied", r.allowed, plural(r.allowed, "request"), n)
	if n > 0 {
		var parts []string
		for i, h := range hosts {
			if i == 5 {
				parts = append(parts, "...")
				break
			}
			parts = append(parts, fmt.Sprintf("%s x%d", untrusted.Quote(h.host), h.count))
		}
		if r.deniedOther > 0 && len(hosts) < 5 {
			parts = append(parts, fmt.Sprintf("other hosts x%d", r.deniedOther))
		}
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

func plural(n int, w string) string {
	if n == 1 {
		return w
	}
	return w + "s"
}

// Bounds on what a sandbox's names and paths take in the record: the
// summary's distinct denied hosts, and the lengths of an event's fields (a
// DNS name has at most 253 bytes; an SNI, a Host header or a path may have
// megabytes, every one of which went to the audit log).
const (
	maxDeniedHosts  = 64
	MaxRecordedHost = 260
	MaxRecordedPath = 2048
	MaxRecordedText = 1024
)

// clip shortens s to at most n bytes, saying how long it was.
func clip(s string, n int) string { return clipAs(s, n, len(s)) }

// clipAs shortens s to at most n bytes, saying it was total bytes long
// (s may be a redacted copy of what the sandbox sent, and shorter).
func clipAs(s string, n, total int) string {
	if len(s) <= n && total <= n {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:min(len(s), n-20)], total)
}

// recordedField is a field of an event whose text a sandbox chose (in
// whole or in part: a reason names a host or a path), the bytes of it
// the record keeps, and what a finding in it is called.
type recordedField struct {
	text  *string
	max   int
	where string
}

func recordedFields(e *Event) []recordedField {
	fs := []recordedField{
		{&e.Host, MaxRecordedHost, "host"}, {&e.SNI, MaxRecordedHost, "sni"}, {&e.Path, MaxRecordedPath, "url"},
		{&e.Method, 32, "method"}, {&e.QType, 32, "qtype"}, {&e.Reason, MaxRecordedText, "reason"}, {&e.Addr, MaxRecordedHost, "addr"},
	}
	for i := range e.Findings {
		f := &e.Findings[i]
		fs = append(fs, recordedField{&f.Reason, MaxRecordedText, "a finding's reason"}, recordedField{&f.Where, MaxRecordedText, "a finding's place"})
	}
	return fs
}

// redactMargin is how far past what the record keeps of a field the
// scanner reads, so that a credential the cut runs through is found
// whole (and redacted) rather than kept in part.
const redactMargin = 512

// Recordable makes e fit for the record: every field a sandbox chose is
// bounded, and, when in is set, holds no credential the secret scanner
// finds: each is replaced by [REDACTED:rule] and named by a finding
// (keyed fingerprint, never the value) unless the event has one of the
// same value already. The request itself is what the scan policy made
// it; only the record is redacted.
func Recordable(e *Event, in Redactor) {
	fields := recordedFields(e)
	texts := make([]string, len(fields))
	where := make([]string, len(fields))
	total := make([]int, len(fields))
	for i, f := range fields {
		total[i] = len(*f.text)
		texts[i] = (*f.text)[:min(total[i], f.max+redactMargin)]
		where[i] = f.where
	}
	var found []Finding
	if in != nil {
		found = in.Redact(texts, where)
	}
	for i, f := range fields {
		*f.text = clipAs(texts[i], f.max, total[i])
	}
	for _, f := range found {
		if !slices.ContainsFunc(e.Findings, func(g Finding) bool { return g.Fingerprint == f.Fingerprint }) {
			e.Findings = append(e.Findings, f)
		}
	}
}
