package sandbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// What a create asks per request (env, TTL) never keeps it from a pool;
// what is made into a sandbox (workspace, grants, egress policy, image,
// limits, wall, hostname, writable root) does, and says which.
func TestPoolsMatchOnlyWhatIsMadeAhead(t *testing.T) {
	mk := func(req api.CreateSandbox) spec.Spec {
		t.Helper()
		sp, _, _, err := core.SpecOf(&req)
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	pool := matchable(mk(api.CreateSandbox{Image: "host", Limits: api.Limits{MemoryBytes: 512 << 20}, Network: api.Network{Mode: "proxy", Allow: []string{"pypi"}}}))
	base := api.CreateSandbox{Image: "host", Limits: api.Limits{MemoryBytes: 512 << 20}, Network: api.Network{Mode: "proxy", Allow: []string{"pypi"}}}
	for _, tc := range []struct {
		name string
		edit func(*api.CreateSandbox)
		want string // a piece of the reason; "" matches
	}{
		{"same", func(*api.CreateSandbox) {}, ""},
		{"env, ttl, idle, metadata, trigger", func(r *api.CreateSandbox) {
			r.Env = map[string]string{"A": "1"}
			r.TTL, r.IdleTimeout = "5m", "1m"
			r.Metadata = map[string]string{"k": "v"}
			r.Trigger.TaskID = "t1"
		}, ""},
		{"workspace", func(r *api.CreateSandbox) { r.Workspace = "/srv/ws" }, "workspace"},
		{"repo", func(r *api.CreateSandbox) { r.Repo = "/srv/repo" }, "repo"},
		{"grants", func(r *api.CreateSandbox) {
			r.Grants = []api.Grant{{Secret: "gh", Host: "api.github.com", Allow: []string{"GET /**"}}}
		}, "grants"},
		{"allow", func(r *api.CreateSandbox) { r.Network.Allow = []string{"npm"} }, "egress policy"},
		{"deny", func(r *api.CreateSandbox) { r.Network.Deny = []string{"evil.example"} }, "egress policy"},
		{"no network", func(r *api.CreateSandbox) { r.Network = api.Network{} }, "network mode"},
		{"memory", func(r *api.CreateSandbox) { r.Limits.MemoryBytes = 256 << 20 }, "limits"},
		{"cpus", func(r *api.CreateSandbox) { r.Limits.CPUs = 2 }, "limits"},
		{"image", func(r *api.CreateSandbox) { r.Image = "/srv/rootfs" }, "image"},
		{"isolation", func(r *api.CreateSandbox) { r.Isolation = "gvisor" }, "isolation"},
		{"hostname", func(r *api.CreateSandbox) { r.Hostname = "box" }, "hostname"},
		{"writable root", func(r *api.CreateSandbox) { r.WritableRootfs = true }, "writable root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := base
			req.Network.Allow = slices.Clone(base.Network.Allow)
			tc.edit(&req)
			got := poolMismatch(pool, mk(req))
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("mismatch %q, want one saying %q", got, tc.want)
			}
		})
	}
}

// poolRig is a life rig whose service keeps pools for tenant p.
func poolRig(t *testing.T, q api.Quotas) (*lifeRig, *tenant.Principal) {
	r := newLifeRig(t)
	p := r.tenant(t, "acme", q, false)
	r.svc.Cfg.Principal = func(context.Context, string) (*tenant.Principal, error) { return p, nil }
	return r, p
}

// fillPools makes what the pools lack, as the refiller does, but here.
func (r *lifeRig) fillPools() {
	for {
		ps := r.svc.needs(poolFills)
		if len(ps) == 0 {
			return
		}
		for _, p := range ps {
			r.svc.fill(context.Background(), p)
		}
	}
}

func (r *lifeRig) pool(t *testing.T, p *tenant.Principal, name string) *api.Pool {
	t.Helper()
	pl, err := r.svc.Pool(context.Background(), p, name)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// A pooled sandbox is made ahead and frozen, recorded as pooled (not
// listed); a create naming the pool takes it thawed, with its own env,
// metadata, trigger and TTL, recorded as created from the pool; the pool
// is made whole again with a new one.
func TestPoolsHitGivesTheCreateItsOwn(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	if _, err := r.svc.SetPool(ctx, p, "py", &api.SetPool{Size: 2, Limits: api.Limits{MemoryBytes: 256 << 20}}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	if pl := r.pool(t, p, "py"); pl.Ready != 2 || pl.Error != "" {
		t.Fatalf("pool: %+v", pl)
	}
	if got := r.svc.List(ctx, p); len(got) != 0 {
		t.Errorf("pooled sandboxes are listed: %v", got)
	}
	var pooled []string
	made := r.be.madeHosts()
	for id, h := range made {
		if !h.isPaused() {
			t.Errorf("pooled sandbox %s is not frozen", id)
		}
		if k := r.kinds(id); !slices.Equal(k, []string{"sandbox.pooled"}) {
			t.Errorf("records of pooled %s: %v", id, k)
		}
		if st := r.stored(t, id).State; st != statePooled {
			t.Errorf("pooled %s stored as %s", id, st)
		}
		pooled = append(pooled, id)
	}
	created := r.clock.Now()
	sb := r.create(t, p, &api.CreateSandbox{Pool: "py", Env: map[string]string{"TASK": "42"}, Metadata: map[string]string{"k": "v"}, Trigger: api.Trigger{TaskID: "t9"}, TTL: "10m"})
	if !slices.Contains(pooled, sb.ID) || sb.Pool != "py" || sb.PoolMiss != "" || sb.Metadata["k"] != "v" || !sb.Expires.Equal(created.Add(10*time.Minute)) || sb.State != api.StateRunning {
		t.Fatalf("create from the pool: %+v", sb)
	}
	if _, err := r.svc.Find(p, sb.ID); err != nil { // every call waits for its thaw
		t.Fatal(err)
	}
	if r.be.sandbox(t, sb.ID).isPaused() {
		t.Error("the taken sandbox is still frozen")
	}
	c := r.records(sb.ID, "sandbox.created")
	if len(c) != 1 || c[0]["pool"] != "py" {
		t.Fatalf("sandbox.created: %v", c)
	}
	if env := c[0]["spec"].(map[string]any)["env"]; len(env.([]any)) != 1 {
		t.Errorf("sandbox.created's env: %v", env)
	}
	r.svc.Mu.Lock()
	bsp := r.svc.Boxes[sb.ID].Spec
	r.svc.Mu.Unlock()
	if !slices.Equal(bsp.Env, []string{"TASK=42"}) || bsp.Pool != "py" {
		t.Errorf("the taken sandbox's spec: env %v, pool %q", bsp.Env, bsp.Pool)
	}
	if pl := r.pool(t, p, "py"); pl.Ready != 1 || pl.Hits != 1 {
		t.Errorf("after the take: %+v", pl)
	}
	r.fillPools()
	if pl := r.pool(t, p, "py"); pl.Ready != 2 {
		t.Errorf("after the refill: %+v", pl)
	}

	// A plain create of the pool's spec takes one too; one with a
	// workspace does not, and says why.
	sb2 := r.create(t, p, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 256 << 20}})
	if sb2.Pool != "py" {
		t.Errorf("a matching create was not given a pooled sandbox: %+v", sb2)
	}
	sb3, err := r.svc.Create(ctx, p, &api.CreateSandbox{Pool: "py", Limits: api.Limits{MemoryBytes: 256 << 20}, Hostname: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if sb3.Pool != "" || !strings.Contains(sb3.PoolMiss, "hostname") || slices.Contains(pooled, sb3.ID) {
		t.Errorf("a create the pool cannot serve: %+v", sb3)
	}
	if c := r.records(sb3.ID, "sandbox.created"); len(c) != 1 || !strings.Contains(c[0]["pool_miss"].(string), "hostname") {
		t.Errorf("its sandbox.created: %v", c)
	}
	if _, err := r.svc.Create(ctx, p, &api.CreateSandbox{Pool: "nope"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a create naming no pool of its tenant: %v", err)
	}
}

// A pool counts against its tenant's quotas: one that would exceed them
// is refused, and what it holds ready counts against later creates.
func TestPoolsCountAgainstQuotas(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{MaxSandboxes: 3})
	r.create(t, p, &api.CreateSandbox{})
	_, err := r.svc.SetPool(ctx, p, "big", &api.SetPool{Size: 3})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "may have 3 sandboxes") {
		t.Fatalf("a pool past the quota: %v", err)
	}
	if _, err := r.svc.SetPool(ctx, p, "ok", &api.SetPool{Size: 2, Limits: api.Limits{Pids: 100}}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	if _, err := r.svc.Create(ctx, p, &api.CreateSandbox{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a create past the quota that the pool holds: %v", err)
	}
}

// readyIDs are the ids of the pools' ready sandboxes.
func (r *lifeRig) readyIDs() []string {
	r.svc.Mu.Lock()
	defer r.svc.Mu.Unlock()
	var out []string
	for _, byName := range r.svc.pools.by {
		for _, pl := range byName {
			for _, b := range pl.idle {
				out = append(out, b.Rec.ID)
			}
		}
	}
	return out
}

// Removing a pool ends its ready sandboxes (and no other pool's); the
// kill switch ends the rest and removes the pools, so nothing refills.
func TestPoolsEndWithRemovalAndKillSwitch(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	for i, n := range []string{"a", "b"} {
		if _, err := r.svc.SetPool(ctx, p, n, &api.SetPool{Size: 2, Limits: api.Limits{Pids: 100 + int64(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	r.fillPools()
	before := r.readyIDs()
	if len(before) != 4 {
		t.Fatalf("ready: %v", before)
	}
	if err := r.svc.DeletePool(ctx, p, "a"); err != nil {
		t.Fatal(err)
	}
	if rest, err := r.db.Pools(ctx); err != nil || len(rest) != 1 || rest[0].Name != "b" {
		t.Errorf("recorded pools after removing a: %+v %v", rest, err)
	}
	// Setting and removing a pool are on the record, by the tenant.
	var said []string
	for _, rec := range r.audit.Records() {
		if strings.HasPrefix(rec.Kind, "pool.") && rec.Tenant == p.ID {
			said = append(said, rec.Kind+" "+string(rec.Data))
		}
	}
	if len(said) != 3 || !strings.HasPrefix(said[0], `pool.set {"name":"a","size":2,`) || !strings.HasPrefix(said[1], `pool.set {"name":"b"`) || said[2] != `pool.removed {"name":"a"}` {
		t.Errorf("pool records: %q", said)
	}
	left := r.readyIDs()
	if len(left) != 2 {
		t.Fatalf("after removing pool a: %v", left)
	}
	for _, id := range before {
		if !slices.Contains(left, id) {
			r.wantEnded(t, id, `pool "a" was removed`)
			if !r.be.sandbox(t, id).gone() {
				t.Errorf("%s of a removed pool is not destroyed", id)
			}
		}
	}
	if _, err := r.svc.killAll(p, p.ID, "kill switch (tenant acme)"); err != nil {
		t.Fatal(err)
	}
	for _, id := range left {
		r.wantEnded(t, id, "kill switch (tenant acme)")
	}
	if got := r.svc.Pools(ctx, p); len(got) != 0 {
		t.Errorf("pools after the kill switch: %+v", got)
	}
	if rest, err := r.db.Pools(ctx); err != nil || len(rest) != 0 {
		t.Errorf("recorded pools after the kill switch: %+v %v", rest, err)
	}
	if got := r.svc.needs(poolFills); len(got) != 0 {
		t.Errorf("the refiller would refill after the kill switch: %d", len(got))
	}
}

// A restarted daemon ends the pooled sandboxes it finds recorded and
// discards them on the host, and sets the recorded pools again, which it
// fills afresh; a pool whose tenant is gone is dropped.
func TestPoolsEndAtRestart(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	if _, err := r.svc.SetPool(ctx, p, "a", &api.SetPool{Size: 2, Limits: api.Limits{Pids: 99}}); err != nil {
		t.Fatal(err)
	}
	if err := r.db.PutPool(ctx, store.Pool{Tenant: "id_gone", Name: "g", Def: `{"size": 1}`}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	ids := r.readyIDs()
	r2 := newLifeRigOn(t, r.db, r.be, r.clock)
	r2.svc.Cfg.Principal = func(_ context.Context, id string) (*tenant.Principal, error) {
		if id != p.ID {
			return nil, errdefs.New(errdefs.ErrUnauthenticated, "no such tenant")
		}
		return p, nil
	}
	if err := r2.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if pl, err := r2.svc.Pool(ctx, p, "a"); err != nil || pl.Size != 2 || pl.Limits.Pids != 99 || pl.Ready != 0 {
		t.Fatalf("the pool after a restart: %+v %v", pl, err)
	}
	if rest, err := r.db.Pools(ctx); err != nil || len(rest) != 1 || rest[0].Name != "a" {
		t.Errorf("recorded pools after a restart: %+v %v", rest, err)
	}
	r2.fillPools()
	if again := r2.readyIDs(); len(again) != 2 || slices.ContainsFunc(again, func(id string) bool { return slices.Contains(ids, id) }) {
		t.Errorf("refilled after a restart: %v (before: %v)", again, ids)
	}
	for _, id := range ids {
		if st := r2.stored(t, id); st.State != api.StateEnded || !strings.Contains(st.EndReason, "not kept across a daemon restart") {
			t.Errorf("pooled %s after a restart: %s %q", id, st.State, st.EndReason)
		}
		if !slices.Contains(r.be.discards(), id) {
			t.Errorf("pooled %s was not discarded at the restart", id)
		}
	}
}

// A refill acts as the tenant is now: roots it no longer has stop the
// pool's refills (and say why) rather than being used.
func TestPoolsRefillAsTheTenantIsNow(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	p.Roots = []string{"/srv/a"}
	if _, err := r.svc.SetPool(ctx, p, "a", &api.SetPool{Size: 1}); err != nil {
		t.Fatal(err)
	}
	p.Roots = []string{"/srv/b"}
	r.fillPools()
	if pl := r.pool(t, p, "a"); pl.Ready != 0 || !strings.Contains(pl.Error, "changed since the pool was set") {
		t.Errorf("a pool whose tenant's roots changed: %+v", pl)
	}
	if n := r.be.count(); n != 0 {
		t.Errorf("the host made %d sandboxes for it", n)
	}
}

// A pool made smaller while its sandboxes are being made keeps no more
// than its new size: what is made past it is ended.
func TestPoolsShrinkWhileFilling(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	if _, err := r.svc.SetPool(ctx, p, "a", &api.SetPool{Size: 2}); err != nil {
		t.Fatal(err)
	}
	picked := r.svc.needs(poolFills)
	if len(picked) != 2 {
		t.Fatalf("picked %d", len(picked))
	}
	if _, err := r.svc.SetPool(ctx, p, "a", &api.SetPool{Size: 1}); err != nil {
		t.Fatal(err)
	}
	for _, pl := range picked {
		r.svc.fill(ctx, pl)
	}
	if pl := r.pool(t, p, "a"); pl.Ready != 1 || pl.Filling != 0 {
		t.Errorf("after the fills: %+v", pl)
	}
	ended := 0
	for _, id := range r.be.madeIDs() {
		if st := r.stored(t, id); st.State == api.StateEnded && strings.Contains(st.EndReason, "is full") {
			ended++
		}
	}
	if ended != 1 {
		t.Errorf("%d sandboxes ended past the new size, want 1", ended)
	}
}

// madeHosts are the sandboxes the host made, by id.
func (f *fakeBackend) madeHosts() map[string]*fakeHost {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.made)
}

// madeIDs are the ids of the sandboxes the host made.
func (f *fakeBackend) madeIDs() []string { return slices.Collect(maps.Keys(f.madeHosts())) }

// lateLog is an audit log in memory whose sandbox.created records are
// made durable late: once a call reaches the sandbox's agent (reached),
// or after a second when none does.
type lateLog struct {
	*memAudit
	reached chan struct{}
	mu      sync.Mutex
	durable map[string]bool // sandbox id → its sandbox.created is on disk
}

func (l *lateLog) Queue(r audit.Record) (func() error, error) {
	if _, err := l.memAudit.Queue(r); err != nil {
		return nil, err
	}
	return func() error {
		if r.Kind == "sandbox.created" {
			select {
			case <-l.reached:
			case <-time.After(time.Second):
			}
		}
		l.mu.Lock()
		l.durable[r.Sandbox] = true
		l.mu.Unlock()
		return nil
	}, nil
}

// A create given a pooled sandbox answers once its sandbox.created record
// has its place in the log; the first call on the sandbox reaches it only
// once that record is durable and it is thawed. (Were the call to go
// ahead, it would reach the agent before the record is durable: the log
// makes it durable only then.)
func TestPooledSandboxFirstCallFindsItsCreatedRecordDurable(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	late := &lateLog{memAudit: r.audit, reached: make(chan struct{}), durable: map[string]bool{}}
	r.svc.Cfg.Audit = record.New(late, nil)
	if _, err := r.svc.SetPool(ctx, p, "a", &api.SetPool{Size: 1}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	ids := r.readyIDs()
	if len(ids) != 1 {
		t.Fatalf("ready: %v", ids)
	}
	h := r.be.sandbox(t, ids[0])
	var once sync.Once
	durableAtCall := false
	h.mu.Lock()
	h.onRead = func() {
		once.Do(func() {
			late.mu.Lock()
			durableAtCall = late.durable[ids[0]]
			late.mu.Unlock()
			close(late.reached)
		})
	}
	h.mu.Unlock()
	sb := r.create(t, p, &api.CreateSandbox{Pool: "a"})
	if sb.ID != ids[0] {
		t.Fatalf("not given the pooled sandbox: %+v", sb)
	}
	var out bytes.Buffer
	if err := r.svc.ReadFile(ctx, p, sb.ID, "/etc/hostname", "", &out, 1<<20); err != nil {
		t.Fatalf("the first call (a thawed sandbox answers): %v", err)
	}
	if !durableAtCall {
		t.Error("the first call reached the sandbox before its sandbox.created record was durable")
	}
	if k := r.kinds(sb.ID); !slices.Equal(k, []string{"sandbox.pooled", "sandbox.created", "file.read"}) {
		t.Errorf("records: %v", k)
	}
	if st := r.stored(t, sb.ID).State; st != api.StateRunning {
		t.Errorf("stored as %s once settled", st)
	}
}

// A pooled sandbox is thawed after its create answered (settleGiven):
// one that cannot be is ended, the calls on it are refused, and its end
// says why; it no longer counts against the quota.
func TestPoolsFailedThawEndsTheGivenSandbox(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{MaxSandboxes: 1})
	if _, err := r.svc.SetPool(ctx, p, "a", &api.SetPool{Size: 1}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	ids := r.readyIDs()
	if len(ids) != 1 {
		t.Fatalf("ready: %v", ids)
	}
	h := r.be.sandbox(t, ids[0])
	h.mu.Lock()
	h.failResume = errors.New("the fake host cannot thaw it")
	h.mu.Unlock()
	r.svc.Mu.Lock()
	b := r.svc.pools.by[p.ID]["a"].idle[0]
	r.svc.Mu.Unlock()
	sb := r.create(t, p, &api.CreateSandbox{Pool: "a"})
	if sb.ID != ids[0] || sb.Pool != "a" {
		t.Fatalf("the create: %+v", sb)
	}
	if err := r.svc.Exec(ctx, p, sb.ID, &api.Exec{Cmd: []string{"true"}}, func(*api.ExecEvent) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an exec on a sandbox that could not be thawed: %v", err)
	}
	<-b.Ended
	r.wantEnded(t, ids[0], "its pool's sandbox could not be given to its create: thaw: the fake host cannot thaw it")
	if _, err := r.svc.Create(ctx, p, &api.CreateSandbox{Limits: api.Limits{Pids: 99}}); err != nil {
		t.Errorf("a create once it ended: %v", err)
	}
}

// A pool is its tenant's alone: another tenant neither sees nor removes
// it, names it in vain, and a create of its own that matches its spec is
// made afresh, never taken from it. A pool's name is a tenant's value:
// one that is not a short plain name is refused, and the refusal shows
// no terminal escape.
func TestPoolsAreTheirTenantsAndNamesAreChecked(t *testing.T) {
	ctx := context.Background()
	r, alice := poolRig(t, api.Quotas{})
	bob := r.tenant(t, "bob", api.Quotas{}, false)
	r.svc.Cfg.Principal = func(_ context.Context, id string) (*tenant.Principal, error) {
		if id == bob.ID {
			return bob, nil
		}
		return alice, nil
	}
	def := &api.SetPool{Size: 1, Limits: api.Limits{MemoryBytes: 256 << 20}}
	if _, err := r.svc.SetPool(ctx, alice, "warm", def); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	ready := r.readyIDs()
	if len(ready) != 1 {
		t.Fatalf("ready: %v", ready)
	}
	if _, err := r.svc.Pool(ctx, bob, "warm"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob sees alice's pool: %v", err)
	}
	if pls := r.svc.Pools(ctx, bob); len(pls) != 0 {
		t.Errorf("bob lists %+v", pls)
	}
	if err := r.svc.DeletePool(ctx, bob, "warm"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob removes alice's pool: %v", err)
	}
	if _, err := r.svc.Create(ctx, bob, &api.CreateSandbox{Pool: "warm"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob creates from alice's pool: %v", err)
	}
	sb := r.create(t, bob, &api.CreateSandbox{Limits: def.Limits})
	if sb.Pool != "" || slices.Contains(ready, sb.ID) || !slices.Equal(r.readyIDs(), ready) {
		t.Errorf("bob's matching create took alice's pooled sandbox: %+v; ready now %v", sb, r.readyIDs())
	}
	for _, name := range []string{"", "../warm", "a b", "Warm", "\x1b[2Jwarm", "-x", strings.Repeat("a", 64), "w\x00"} {
		_, err := r.svc.SetPool(ctx, alice, name, def)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || strings.Contains(err.Error(), "\x1b") {
			t.Errorf("pool name %q: %v", name, err)
		}
	}
}

// A kill switch whose pools' records cannot be removed says so (a
// restart would set those pools again), once it has ended everything.
func TestKillSwitchFailsWhenPoolsStayRecorded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	r := newLifeRigOn(t, db, newFakeBackend(t), newFakeClock())
	p := r.tenant(t, "acme", api.Quotas{}, false)
	r.svc.Cfg.Principal = func(context.Context, string) (*tenant.Principal, error) { return p, nil }
	if _, err := r.svc.SetPool(ctx, p, "warm", &api.SetPool{Size: 1}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	if len(r.readyIDs()) != 1 {
		t.Fatalf("ready: %v", r.readyIDs())
	}
	// The pools' table out of reach of the store, and back before the
	// rig's own kill switch at the end.
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = raw.Exec("ALTER TABLE pools_away RENAME TO pools"); raw.Close() })
	if _, err := raw.Exec("ALTER TABLE pools RENAME TO pools_away"); err != nil {
		t.Fatal(err)
	}
	ids, err := r.svc.KillAll(ctx, p, "")
	if err == nil || !strings.Contains(err.Error(), "pools' records were not removed") {
		t.Errorf("kill switch with the pools' records left: %v", err)
	}
	if len(ids) != 1 || len(r.readyIDs()) != 0 {
		t.Errorf("the kill switch did not end the pooled sandbox: %v, ready %v", ids, r.readyIDs())
	}
}

// The refill slots go to the tenants in turn: one with three pools
// takes no more of them than one with a single pool while both lack
// sandboxes; of a tenant's pools, the one holding the fewest goes first.
func TestPoolRefillsTakeTenantsInTurn(t *testing.T) {
	ctx := context.Background()
	r, alice := poolRig(t, api.Quotas{})
	bob := r.tenant(t, "bob", api.Quotas{}, false)
	r.svc.Cfg.Principal = func(_ context.Context, id string) (*tenant.Principal, error) {
		if id == bob.ID {
			return bob, nil
		}
		return alice, nil
	}
	for i, name := range []string{"a1", "a2", "a3"} {
		if _, err := r.svc.SetPool(ctx, alice, name, &api.SetPool{Size: 2, Limits: api.Limits{Pids: 100 + int64(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.svc.SetPool(ctx, bob, "b", &api.SetPool{Size: 3}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.svc.needs(6) {
		got = append(got, p.tenant+"/"+p.name)
	}
	a, b := alice.ID+"/", bob.ID+"/"
	want := []string{a + "a1", b + "b", a + "a2", b + "b", a + "a3", b + "b"}
	if alice.ID > bob.ID {
		want = []string{b + "b", a + "a1", b + "b", a + "a2", b + "b", a + "a3"}
	}
	if !slices.Equal(got, want) {
		t.Errorf("refills picked %v, want %v", got, want)
	}
	// With bob's pool full (three being made), the rest are alice's.
	var rest []string
	for _, p := range r.svc.needs(6) {
		rest = append(rest, p.name)
	}
	if !slices.Equal(rest, []string{"a1", "a2", "a3"}) {
		t.Errorf("then: %v", rest)
	}
}

// A recorded pool that a restarted daemon cannot set again for a reason
// that may pass (its tenant's lookup failing) stays recorded, is shown
// with why, and is set again on a later try, after its backoff; one its
// tenant removes meanwhile is gone for good.
func TestPoolsRestoreRetriesATransientFailure(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	for _, n := range []string{"a", "b"} {
		if _, err := r.svc.SetPool(ctx, p, n, &api.SetPool{Size: 1, Limits: api.Limits{Pids: 99}}); err != nil {
			t.Fatal(err)
		}
	}
	r2 := newLifeRigOn(t, r.db, r.be, r.clock)
	down := true
	r2.svc.Cfg.Principal = func(_ context.Context, id string) (*tenant.Principal, error) {
		if down {
			return nil, errors.New("database is locked")
		}
		return p, nil
	}
	if err := r2.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if rest, err := r.db.Pools(ctx); err != nil || len(rest) != 2 {
		t.Fatalf("recorded pools after a start that could not set them: %+v %v", rest, err)
	}
	if pl := r2.pool(t, p, "a"); pl.Size != 1 || pl.Limits.Pids != 99 || !strings.Contains(pl.Error, "database is locked") {
		t.Errorf("a pool not restored yet: %+v", pl)
	}
	if err := r2.svc.DeletePool(ctx, p, "b"); err != nil {
		t.Fatal(err)
	}
	down = false
	if err := r2.svc.retryRestores(ctx); err != nil {
		t.Fatal(err)
	}
	if pl := r2.pool(t, p, "a"); pl.Error == "" {
		t.Errorf("retried before its backoff: %+v", pl)
	}
	r2.clock.Advance(time.Minute)
	if err := r2.svc.retryRestores(ctx); err != nil {
		t.Fatal(err)
	}
	if pl := r2.pool(t, p, "a"); pl.Error != "" || pl.Size != 1 {
		t.Errorf("after the retry: %+v", pl)
	}
	if got := r2.svc.Pools(ctx, p); len(got) != 1 || got[0].Name != "a" {
		t.Errorf("pools after the retry: %+v", got)
	}
	if rest, err := r.db.Pools(ctx); err != nil || len(rest) != 1 || rest[0].Name != "a" {
		t.Errorf("recorded pools: %+v %v", rest, err)
	}
	r2.fillPools()
	if pl := r2.pool(t, p, "a"); pl.Ready != 1 {
		t.Errorf("the restored pool is not filled: %+v", pl)
	}
}

// A tenant's usage counts what its max_sandboxes quota counts: live
// sandboxes and its pools' ready ones (shown apart as pooled); a create
// is refused exactly when the usage is at the quota.
func TestTenantUsageCountsPooledSandboxesAsTheQuotaDoes(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{MaxSandboxes: 3})
	r.create(t, p, &api.CreateSandbox{})
	if _, err := r.svc.SetPool(ctx, p, "a", &api.SetPool{Size: 2, Limits: api.Limits{Pids: 99}}); err != nil {
		t.Fatal(err)
	}
	r.fillPools()
	if u := r.svc.TenantUsage(p.ID); u.Sandboxes != 3 || u.Pooled != 2 {
		t.Errorf("usage with a full pool: %+v", u)
	}
	if _, err := r.svc.Create(ctx, p, &api.CreateSandbox{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a create at the usage the quota allows: %v", err)
	}
	sb := r.create(t, p, &api.CreateSandbox{Pool: "a"})
	if sb.Pool != "a" {
		t.Fatalf("not taken from the pool: %+v", sb)
	}
	if u := r.svc.TenantUsage(p.ID); u.Sandboxes != 3 || u.Pooled != 1 {
		t.Errorf("usage after a take: %+v", u)
	}
}

// The pools' metrics say what they are to hold, hold ready, and how
// creates fared (hits, misses) and how long a refill took.
func TestPoolMetrics(t *testing.T) {
	ctx := context.Background()
	r, p := poolRig(t, api.Quotas{})
	m := r.svc.Cfg.Metrics
	for i, n := range []string{"a", "b"} {
		if _, err := r.svc.SetPool(ctx, p, n, &api.SetPool{Size: 2 + i, Limits: api.Limits{Pids: 100 + int64(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	r.fillPools()
	r.create(t, p, &api.CreateSandbox{Pool: "a"})
	r.create(t, p, &api.CreateSandbox{Pool: "a"})
	r.create(t, p, &api.CreateSandbox{Pool: "a"}) // none ready: a miss, made afresh
	if err := r.svc.DeletePool(ctx, p, "b"); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for name, c := range map[string]prometheus.Collector{"size": m.PoolSize, "ready": m.PoolReady, "hits": m.PoolHits, "misses": m.PoolMisses, "fills": m.PoolFillSecs} {
		ch := make(chan prometheus.Metric, 1)
		c.Collect(ch)
		var pb dto.Metric
		if err := (<-ch).Write(&pb); err != nil {
			t.Fatal(err)
		}
		switch {
		case pb.Gauge != nil:
			got[name] = pb.Gauge.GetValue()
		case pb.Counter != nil:
			got[name] = pb.Counter.GetValue()
		default:
			got[name] = float64(pb.Histogram.GetSampleCount())
		}
	}
	want := map[string]float64{"size": 2, "ready": 0, "hits": 2, "misses": 1, "fills": 5}
	if !maps.Equal(got, want) {
		t.Errorf("pool metrics %v, want %v", got, want)
	}
}
