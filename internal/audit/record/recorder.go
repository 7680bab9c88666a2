package record

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// Log is where records go (internal/audit.Log). Commit returns once the
// record is on disk; Queue takes its place in the chain at once and
// returns what waits for it to be on disk; Append writes it within the
// log's flush interval.
type Log interface {
	Commit(ctx context.Context, r audit.Record) error
	Queue(r audit.Record) (durable func() error, err error)
	Append(r audit.Record) error
	// Failed says why the log can no longer be written, or nil.
	Failed() error
}

// Recorder is the one way records are written. A nil Recorder, or one
// over a nil Log, records nothing (a daemon run with --no-audit).
type Recorder struct {
	log  Log
	warn *slog.Logger
}

// New records to log; what cannot be written unwaited is logged to warn.
func New(log Log, warn *slog.Logger) *Recorder {
	if warn == nil {
		warn = slog.New(slog.DiscardHandler)
	}
	return &Recorder{log: log, warn: warn}
}

func (r *Recorder) on() bool { return r != nil && r.log != nil }

// Failed refuses work up front once the log cannot record it
// (errdefs.ErrUnavailable).
func (r *Recorder) Failed() error {
	if !r.on() {
		return nil
	}
	if err := r.log.Failed(); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return nil
}

// Commit records a fact before the call it describes answers success; a
// log that cannot be written refuses the call (nothing runs unrecorded).
func (r *Recorder) Commit(ctx context.Context, w Who, d Data) error {
	if !r.on() {
		return nil
	}
	rec, err := Make(w, d)
	if err != nil {
		return err
	}
	if err := r.log.Commit(context.WithoutCancel(ctx), rec); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return nil
}

// Queue records a fact in its place in the log now and returns what
// waits until it is on disk; the caller holds back every effect of what
// it describes until durable returns nil. A log that cannot be written
// refuses it.
func (r *Recorder) Queue(w Who, d Data) (durable func() error, err error) {
	if !r.on() {
		return func() error { return nil }, nil
	}
	rec, err := Make(w, d)
	if err != nil {
		return nil, err
	}
	wait, err := r.log.Queue(rec)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return func() error {
		if err := wait(); err != nil {
			return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
		}
		return nil
	}, nil
}

// Note records a fact nobody waits for (a process's end, an egress
// decision); a failure is logged: the log's own failure already refuses
// new work.
func (r *Recorder) Note(w Who, d Data) {
	if !r.on() {
		return
	}
	rec, err := Make(w, d)
	if err == nil {
		err = r.log.Append(rec)
	}
	if err != nil {
		r.warn.Error("audit", "kind", d.Kind(), "sandbox", w.Sandbox, "err", err)
	}
}

// Make is d as a log record of w. Only a sandbox's report of its own
// processes is "reported"; everything else the host saw itself.
func Make(w Who, d Data) (audit.Record, error) {
	r := audit.Record{Kind: d.Kind(), Tenant: w.Tenant, Sandbox: w.Sandbox, Trigger: w.Trigger, Actor: w.Actor, Source: audit.Observed}
	if _, ok := d.(ExecEnd); ok {
		r.Source = audit.Reported
	}
	b, err := json.Marshal(d)
	if err != nil {
		return r, err
	}
	r.Data = b
	return r, nil
}

// ErrUnknownKind is a record of a kind this package does not know.
var ErrUnknownKind = errors.New("unknown kind of record")

// Decode is r's data as its kind's type (a pointer to it).
func Decode(r *audit.Record) (Data, error) {
	f, ok := kinds[r.Kind]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownKind, r.Kind)
	}
	d := f()
	if len(r.Data) == 0 {
		return d, nil
	}
	if err := json.Unmarshal(r.Data, d); err != nil {
		return nil, fmt.Errorf("record %d (%s): %w", r.Seq, r.Kind, err)
	}
	return d, nil
}

// ControlsOf says which controls a sandbox on wall (at version, its
// runtime's) has, given the ones it runs without (its spec's explicit
// opt-outs). On gvisor the namespaces, cgroup and seccomp are runsc's
// processes' on the host (the Sentry answers the sandbox's system calls),
// and there is no Landlock.
func ControlsOf(wall, version string, degraded []string) Controls {
	c := Controls{Wall: wall, Namespaces: true, Cgroups: true, Seccomp: true, Capabilities: "dropped", NoNewPrivs: true,
		Landlock: !slices.Contains(degraded, "landlock"), OptOut: degraded}
	if wall == "gvisor" {
		c.Runsc, c.Landlock = version, false
	}
	return c
}

// Spec is sp for the record: environment variables by name only (their
// values may be secrets), grants by their rules (no token).
func Spec(sp spec.Spec) spec.Spec {
	names := make([]string, 0, len(sp.Env))
	for _, kv := range sp.Env {
		k, _, _ := strings.Cut(kv, "=")
		names = append(names, k)
	}
	sp.Env = names
	// A grant's placeholder is worthless outside its sandbox, but it is
	// still not written down: the record names the grant by its rules.
	sp.Grants = slices.Clone(sp.Grants)
	for i := range sp.Grants {
		sp.Grants[i].Token = ""
	}
	return sp
}

// PolicyHash names an egress policy by its rules (order aside).
func PolicyHash(allow, deny []string) string {
	a, d := slices.Clone(allow), slices.Clone(deny)
	slices.Sort(a)
	slices.Sort(d)
	sum := sha256.Sum256([]byte("allow\x00" + strings.Join(a, "\x00") + "\x00deny\x00" + strings.Join(d, "\x00")))
	return hex.EncodeToString(sum[:])
}

// EnvNames lists an environment's names, never its values.
func EnvNames(env map[string]string) []string {
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// Digester counts and hashes a stream as it passes.
type Digester struct {
	n int64
	h hash.Hash
}

// NewDigester starts an empty stream's digest.
func NewDigester() *Digester { return &Digester{h: sha256.New()} }

// Add takes the next bytes of the stream.
func (d *Digester) Add(b []byte) { d.n += int64(len(b)); d.h.Write(b) }

// Digest is the stream so far.
func (d *Digester) Digest() Digest {
	return Digest{Bytes: d.n, SHA256: hex.EncodeToString(d.h.Sum(nil))}
}

// Seen is the stream so far, or nil when nothing passed.
func (d *Digester) Seen() *Digest {
	if d.n == 0 {
		return nil
	}
	g := d.Digest()
	return &g
}
