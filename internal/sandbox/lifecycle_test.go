package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	dto "github.com/prometheus/client_model/go"
)

// The long-lived lifecycle against a fake host (fake_test.go): time moves
// only when a test moves the clock, and the service's own tick (what Run
// does each second) is called by hand.

// A sandbox lives until the clock reaches its expiry, not a millisecond
// less; the tick at its expiry ends it with "TTL expired", destroyed on
// the host, its record ended, its workspace's changes recorded.
func TestTTLExpiryEndsTheSandbox(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	created := r.clock.Now()
	sb := r.create(t, p, &api.CreateSandbox{TTL: "10m", Trigger: api.Trigger{TaskID: "task-7"}})
	if want := created.Add(10 * time.Minute); !sb.Expires.Equal(want) || !sb.Created.Equal(created) {
		t.Errorf("created %v, expires %v; want %v, %v", sb.Created, sb.Expires, created, want)
	}
	c := r.records(sb.ID, "sandbox.created")
	if len(c) != 1 || c[0]["expires"] != created.Add(10*time.Minute).Format(time.RFC3339Nano) || c[0]["idle_timeout"] != "0s" || c[0]["init_pid"] != 4242.0 {
		t.Errorf("sandbox.created: %v", c)
	}

	r.clock.Advance(10*time.Minute - time.Millisecond)
	r.tick()
	if !r.live(sb.ID) {
		t.Fatal("the sandbox ended before its TTL passed")
	}
	r.clock.Advance(time.Millisecond)
	r.tick()
	d := r.wantEnded(t, sb.ID, "TTL expired")
	if ws, _ := d["workspace"].(map[string]any); ws["changed"] != 1.0 {
		t.Errorf("sandbox.destroyed's workspace: %v", d["workspace"])
	}
	if k := r.kinds(sb.ID); !slices.Equal(k, []string{"sandbox.created", "sandbox.destroyed"}) {
		t.Errorf("records: %v", k)
	}
	for _, rec := range r.audit.Records() {
		if rec.Sandbox == sb.ID && (rec.Tenant != p.ID || rec.Trigger != "task-7") {
			t.Errorf("%s record of tenant %q, trigger %q", rec.Kind, rec.Tenant, rec.Trigger)
		}
	}
	got, err := r.svc.Get(ctx, p, sb.ID)
	if err != nil || got.State != api.StateEnded || got.EndReason != "TTL expired" {
		t.Errorf("Get after the end: %+v %v", got, err)
	}
	// Later ticks find nothing more to do.
	r.clock.Advance(time.Hour)
	r.tick()
	if n := len(r.records(sb.ID, "sandbox.destroyed")); n != 1 {
		t.Errorf("%d sandbox.destroyed records", n)
	}
}

// A sandbox with an idle timeout ends once that long passes without a call
// on it; every call starts the wait again.
func TestIdleExpiryAndActivity(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	sb := r.create(t, p, &api.CreateSandbox{TTL: "1h", IdleTimeout: "5m"})

	r.clock.Advance(4 * time.Minute)
	r.tick()
	if err := r.svc.ReadFile(ctx, p, sb.ID, "/workspace/notes.txt", "", io.Discard, 0); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(5*time.Minute - time.Millisecond) // 9 minutes old, idle just under 5
	r.tick()
	if !r.live(sb.ID) {
		t.Fatal("a call did not reset the idle timeout")
	}
	if got, _ := r.svc.Get(ctx, p, sb.ID); !got.LastActive.Equal(r.clock.Now().Add(-5*time.Minute + time.Millisecond)) {
		t.Errorf("last active %v", got.LastActive)
	}
	r.clock.Advance(time.Millisecond)
	r.tick()
	r.wantEnded(t, sb.ID, "idle for 5m0s")
}

// Extend moves the expiry to the TTL from now (past the one it had), and
// is recorded; an invalid TTL or another tenant's sandbox is refused.
func TestExtendMovesTheExpiry(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	other := r.tenant(t, "other", api.Quotas{}, false)
	sb := r.create(t, p, &api.CreateSandbox{TTL: "10m"})

	r.clock.Advance(8 * time.Minute)
	ext, err := r.svc.Extend(ctx, p, sb.ID, &api.Extend{TTL: "30m"})
	want := r.clock.Now().Add(30 * time.Minute)
	if err != nil || !ext.Expires.Equal(want) {
		t.Fatalf("extend: %+v %v; want expiry %v", ext, err, want)
	}
	if e := r.records(sb.ID, "sandbox.extended"); len(e) != 1 || e[0]["expires"] != want.Format(time.RFC3339Nano) {
		t.Errorf("sandbox.extended: %v", e)
	}
	if rec := r.stored(t, sb.ID); !rec.Expires.Equal(want) {
		t.Errorf("stored expiry %v, want %v", rec.Expires, want)
	}
	for _, ttl := range []string{"", "0s", "-1m", "169h", "soon"} {
		if _, err := r.svc.Extend(ctx, p, sb.ID, &api.Extend{TTL: ttl}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("extend by %q: %v", ttl, err)
		}
	}
	if _, err := r.svc.Extend(ctx, other, sb.ID, &api.Extend{TTL: "1h"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant extends it: %v", err)
	}

	r.clock.Advance(2 * time.Minute) // the old expiry
	r.tick()
	if !r.live(sb.ID) {
		t.Fatal("the sandbox ended at the expiry it had before the extension")
	}
	r.clock.Advance(28 * time.Minute)
	r.tick()
	r.wantEnded(t, sb.ID, "TTL expired")
}

// A tenant's quotas count its live sandboxes and its creates in flight; a
// refused create is resource_exhausted, says which quota, and leaves
// nothing on the host; other tenants are not counted.
func TestQuotasCountLiveAndPendingSandboxes(t *testing.T) {
	ctx := context.Background()
	mib := int64(1 << 20)
	for _, tc := range []struct {
		name            string
		q               api.Quotas
		live, held, ask api.Limits
		says            string
	}{
		{"sandboxes", api.Quotas{MaxSandboxes: 2}, api.Limits{}, api.Limits{}, api.Limits{},
			"quota: tenant acme may have 2 sandboxes at once and has 2"},
		{"memory", api.Quotas{MaxMemory: 1024 * mib}, api.Limits{MemoryBytes: 512 * mib}, api.Limits{MemoryBytes: 256 * mib}, api.Limits{MemoryBytes: 512 * mib},
			"quota: tenant acme may use 1GiB of memory in all; its sandboxes hold 768MiB and this one asks 512MiB"},
		{"cpus", api.Quotas{MaxCPUs: 2}, api.Limits{CPUs: 1}, api.Limits{CPUs: 0.5}, api.Limits{CPUs: 1},
			"quota: tenant acme may use 2 CPUs in all; its sandboxes hold 1.5 and this one asks 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLifeRig(t)
			p := r.tenant(t, "acme", tc.q, false)
			other := r.tenant(t, "other", tc.q, false)
			live := r.create(t, p, &api.CreateSandbox{Limits: tc.live})
			r.be.gate = make(chan struct{})
			heldID, res := r.createHeld(t, p, &api.CreateSandbox{Limits: tc.held})

			refused := func(when string) {
				t.Helper()
				made := r.be.count()
				_, err := r.svc.Create(ctx, p, &api.CreateSandbox{Limits: tc.ask})
				if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("%s: a create past the quota answered %v; want resource_exhausted saying %q", when, err, tc.says)
				}
				if r.be.count() != made {
					t.Errorf("%s: a refused create made a sandbox on the host", when)
				}
			}
			refused("one live, one in flight")
			close(r.be.gate)
			if a := <-res; a.err != nil || a.sb.ID != heldID {
				t.Fatalf("the create in flight: %+v %v", a.sb, a.err)
			}
			r.be.gate = nil
			refused("both live")
			r.create(t, other, &api.CreateSandbox{Limits: tc.ask})
			if err := r.svc.Destroy(ctx, p, live.ID); err != nil {
				t.Fatal(err)
			}
			r.wantEnded(t, live.ID, "destroyed by request")
			r.create(t, p, &api.CreateSandbox{Limits: tc.ask})
		})
	}
}

// A tenant past its CPU budget has every sandbox stopped, with the reason,
// and its creates refused until the period ends; the budget is kept in
// the store, and other tenants run on.
func TestCPUBudgetStopsTheTenant(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	start := r.clock.Now()
	p := r.tenant(t, "acme", api.Quotas{CPUSeconds: 10, CPUPeriod: "1h"}, true)
	other := r.tenant(t, "other", api.Quotas{CPUSeconds: 10, CPUPeriod: "1h"}, true)
	a, b := r.create(t, p, &api.CreateSandbox{}), r.create(t, p, &api.CreateSandbox{})
	o := r.create(t, other, &api.CreateSandbox{})
	r.be.sandbox(t, a.ID).setUsage(lifecycle.Usage{CPU: 4 * time.Second})
	r.be.sandbox(t, b.ID).setUsage(lifecycle.Usage{CPU: 5 * time.Second})
	r.be.sandbox(t, o.ID).setUsage(lifecycle.Usage{CPU: 9 * time.Second})

	r.clock.Advance(time.Minute)
	r.tick()
	if !r.live(a.ID) || !r.live(b.ID) {
		t.Fatal("stopped under its budget")
	}
	tn, err := r.db.TenantByName(ctx, "acme")
	if err != nil || tn.CPUUsed != 9*time.Second || !tn.CPUPeriodStart.Equal(start) {
		t.Errorf("stored budget: %v since %v (%v); want 9s since %v", tn.CPUUsed, tn.CPUPeriodStart, err, start)
	}

	r.be.sandbox(t, b.ID).setUsage(lifecycle.Usage{CPU: 6 * time.Second})
	r.clock.Advance(time.Minute)
	wait := r.onEnd(t, a.ID, b.ID)
	r.tick()
	wait()
	const reason = "cpu budget of tenant acme exhausted (10.0 s of 10 s per 1h0m0s)"
	r.wantEnded(t, a.ID, reason)
	d := r.wantEnded(t, b.ID, reason)
	if d["cpu_seconds"] != 6.0 {
		t.Errorf("sandbox.destroyed's cpu_seconds: %v", d["cpu_seconds"])
	}
	if !r.live(o.ID) {
		t.Error("another tenant's sandbox was stopped")
	}
	_, err = r.svc.Create(ctx, p, &api.CreateSandbox{})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "quota: tenant acme has used its CPU budget (10 s per 1h)") {
		t.Errorf("a create past the budget: %v", err)
	}

	// The next period.
	r.clock.Advance(58 * time.Minute)
	r.tick()
	if tn, _ := r.db.TenantByName(ctx, "acme"); tn.CPUUsed != 0 || !tn.CPUPeriodStart.Equal(r.clock.Now()) {
		t.Errorf("the stored budget of a new period: %v since %v", tn.CPUUsed, tn.CPUPeriodStart)
	}
	r.create(t, p, &api.CreateSandbox{})
}

// Pause and resume: running ⇄ paused, each recorded and stored; pausing a
// paused sandbox or resuming a running one is a failed precondition, calls
// on a paused one are refused, and its TTL still runs.
func TestPauseResumeStateMachine(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	other := r.tenant(t, "other", api.Quotas{}, false)
	sb := r.create(t, p, &api.CreateSandbox{TTL: "10m"})
	in := r.be.sandbox(t, sb.ID)

	if _, err := r.svc.Pause(ctx, other, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant pauses it: %v", err)
	}
	ps, err := r.svc.Pause(ctx, p, sb.ID)
	if err != nil || ps.State != api.StatePaused || !in.isPaused() || r.stored(t, sb.ID).State != api.StatePaused {
		t.Fatalf("pause: %+v %v (frozen on the host: %v)", ps, err, in.isPaused())
	}
	if _, err := r.svc.Pause(ctx, p, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "already paused") {
		t.Errorf("pause a paused sandbox: %v", err)
	}
	if err := r.svc.ReadFile(ctx, p, sb.ID, "/workspace/a", "", io.Discard, 0); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "resume it first") {
		t.Errorf("a call on a paused sandbox: %v", err)
	}
	rs, err := r.svc.Resume(ctx, p, sb.ID)
	if err != nil || rs.State != api.StateRunning || in.isPaused() || r.stored(t, sb.ID).State != api.StateRunning {
		t.Fatalf("resume: %+v %v", rs, err)
	}
	if _, err := r.svc.Resume(ctx, p, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "already running") {
		t.Errorf("resume a running sandbox: %v", err)
	}
	if err := r.svc.ReadFile(ctx, p, sb.ID, "/workspace/a", "", io.Discard, 0); err != nil {
		t.Errorf("a call on the resumed sandbox: %v", err)
	}
	if k := r.kinds(sb.ID); !slices.Equal(k, []string{"sandbox.created", "sandbox.paused", "sandbox.resumed", "file.read"}) {
		t.Errorf("records: %v", k)
	}

	if _, err := r.svc.Pause(ctx, p, sb.ID); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(10 * time.Minute)
	r.tick()
	r.wantEnded(t, sb.ID, "TTL expired")
}

// on_ttl "pause": the tick at its TTL pauses the sandbox instead of
// ending it (recorded, with its new expiry) and keeps it api.PausedTTL; a
// resumed one runs to that expiry, where it is paused again; a paused one
// reaching it ends. An unknown on_ttl is refused.
func TestOnTTLPausePausesAtTheTTL(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	if _, err := r.svc.Create(ctx, p, &api.CreateSandbox{TTL: "10m", OnTTL: "freeze"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("on_ttl freeze: %v", err)
	}
	sb := r.create(t, p, &api.CreateSandbox{TTL: "10m", OnTTL: "pause"})
	if sb.OnTTL != "pause" {
		t.Errorf("described as %+v", sb)
	}
	in := r.be.sandbox(t, sb.ID)
	r.clock.Advance(10 * time.Minute)
	r.tick()
	got, err := r.svc.Get(ctx, p, sb.ID)
	if want := r.clock.Now().Add(api.PausedTTL); err != nil || got.State != api.StatePaused || !in.isPaused() || !got.Expires.Equal(want) || r.stored(t, sb.ID).State != api.StatePaused {
		t.Fatalf("at its TTL: %+v %v (frozen: %v), want paused until %v", got, err, in.isPaused(), want)
	}
	if ps := r.records(sb.ID, "sandbox.paused"); len(ps) != 1 || ps[0]["at_ttl"] != true || ps[0]["expires"] != got.Expires.Format(time.RFC3339Nano) {
		t.Errorf("sandbox.paused: %v", ps)
	}
	if _, err := r.svc.Resume(ctx, p, sb.ID); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(api.PausedTTL)
	r.tick()
	if got, _ := r.svc.Get(ctx, p, sb.ID); got.State != api.StatePaused {
		t.Fatalf("resumed, at its new expiry: %s", got.State)
	}
	r.clock.Advance(api.PausedTTL)
	r.tick()
	r.wantEnded(t, sb.ID, "TTL expired")
}

// A pause or resume the host fails leaves the sandbox in the state it is
// recorded in: a failed freeze is undone, a failed thaw leaves it paused
// (so it can be resumed again). A failed pause was once recorded paused
// while the sandbox ran, refusing every call and every resume; a failed
// resume recorded it running while it stayed frozen.
func TestFailedPauseKeepsTheState(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	sb := r.create(t, p, &api.CreateSandbox{})
	in := r.be.sandbox(t, sb.ID)
	busy := errors.New("cgroup: cgroup.freeze did not become 1")

	in.failNext(busy, nil)
	if _, err := r.svc.Pause(ctx, p, sb.ID); !errors.Is(err, busy) {
		t.Fatalf("a pause the host fails: %v", err)
	}
	if got, _ := r.svc.Get(ctx, p, sb.ID); got.State != api.StateRunning || in.isPaused() {
		t.Errorf("after a failed pause the sandbox is %s (frozen on the host: %v)", got.State, in.isPaused())
	}
	if err := r.svc.ReadFile(ctx, p, sb.ID, "/workspace/a", "", io.Discard, 0); err != nil {
		t.Errorf("a call after a failed pause: %v", err)
	}
	in.failNext(nil, nil)
	if _, err := r.svc.Pause(ctx, p, sb.ID); err != nil {
		t.Fatalf("the pause, tried again: %v", err)
	}
	in.failNext(nil, busy)
	if _, err := r.svc.Resume(ctx, p, sb.ID); !errors.Is(err, busy) {
		t.Fatalf("a resume the host fails: %v", err)
	}
	if got, _ := r.svc.Get(ctx, p, sb.ID); got.State != api.StatePaused || !in.isPaused() {
		t.Errorf("after a failed resume the sandbox is %s (frozen on the host: %v)", got.State, in.isPaused())
	}
	in.failNext(nil, nil)
	if _, err := r.svc.Resume(ctx, p, sb.ID); err != nil || in.isPaused() {
		t.Fatalf("the resume, tried again: %v (frozen on the host: %v)", err, in.isPaused())
	}
	if k := r.kinds(sb.ID); !slices.Equal(k, []string{"sandbox.created", "file.read", "sandbox.paused", "sandbox.resumed"}) {
		t.Errorf("records: %v", k)
	}
}

// A sandbox being destroyed takes no more changes or calls: each answers
// not found, "it is ending", and nothing is recorded of it but its end;
// a tick meanwhile does not end it twice. (Extend once answered success,
// recorded sandbox.extended and stored a running record for a sandbox
// being destroyed.)
func TestNoChangeToAnEndingSandbox(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	sb := r.create(t, p, &api.CreateSandbox{TTL: "10m"})
	in := r.be.sandbox(t, sb.ID)
	in.hold, in.destroying = make(chan struct{}), make(chan struct{})
	destroyed := make(chan error, 1)
	go func() { destroyed <- r.svc.Destroy(ctx, p, sb.ID) }()
	<-in.destroying

	for what, call := range map[string]func() error{
		"extend": func() error { _, err := r.svc.Extend(ctx, p, sb.ID, &api.Extend{TTL: "1h"}); return err },
		"pause":  func() error { _, err := r.svc.Pause(ctx, p, sb.ID); return err },
		"read":   func() error { return r.svc.ReadFile(ctx, p, sb.ID, "/workspace/a", "", io.Discard, 0) },
	} {
		if err := call(); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "it is ending") {
			t.Errorf("%s while it is destroyed: %v", what, err)
		}
	}
	r.clock.Advance(10 * time.Minute)
	r.tick()
	close(in.hold)
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
	r.wantEnded(t, sb.ID, "destroyed by request")
	if k := r.kinds(sb.ID); !slices.Equal(k, []string{"sandbox.created", "sandbox.destroyed"}) {
		t.Errorf("records: %v", k)
	}
}

// The kill switch kills every sandbox before it tears any down (the
// kernel ends them all at once; one's teardown waited behind another's),
// and each ends for the kill switch's reason, not for its init's death,
// which its watcher sees first.
func TestKillSwitchKillsEverySandboxBeforeTearingAnyDown(t *testing.T) {
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	var ids []string
	for range 3 {
		ids = append(ids, r.create(t, p, &api.CreateSandbox{}).ID)
	}
	if _, err := r.svc.KillAll(context.Background(), p, ""); err != nil {
		t.Fatal(err)
	}
	r.be.mu.Lock()
	ends := slices.Clone(r.be.ends)
	r.be.mu.Unlock()
	if want := []string{"kill", "kill", "kill", "destroy", "destroy", "destroy"}; !slices.Equal(ends, want) {
		t.Errorf("the sandboxes were told %v, want %v", ends, want)
	}
	for _, id := range ids {
		r.wantEnded(t, id, "kill switch (tenant acme)")
	}
}

// A kill switch fails when the host could not remove all of a sandbox (it
// said it was done, and answered nil), once every sandbox is ended and
// recorded, the one left behind included.
func TestKillSwitchFailsWhenASandboxStays(t *testing.T) {
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	stays, goes := r.create(t, p, &api.CreateSandbox{}), r.create(t, p, &api.CreateSandbox{})
	r.be.sandbox(t, stays.ID).failDestroy = errors.New("rmdir /sys/fs/cgroup/memory/airlock/x: device or resource busy")
	ids, err := r.svc.KillAll(context.Background(), p, "")
	if err == nil || !strings.Contains(err.Error(), stays.ID) || !strings.Contains(err.Error(), "resource busy") || strings.Contains(err.Error(), goes.ID) {
		t.Errorf("kill switch: %v", err)
	}
	if len(ids) != 2 {
		t.Errorf("ended %v, want both", ids)
	}
	r.wantEnded(t, stays.ID, "kill switch (tenant acme)")
	r.wantEnded(t, goes.ID, "kill switch (tenant acme)")
	if ks := r.records("", "killswitch"); len(ks) != 1 {
		t.Errorf("killswitch records: %v", ks)
	}
}

// The kill switch of a tenant ends its live sandboxes and its creates in
// flight, each recorded with the reason, answers once they are gone and
// leaves other tenants' alone; the admin's ends every tenant's.
func TestKillSwitchEndsLiveAndPendingSandboxes(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	other := r.tenant(t, "other", api.Quotas{}, false)
	a1, a2 := r.create(t, p, &api.CreateSandbox{}), r.create(t, p, &api.CreateSandbox{})
	o := r.create(t, other, &api.CreateSandbox{})
	r.be.gate = make(chan struct{})
	held, res := r.createHeld(t, p, &api.CreateSandbox{})

	if _, err := r.svc.KillAll(ctx, other, "acme"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's kill switch: %v", err)
	}
	ids, err := r.svc.KillAll(ctx, p, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Sorted(slices.Values([]string{a1.ID, a2.ID, held})); !slices.Equal(ids, want) {
		t.Errorf("destroyed %v, want %v", ids, want)
	}
	const reason = "kill switch (tenant acme)"
	a := <-res // answered before the kill switch did
	if !errors.Is(a.err, errdefs.ErrFailedPrecondition) || !strings.Contains(a.err.Error(), held) || !strings.Contains(a.err.Error(), reason) {
		t.Errorf("the create in flight answered %+v, %v", a.sb, a.err)
	}
	r.wantEnded(t, a1.ID, reason)
	r.wantEnded(t, a2.ID, reason)
	if d := r.records(held, "sandbox.destroyed"); len(d) != 1 || d[0]["reason"] != reason || d[0]["while"] != "create" {
		t.Errorf("the create in flight's sandbox.destroyed: %v", d)
	}
	if n := r.be.count(); n != 3 {
		t.Errorf("the host made %d sandboxes, want 3: the create in flight made its own after the kill switch", n)
	}
	if !r.live(o.ID) {
		t.Error("another tenant's sandbox was destroyed")
	}
	ks := r.records("", "killswitch")
	if len(ks) != 1 || ks[0]["admin"] != false || len(ks[0]["destroyed"].([]any)) != 3 {
		t.Errorf("killswitch records: %v", ks)
	}

	r.be.gate = nil
	admin := &tenant.Principal{Admin: true}
	if ids, err := r.svc.KillAll(ctx, admin, ""); err != nil || !slices.Equal(ids, []string{o.ID}) {
		t.Errorf("the admin's kill switch: %v %v", ids, err)
	}
	r.wantEnded(t, o.ID, "kill switch (all tenants)")
	// It is no ban: the tenant's next create runs.
	r.create(t, p, &api.CreateSandbox{})
}

// A sandbox whose init dies on its own ends with why: its init exited,
// and the limits it had reached (an OOM kill, refused forks).
func TestSandboxDyingOnItsOwnEnds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		usage  lifecycle.Usage
		reason string
	}{
		{"exit", lifecycle.Usage{}, "the sandbox's init exited (its agent stopped)"},
		{"pids", lifecycle.Usage{PidsLimited: 3}, "the sandbox's init exited (its agent stopped); its pids limit (64) had been reached"},
		{"oom", lifecycle.Usage{OOMKills: 1, MemoryPeak: 256 << 20}, "the sandbox's init exited (its agent stopped); its memory limit (256MiB) had been reached (1 OOM kills)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLifeRig(t)
			p := r.tenant(t, "acme", api.Quotas{}, false)
			sb := r.create(t, p, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 256 << 20, Pids: 64}})
			in := r.be.sandbox(t, sb.ID)
			in.setUsage(tc.usage)
			wait := r.onEnd(t, sb.ID)
			in.die()
			wait()
			d := r.wantEnded(t, sb.ID, tc.reason)
			if d["oom_kills"] != float64(tc.usage.OOMKills) || d["pids_limited"] != float64(tc.usage.PidsLimited) || d["memory_peak_bytes"] != float64(tc.usage.MemoryPeak) {
				t.Errorf("sandbox.destroyed: %v", d)
			}
		})
	}
}

// leftRecord stores the record of a sandbox an earlier daemon made.
func (r *lifeRig) leftRecord(t *testing.T, rec store.Sandbox) {
	t.Helper()
	if rec.Spec == "" {
		b, _ := json.Marshal(spec.Default())
		rec.Spec = string(b)
	}
	if rec.State == "" {
		rec.State = api.StateRunning
	}
	if rec.Created.IsZero() {
		rec.Created = r.clock.Now().Add(-2 * time.Hour)
		rec.LastActive = rec.Created
	}
	if rec.Expires.IsZero() {
		rec.Expires = r.clock.Now().Add(time.Hour)
	}
	if err := r.db.PutSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

// After a restart, Recover adopts every recorded sandbox the host still
// runs with an agent it speaks to (running, or paused: frozen again once
// its agent answered, as a frozen agent does not; its TTL kept, its idle
// time restarted); the others are ended with the reason and their
// remains discarded, and so is a sandbox the host holds without a record.
// Ended records older than a day are pruned. (A paused sandbox was once
// ended at every restart: its frozen agent never answered hello.)
func TestRecoverAdoptsOrEnds(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	now := r.clock.Now()
	p := r.tenant(t, "acme", api.Quotas{}, false)
	r.leftRecord(t, store.Sandbox{ID: "running", Tenant: p.ID, InitPid: 101, IdleTimeout: 5 * time.Minute})
	r.be.leave("running", 101, AgentProtocol, false)
	r.leftRecord(t, store.Sandbox{ID: "paused", Tenant: p.ID, InitPid: 102, State: api.StatePaused})
	r.be.leave("paused", 102, AgentProtocol, true)
	r.leftRecord(t, store.Sandbox{ID: "expired", Tenant: p.ID, InitPid: 103, Expires: now.Add(-time.Second)})
	r.be.leave("expired", 103, AgentProtocol, false)
	r.leftRecord(t, store.Sandbox{ID: "gone", Tenant: p.ID, InitPid: 104})
	r.leftRecord(t, store.Sandbox{ID: "garbled", Tenant: p.ID, InitPid: 105, Spec: "{"})
	r.be.leave("garbled", 105, AgentProtocol, false)
	r.leftRecord(t, store.Sandbox{ID: "old-agent", Tenant: p.ID, InitPid: 106})
	// An agent of the protocol before this daemon's (a sandbox made
	// before an upgrade) is not adopted.
	oldAgent := r.be.leave("old-agent", 106, AgentProtocol-1, false)
	r.be.leave("stray", 107, AgentProtocol, false)
	r.leftRecord(t, store.Sandbox{ID: "ended-long-ago", Tenant: p.ID, State: api.StateEnded, Ended: now.Add(-keepEnded - time.Second), EndReason: "TTL expired"})
	r.leftRecord(t, store.Sandbox{ID: "ended-lately", Tenant: p.ID, State: api.StateEnded, Ended: now.Add(-keepEnded + time.Second), EndReason: "TTL expired"})

	if err := r.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	var live []string
	for _, sb := range r.svc.List(ctx, p) {
		live = append(live, sb.ID+" "+sb.State)
		if !sb.LastActive.Equal(now) {
			t.Errorf("%s: last active %v, want the restart's %v", sb.ID, sb.LastActive, now)
		}
	}
	slices.Sort(live)
	if want := []string{"expired running", "paused paused", "running running"}; !slices.Equal(live, want) {
		t.Errorf("adopted %v, want %v", live, want)
	}
	for _, id := range []string{"running", "paused", "expired"} {
		if a := r.records(id, "sandbox.adopted"); len(a) != 1 || a[0]["init_pid"] != float64(r.be.left[id].pid) {
			t.Errorf("%s: sandbox.adopted %v", id, a)
		}
	}
	const lost = "not adopted after a daemon restart: "
	for id, reason := range map[string]string{
		"gone":      lost + "init 104 of sandbox gone is gone",
		"garbled":   lost + "its record is unreadable: unexpected end of JSON input",
		"old-agent": lost + fmt.Sprintf("unavailable on this host: the sandbox's agent speaks protocol %d, this daemon %d", AgentProtocol-1, AgentProtocol),
		"stray":     "found without a record after a daemon restart",
	} {
		d := r.records(id, "sandbox.destroyed")
		if len(d) != 1 || d[0]["reason"] != reason {
			t.Errorf("%s: sandbox.destroyed %v, want the reason %q", id, d, reason)
		}
		if id == "stray" {
			continue
		}
		if rec := r.stored(t, id); rec.State != api.StateEnded || rec.EndReason != reason || !rec.Ended.Equal(now) {
			t.Errorf("%s's record: %s at %v for %q", id, rec.State, rec.Ended, rec.EndReason)
		}
	}
	if d := r.be.discards(); !slices.Equal(d, []string{"garbled", "gone", "old-agent", "stray"}) {
		t.Errorf("discarded %v", d)
	}
	if !oldAgent.gone() {
		t.Error("the sandbox whose agent speaks another protocol was not destroyed")
	}
	if _, err := r.db.SandboxByID(ctx, "ended-long-ago"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a record ended over a day ago: %v", err)
	}
	r.stored(t, "ended-lately")
	// The paused one is frozen as it was, and resumes.
	if !r.be.sandbox(t, "paused").isPaused() {
		t.Error("the adopted paused sandbox runs")
	}
	if sb, err := r.svc.Resume(ctx, p, "paused"); err != nil || sb.State != api.StateRunning {
		t.Errorf("resume the adopted paused sandbox: %+v %v", sb, err)
	}
	if err := r.svc.ReadFile(ctx, p, "paused", "/workspace/a", "", io.Discard, 0); err != nil {
		t.Errorf("a call on the adopted sandbox, resumed: %v", err)
	}

	// The first tick ends what expired while no daemon ran; the idle time
	// of the others counts from the restart.
	r.tick()
	r.wantEnded(t, "expired", "TTL expired")
	if !r.live("running") || !r.live("paused") {
		t.Error("an adopted sandbox ended at the first tick")
	}
	r.clock.Advance(5 * time.Minute)
	r.tick()
	r.wantEnded(t, "running", "idle for 5m0s")
}

// CPU time an adopted sandbox used before the restart was charged by the
// earlier daemon (the store keeps it): it is not charged again.
func TestAdoptedCPUIsNotChargedAgain(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{CPUSeconds: 10, CPUPeriod: "1h"}, true)
	r.leftRecord(t, store.Sandbox{ID: "busy", Tenant: p.ID, InitPid: 101})
	in := r.be.leave("busy", 101, AgentProtocol, false)
	in.setUsage(lifecycle.Usage{CPU: time.Minute})
	if err := r.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	r.tick()
	if !r.live("busy") {
		t.Fatal("an adopted sandbox was charged the CPU time of before the restart")
	}
	in.setUsage(lifecycle.Usage{CPU: time.Minute + 10*time.Second})
	wait := r.onEnd(t, "busy")
	r.tick()
	wait()
	r.wantEnded(t, "busy", "cpu budget of tenant acme exhausted (10.0 s of 10 s per 1h0m0s)")
}

// A tenant's CPU use stored by the earlier daemon counts after a restart,
// even when a sandbox ends before the first tick. (A sandbox ending then,
// by request or at the first tick's TTL expiries, which run beside the
// tick's loading of the budgets, started the tenant's budget afresh and
// threw the stored use away.)
func TestStoredCPUBudgetSurvivesAnEarlyEnd(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{CPUSeconds: 10, CPUPeriod: "1h"}, true)
	if err := r.db.SetTenantCPU(ctx, p.ID, r.clock.Now(), 8*time.Second); err != nil {
		t.Fatal(err)
	}
	r.leftRecord(t, store.Sandbox{ID: "ends-early", Tenant: p.ID, InitPid: 101})
	early := r.be.leave("ends-early", 101, AgentProtocol, false)
	r.leftRecord(t, store.Sandbox{ID: "runs-on", Tenant: p.ID, InitPid: 102})
	on := r.be.leave("runs-on", 102, AgentProtocol, false)
	if err := r.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	early.setUsage(lifecycle.Usage{CPU: time.Second})
	if err := r.svc.Destroy(ctx, p, "ends-early"); err != nil {
		t.Fatal(err)
	}
	r.tick()
	if tn, _ := r.db.TenantByName(ctx, "acme"); tn.CPUUsed != 9*time.Second {
		t.Errorf("stored CPU use %v after the restart, want 9s (8s before it, 1s since)", tn.CPUUsed)
	}
	on.setUsage(lifecycle.Usage{CPU: time.Second})
	wait := r.onEnd(t, "runs-on")
	r.tick()
	wait()
	r.wantEnded(t, "runs-on", "cpu budget of tenant acme exhausted (10.0 s of 10 s per 1h0m0s)")
}

// A sandbox stopped for its tenant's CPU budget is counted once in
// airlock_limit_kills_total, however many ticks pass while it is
// destroyed (each tick counted it again).
func TestCPUBudgetKillIsCountedOnce(t *testing.T) {
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{CPUSeconds: 10, CPUPeriod: "1h"}, true)
	sb := r.create(t, p, &api.CreateSandbox{})
	in := r.be.sandbox(t, sb.ID)
	in.hold, in.destroying = make(chan struct{}), make(chan struct{})
	in.setUsage(lifecycle.Usage{CPU: 11 * time.Second})
	wait := r.onEnd(t, sb.ID)
	r.tick()
	<-in.destroying
	r.clock.Advance(time.Second)
	r.tick()
	close(in.hold)
	wait()
	r.wantEnded(t, sb.ID, "cpu budget of tenant acme exhausted (11.0 s of 10 s per 1h0m0s)")
	var m dto.Metric
	if err := r.svc.Cfg.Metrics.LimitKills.WithLabelValues("cpu_budget").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("cpu_budget limit kills: %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
}

// Regression (issue 14): the admin key can act on any tenant's sandbox,
// and the records did not say it was the admin who did: they name the
// actor. The tenant's own calls and the daemon's decisions name none.
func TestAdminActionsNameTheActor(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	admin := &tenant.Principal{Admin: true}
	own := r.create(t, p, &api.CreateSandbox{})
	if _, err := r.svc.Extend(ctx, p, own.ID, &api.Extend{TTL: "2h"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.svc.Extend(ctx, admin, own.ID, &api.Extend{TTL: "3h"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.svc.Pause(ctx, admin, own.ID); err != nil {
		t.Fatal(err)
	}
	if err := r.svc.Destroy(ctx, admin, own.ID); err != nil {
		t.Fatal(err)
	}
	var actors []string
	for _, rec := range r.audit.Records() {
		if rec.Sandbox == own.ID {
			actors = append(actors, rec.Kind+"="+rec.Actor)
		}
	}
	want := []string{"sandbox.created=", "sandbox.extended=", "sandbox.extended=admin", "sandbox.paused=admin", "sandbox.destroyed=admin"}
	if !slices.Equal(actors, want) {
		t.Errorf("records' actors: %v, want %v", actors, want)
	}
}
