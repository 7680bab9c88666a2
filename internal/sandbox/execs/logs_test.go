package execs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// readAll is what a reader from the start gets of l: stdout, stderr and
// terminal output, the bytes it was told are gone, and the end.
func readAll(l *outputLog) (out, errs string, lost int64, end *api.ExecEnd) {
	var at int64
	evs, lost, end, _ := l.read(&at)
	var o, e bytes.Buffer
	for _, ev := range evs {
		o.Write(ev.Stdout)
		o.Write(ev.PTY)
		e.Write(ev.Stderr)
	}
	return o.String(), e.String(), lost, end
}

// Issue 14 (airlock logs): a background command's output is kept in
// order, the newest bytes past its share, with the count of what went.
func TestLogKeepsTheNewestOutput(t *testing.T) {
	ls := newLogs()
	ls.perCommand = 2 * logStep
	l := ls.open("sb", "t", 7)
	l.add(&api.ExecEvent{Stdout: []byte("one\n")})
	l.add(&api.ExecEvent{Stderr: []byte("two\n")})
	if out, errs, lost, end := readAll(l); out != "one\n" || errs != "two\n" || lost != 0 || end != nil {
		t.Fatalf("%q %q %d %v", out, errs, lost, end)
	}
	big := bytes.Repeat([]byte("x"), 3*logStep)
	copy(big[len(big)-4:], "tail")
	l.add(&api.ExecEvent{Stdout: big})
	out, errs, lost, _ := readAll(l)
	if int64(len(out)) != ls.perCommand || !strings.HasSuffix(out, "tail") || errs != "" || lost != 8+3*logStep-ls.perCommand {
		t.Fatalf("past the share: %d bytes kept, %q, %d lost", len(out), errs, lost)
	}
	l.add(&api.ExecEvent{Stdout: []byte("end")})
	if out, _, _, _ := readAll(l); int64(len(out)) != ls.perCommand || !strings.HasSuffix(out, "tailend") {
		t.Fatalf("a partly kept chunk: %d bytes, ends %q", len(out), out[len(out)-10:])
	}
	l.finish(&api.ExecEnd{ExitCode: 3})
	if _, _, _, end := readAll(l); end == nil || end.ExitCode != 3 {
		t.Fatalf("end: %v", end)
	}
	if ls.sandbox["sb"] != ls.perCommand || ls.tenant["t"] != ls.perCommand {
		t.Errorf("granted %d to the sandbox, %d to the tenant", ls.sandbox["sb"], ls.tenant["t"])
	}
	ls.drop("sb")
	if ls.get("sb", 7) != nil || len(ls.sandbox)+len(ls.tenant)+len(ls.ended) != 0 {
		t.Errorf("after the sandbox's end: %v %v %d", ls.sandbox, ls.tenant, len(ls.ended))
	}
}

// The logs of a sandbox and of a tenant hold at most their share: a
// running command takes an ended one's, and keeps what it can past it.
func TestLogsAreBoundedPerSandboxAndTenant(t *testing.T) {
	ls := newLogs()
	ls.perCommand, ls.perSandbox, ls.perTenant = 2*logStep, 3*logStep, 4*logStep
	chunk := bytes.Repeat([]byte("y"), 2*logStep)
	a := ls.open("s1", "t", 1)
	a.add(&api.ExecEvent{Stdout: chunk})
	b := ls.open("s1", "t", 2)
	b.add(&api.ExecEvent{Stdout: chunk})
	if ls.sandbox["s1"] != 3*logStep || b.granted != logStep {
		t.Fatalf("sandbox share: %d held, the second command %d", ls.sandbox["s1"], b.granted)
	}
	if out, _, lost, _ := readAll(b); len(out) != logStep || lost != logStep {
		t.Fatalf("the second command kept %d, lost %d", len(out), lost)
	}
	a.finish(&api.ExecEnd{})
	b.add(&api.ExecEvent{Stdout: chunk})
	if ls.get("s1", 1) != nil || b.granted != 2*logStep {
		t.Errorf("a running command did not take the ended one's share: %d", b.granted)
	}
	c := ls.open("s2", "t", 1)
	c.add(&api.ExecEvent{Stdout: chunk})
	if ls.tenant["t"] > ls.perTenant || c.granted != 2*logStep {
		t.Errorf("tenant share: %d held (c %d)", ls.tenant["t"], c.granted)
	}
	e := ls.open("s4", "t", 1)
	e.add(&api.ExecEvent{Stdout: chunk})
	if out, _, lost, _ := readAll(e); ls.tenant["t"] != ls.perTenant || e.granted != 0 || out != "" || lost != 2*logStep {
		t.Errorf("past the tenant's share: %d held, %d kept, %d lost", ls.tenant["t"], len(out), lost)
	}
	d := ls.open("s3", "other", 1)
	d.add(&api.ExecEvent{Stdout: chunk})
	if d.granted != 2*logStep {
		t.Errorf("another tenant's command is held to this one's share: %d", d.granted)
	}
}

// At most endedLogsPerSandbox ended commands' logs are kept; a new
// command of a pid replaces the log of the one before.
func TestEndedLogsAreCapped(t *testing.T) {
	ls := newLogs()
	for pid := uint32(1); pid <= endedLogsPerSandbox+3; pid++ {
		l := ls.open("sb", "t", pid)
		l.add(&api.ExecEvent{Stdout: []byte("x")})
		l.finish(nil)
	}
	if ls.get("sb", 1) != nil || ls.get("sb", 3) != nil || ls.get("sb", 4) == nil || len(ls.ended) != endedLogsPerSandbox {
		t.Errorf("%d ended logs kept", len(ls.ended))
	}
	if _, _, _, end := readAll(ls.get("sb", 4)); end == nil || end.ExitCode != -1 || !strings.Contains(end.Status, "unknown") {
		t.Errorf("a lost stream's end: %+v", end)
	}
	l := ls.open("sb", "t", 4)
	if out, _, _, end := readAll(l); out != "" || end != nil {
		t.Errorf("a pid's new command shows its old output: %q %v", out, end)
	}
}

// Logs answers another tenant's sandbox as a missing one, a command
// whose output is not kept as not found, and with follow streams new
// output up to the end.
func TestLogsStreamsAndFollows(t *testing.T) {
	c := core.New(core.Config{})
	s := New(c)
	b := &core.Box{Rec: store.Sandbox{ID: "sb", Tenant: "t-a"}, Ended: make(chan struct{})}
	c.Boxes["sb"] = b
	alice, bob := &tenant.Principal{ID: "t-a"}, &tenant.Principal{ID: "t-b"}
	l := s.keepLog(b, 9)
	l.add(&api.ExecEvent{Stdout: []byte("before\n")})
	ctx := context.Background()
	collect := func(evs *[]*api.ExecEvent) func(*api.ExecEvent) error {
		return func(ev *api.ExecEvent) error { *evs = append(*evs, ev); return nil }
	}
	if err := s.Logs(ctx, bob, "sb", 9, false, func(*api.ExecEvent) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) || strings.Contains(err.Error(), "pid") {
		t.Errorf("another tenant: %v", err)
	}
	if err := s.Logs(ctx, alice, "sb", 10, false, func(*api.ExecEvent) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a pid with no log: %v", err)
	}
	var evs []*api.ExecEvent
	if err := s.Logs(ctx, alice, "sb", 9, false, collect(&evs)); err != nil || len(evs) != 2 || evs[0].PID != 9 || string(evs[1].Stdout) != "before\n" {
		t.Fatalf("logs: %v %+v", err, evs)
	}
	// Following: each event it emits lets the command go on, so the
	// follower sees new output after it has caught up.
	evs = nil
	step := 0
	err := s.Logs(ctx, alice, "sb", 9, true, func(ev *api.ExecEvent) error {
		evs = append(evs, ev)
		if ev.End == nil && len(ev.Stdout) > 0 {
			step++
			if step < 3 {
				go l.add(&api.ExecEvent{Stdout: fmt.Appendf(nil, "line %d\n", step)})
			} else {
				go l.finish(&api.ExecEnd{ExitCode: 4})
			}
		}
		return nil
	})
	var out strings.Builder
	for _, ev := range evs {
		out.Write(ev.Stdout)
	}
	if err != nil || out.String() != "before\nline 1\nline 2\n" || evs[len(evs)-1].End == nil || evs[len(evs)-1].End.ExitCode != 4 {
		t.Fatalf("follow: %v %q %+v", err, out.String(), evs[len(evs)-1])
	}
	// The watcher drops the sandbox's logs once it has ended.
	close(b.Ended)
	for i := 0; s.logs.get("sb", 9) != nil; i++ {
		if i == 1e7 {
			t.Fatal("the logs of an ended sandbox are kept")
		}
		runtime.Gosched()
	}
}

// A command that alternates stdout and stderr a byte at a time makes a
// chunk per byte: their count is bounded too, the oldest going first.
func TestLogBookkeepingIsBounded(t *testing.T) {
	ls := newLogs()
	ls.perCommand = logStep
	l := ls.open("sb", "t", 1)
	for i := 0; i < logStep; i++ {
		if i%2 == 0 {
			l.add(&api.ExecEvent{Stdout: []byte("o")})
		} else {
			l.add(&api.ExecEvent{Stderr: []byte("e")})
		}
	}
	if max := logStep/minChunk + 1; len(l.chunks) > max {
		t.Errorf("%d chunks, at most %d", len(l.chunks), max)
	}
	out, errs, lost, _ := readAll(l)
	if d := len(out) - len(errs); d < -1 || d > 1 || int64(len(out)+len(errs))+lost != logStep || !strings.HasSuffix(errs, "e") {
		t.Errorf("kept %d+%d, lost %d", len(out), len(errs), lost)
	}
	// Writes of one stream share a chunk.
	m := ls.open("sb", "t", 2)
	for range 100 {
		m.add(&api.ExecEvent{Stdout: []byte("line\n")})
	}
	if out, _, _, _ := readAll(m); len(m.chunks) != 1 || out != strings.Repeat("line\n", 100) {
		t.Errorf("%d chunks for one stream's small writes", len(m.chunks))
	}
}

// A command that fills its log with one big write and then writes a byte
// at a time on the other stream makes each byte let go of one byte of the
// big chunk: that must not copy the rest of the chunk every time (a
// sandbox making the daemon copy and allocate tens of KiB per byte it
// prints).
func TestLogTrimsWithoutCopyingPerByte(t *testing.T) {
	ls := newLogs()
	ls.perCommand = logStep
	l := ls.open("sb", "t", 1)
	l.add(&api.ExecEvent{Stdout: bytes.Repeat([]byte("x"), logStep)})
	const n = 5000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		l.add(&api.ExecEvent{Stderr: []byte("e")})
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 16*logStep {
		t.Errorf("%d one-byte writes allocated %d bytes (%d a byte)", n, got, got/n)
	}
	out, errs, lost, _ := readAll(l)
	if len(out)+len(errs) != logStep || errs != strings.Repeat("e", n) || lost != n {
		t.Errorf("kept %d+%d bytes, lost %d", len(out), len(errs), lost)
	}
}
