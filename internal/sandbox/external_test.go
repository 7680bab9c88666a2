package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// createOnce is CreateOnce, failing the test on an error.
func (r *lifeRig) createOnce(t *testing.T, p *tenant.Principal, req *api.CreateSandbox) (*api.Sandbox, bool) {
	t.Helper()
	sb, existed, err := r.svc.CreateOnce(context.Background(), p, req)
	if err != nil {
		t.Fatal(err)
	}
	return sb, existed
}

// A create naming an external id makes a sandbox that carries it (its
// description, its stored row, its sandbox.created record); a repeat
// makes nothing and answers that sandbox, also once it has ended (while
// it is on record); another tenant's id of the same name is its own.
// Listing by external id finds it, live or ended.
func TestExternalIDNamesOneSandbox(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	acme := r.tenant(t, "acme", api.Quotas{}, false)
	other := r.tenant(t, "other", api.Quotas{}, false)
	const ext = "k8s.io/uid:0b9e-41c7_x"
	sb, existed := r.createOnce(t, acme, &api.CreateSandbox{ExternalID: ext, Metadata: map[string]string{"k8s.name": "a"}})
	if existed || sb.ExternalID != ext {
		t.Fatalf("first create: existed %v, %+v", existed, sb)
	}
	if st := r.stored(t, sb.ID); st.ExternalID != ext {
		t.Errorf("stored external id %q", st.ExternalID)
	}
	if c := r.records(sb.ID, "sandbox.created"); len(c) != 1 || c[0]["external_id"] != ext {
		t.Errorf("sandbox.created: %v", c)
	}
	again, existed := r.createOnce(t, acme, &api.CreateSandbox{ExternalID: ext, Env: map[string]string{"A": "1"}})
	if !existed || again.ID != sb.ID || again.Metadata["k8s.name"] != "a" {
		t.Errorf("repeat: existed %v, %+v", existed, again)
	}
	if n := r.be.count(); n != 1 {
		t.Errorf("the host made %d sandboxes, want 1", n)
	}
	theirs, existed := r.createOnce(t, other, &api.CreateSandbox{ExternalID: ext})
	if existed || theirs.ID == sb.ID {
		t.Errorf("another tenant's id of that name: existed %v, %s", existed, theirs.ID)
	}
	// Another tenant asking by the same id sees its own alone.
	if l, err := r.svc.ListSandboxes(ctx, other, api.ListSandboxes{ExternalID: ext}); err != nil || len(l) != 1 || l[0].ID != theirs.ID {
		t.Errorf("another tenant's list by that id: %+v %v", l, err)
	}
	plain := r.create(t, acme, &api.CreateSandbox{})
	l, err := r.svc.ListSandboxes(ctx, acme, api.ListSandboxes{ExternalID: ext})
	if err != nil || len(l) != 1 || l[0].ID != sb.ID {
		t.Errorf("list by external id: %+v %v", l, err)
	}
	if l, _ := r.svc.ListSandboxes(ctx, acme, api.ListSandboxes{}); len(l) != 2 {
		t.Errorf("list: %d sandboxes, want 2 (%s, %s)", len(l), sb.ID, plain.ID)
	}

	if err := r.svc.Destroy(ctx, acme, sb.ID); err != nil {
		t.Fatal(err)
	}
	ended, existed := r.createOnce(t, acme, &api.CreateSandbox{ExternalID: ext})
	if !existed || ended.ID != sb.ID || ended.State != api.StateEnded {
		t.Errorf("repeat after its end: existed %v, %+v", existed, ended)
	}
	if n := r.be.count(); n != 3 {
		t.Errorf("the host made %d sandboxes, want 3", n)
	}
	l, err = r.svc.ListSandboxes(ctx, acme, api.ListSandboxes{ExternalID: ext})
	if err != nil || len(l) != 1 || l[0].ID != sb.ID || l[0].State != api.StateEnded {
		t.Errorf("list by external id after its end: %+v %v", l, err)
	}
	// The admin lists every tenant's, each with its tenant.
	admin := &tenant.Principal{Admin: true}
	if l, err := r.svc.ListSandboxes(ctx, admin, api.ListSandboxes{All: true}); err != nil || len(l) != 2 {
		t.Errorf("admin, all: %+v %v", l, err)
	}
	if l, _ := r.svc.ListSandboxes(ctx, admin, api.ListSandboxes{All: true, ExternalID: ext}); len(l) != 2 {
		t.Errorf("admin, all of external id %s: %+v", ext, l)
	}
}

// Malformed external ids, pool_only without a pool, and a tenant asking
// for every tenant's sandboxes are refused; an MCP spec cannot carry an
// external id (it makes many sandboxes).
func TestExternalIDAndListRefusals(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	for _, bad := range []string{strings.Repeat("a", api.MaxExternalID+1), "a b", "a\x00", "é", "a?b", "a#b", "a\nb"} {
		if _, err := r.svc.Create(ctx, p, &api.CreateSandbox{ExternalID: bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("external id %q: %v", bad, err)
		}
		if _, err := r.svc.ListSandboxes(ctx, p, api.ListSandboxes{ExternalID: bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("list by external id %q: %v", bad, err)
		}
	}
	if _, err := r.svc.Create(ctx, p, &api.CreateSandbox{ExternalID: strings.Repeat("a", api.MaxExternalID)}); err != nil {
		t.Errorf("an external id of %d characters: %v", api.MaxExternalID, err)
	}
	if _, err := r.svc.Create(ctx, p, &api.CreateSandbox{PoolOnly: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("pool_only without a pool: %v", err)
	}
	if _, err := r.svc.ListSandboxes(ctx, p, api.ListSandboxes{All: true}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant listing every tenant's: %v", err)
	}
	if err := r.svc.SetMCPSpec(ctx, p, &api.CreateSandbox{ExternalID: "x"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an MCP spec with an external id: %v", err)
	}
	if n := r.be.count(); n != 1 {
		t.Errorf("the host made %d sandboxes, want 1", n)
	}
}

// Creates naming one external id at once make one sandbox, and all
// answer it; when the one making it fails, another makes it, and the
// rest answer that one.
func TestExternalIDConcurrentCreatesMakeOne(t *testing.T) {
	const n = 12 // under the fake host's started buffer: a create too many would hang, not fail
	for _, failFirst := range []bool{false, true} {
		name := "all succeed"
		if failFirst {
			name = "the first fails"
		}
		t.Run(name, func(t *testing.T) {
			r := newLifeRig(t)
			p := r.tenant(t, "acme", api.Quotas{}, false)
			if failFirst {
				r.be.failCreate = func(k int) bool { return k == 1 }
			}
			r.be.gate = make(chan struct{})
			type answer struct {
				sb      *api.Sandbox
				existed bool
				err     error
			}
			answers := make(chan answer, n)
			var entered sync.WaitGroup
			for range n {
				entered.Add(1)
				go func() {
					entered.Done()
					sb, existed, err := r.svc.CreateOnce(context.Background(), p, &api.CreateSandbox{ExternalID: "uid-1"})
					answers <- answer{sb, existed, err}
				}()
			}
			entered.Wait()
			<-r.be.started // one create reached the host, held there
			close(r.be.gate)
			ids := map[string]int{}
			fails, made := 0, 0
			for range n {
				a := <-answers
				switch {
				case a.err != nil:
					fails++
				case !a.existed:
					made++
					ids[a.sb.ID]++
				default:
					ids[a.sb.ID]++
				}
			}
			wantFails := 0
			if failFirst {
				wantFails = 1
			}
			if fails != wantFails || made != 1 || len(ids) != 1 {
				t.Errorf("%d failed (want %d), %d made one (want 1), sandboxes answered %v", fails, wantFails, made, ids)
			}
			if k := r.be.count(); k != 1 {
				t.Errorf("the host made %d sandboxes, want 1", k)
			}
			if l, _ := r.svc.ListSandboxes(context.Background(), p, api.ListSandboxes{ExternalID: "uid-1"}); len(l) != 1 {
				t.Errorf("listed %d of the id, want 1", len(l))
			}
		})
	}
}

// A restarted daemon knows the external ids of the sandboxes it adopts
// (the id is stored with the sandbox): a repeat create answers the
// adopted sandbox and makes nothing.
func TestExternalIDKeptAcrossRestart(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	sb, _ := r.createOnce(t, p, &api.CreateSandbox{ExternalID: "uid-7"})
	r.be.mu.Lock()
	r.be.left[sb.ID] = r.be.made[sb.ID] // still running on the host
	r.be.mu.Unlock()
	r2 := newLifeRigOn(t, r.db, r.be, r.clock)
	if err := r2.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if !r2.live(sb.ID) {
		t.Fatalf("%s was not adopted", sb.ID)
	}
	before := r.be.count()
	again, existed, err := r2.svc.CreateOnce(ctx, p, &api.CreateSandbox{ExternalID: "uid-7"})
	if err != nil || !existed || again.ID != sb.ID || again.ExternalID != "uid-7" {
		t.Errorf("repeat after a restart: existed %v, %+v %v", existed, again, err)
	}
	if r.be.count() != before {
		t.Error("the repeat made a sandbox")
	}
	if l, _ := r2.svc.ListSandboxes(ctx, p, api.ListSandboxes{ExternalID: "uid-7"}); len(l) != 1 || l[0].ID != sb.ID {
		t.Errorf("list by external id after a restart: %+v", l)
	}
}

// pool_only takes a ready sandbox of the pool, given the create's own
// env, metadata and external id like any pool hit; with none ready it
// fails (failed_precondition) and makes nothing, not even afresh.
func TestPoolOnlyTakesAPooledSandboxOrNone(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	if _, err := r.svc.SetPool(ctx, p, "warm", &api.SetPool{Size: 1}); err != nil {
		t.Fatal(err)
	}
	req := &api.CreateSandbox{Pool: "warm", PoolOnly: true, ExternalID: "claim-1", Env: map[string]string{"TASK": "1"}, Metadata: map[string]string{"k8s.claim": "c1"}, TTL: "10m"}
	_, err := r.svc.Create(ctx, p, req)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), `pool warm had no sandbox ready`) {
		t.Fatalf("pool_only, none ready: %v", err)
	}
	if n := r.be.count(); n != 0 {
		t.Errorf("the host made %d sandboxes, want none", n)
	}
	if l := r.svc.List(ctx, p); len(l) != 0 {
		t.Errorf("listed %+v", l)
	}
	r.fillPools()
	ready := r.readyIDs()
	sb, existed := r.createOnce(t, p, req)
	if existed || len(ready) != 1 || sb.ID != ready[0] || sb.Pool != "warm" || sb.ExternalID != "claim-1" || sb.Metadata["k8s.claim"] != "c1" {
		t.Fatalf("pool_only, one ready (%v): %+v", ready, sb)
	}
	if c := r.records(sb.ID, "sandbox.created"); len(c) != 1 || c[0]["external_id"] != "claim-1" || c[0]["pool"] != "warm" {
		t.Errorf("sandbox.created: %v", c)
	}
	if _, err := r.svc.Find(p, sb.ID); err != nil { // settled: its row stored
		t.Fatal(err)
	}
	if st := r.stored(t, sb.ID); st.ExternalID != "claim-1" {
		t.Errorf("stored external id %q", st.ExternalID)
	}
	// A replayed bind answers the same sandbox, the pool empty or not.
	again, existed := r.createOnce(t, p, req)
	if !existed || again.ID != sb.ID {
		t.Errorf("replayed bind: existed %v, %+v", existed, again)
	}
	if pl := r.pool(t, p, "warm"); pl.Hits != 1 || pl.Misses != 1 {
		t.Errorf("pool: %+v", pl)
	}
}

// A sandbox that is ending (gone from the live ones, its end not yet
// stored) still holds its external id: a repeat create in that moment
// answers it and makes nothing, and a listing by the id shows it.
func TestExternalIDHeldWhileItsSandboxEnds(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	sb, _ := r.createOnce(t, p, &api.CreateSandbox{ExternalID: "uid-9"})
	fh := r.be.sandbox(t, sb.ID)
	fh.hold, fh.destroying = make(chan struct{}), make(chan struct{})
	r.svc.Mu.Lock()
	b := r.svc.Boxes[sb.ID]
	r.svc.Mu.Unlock()
	destroyed := make(chan error, 1)
	go func() { destroyed <- r.svc.Destroy(ctx, p, sb.ID) }()
	<-fh.destroying // claimed, being destroyed
	// Its end is held where it has left the live ones and is not stored.
	b.Mu.Lock()
	for len(r.svc.node.kick) > 0 {
		<-r.svc.node.kick
	}
	close(fh.hold)
	for r.live(sb.ID) {
		<-r.svc.node.kick
	}
	before := r.be.count()
	again, existed, err := r.svc.CreateOnce(ctx, p, &api.CreateSandbox{ExternalID: "uid-9"})
	l, lerr := r.svc.ListSandboxes(ctx, p, api.ListSandboxes{ExternalID: "uid-9"})
	b.Mu.Unlock()
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
	if err != nil || !existed || again.ID != sb.ID {
		t.Errorf("repeat while its sandbox ends: existed %v, %+v %v", existed, again, err)
	}
	if n := r.be.count(); n != before {
		t.Errorf("the repeat made a sandbox (%d made, %d before)", n, before)
	}
	if lerr != nil || len(l) != 1 || l[0].ID != sb.ID {
		t.Errorf("list by external id while its sandbox ends: %+v %v", l, lerr)
	}
}
