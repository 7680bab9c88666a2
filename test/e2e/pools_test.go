package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// waitPool polls pool name until ready sandboxes are ready, and returns
// it (the refiller's progress is only seen through GET).
func waitPool(t *testing.T, c *client.Client, name string, ready int) *api.Pool {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := c.Pool(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Ready == ready && p.Filling == 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never had %d ready: %+v", name, ready, p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pooledIDs are the sandboxes the daemon made ahead for tenant c's pools
// (their sandbox.pooled records), oldest first.
func pooledIDs(t *testing.T, c *client.Client) []string {
	t.Helper()
	recs, err := c.Audit(context.Background(), "", "sandbox.pooled")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, r.Sandbox)
	}
	return out
}

// frozen says whether sandbox id on w is paused: its cgroup frozen (v1
// freezer or v2) on the container wall, runsc's state on gvisor.
func (w wallCase) frozen(t *testing.T, id string) bool {
	if w.name == "gvisor" {
		return runscStatus(t, id) == "paused"
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", scope, id, "freezer.state")); err == nil {
		return strings.TrimSpace(string(b)) == "FROZEN"
	}
	b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", scope, id, "cgroup.events"))
	return strings.Contains(string(b), "frozen 1")
}

// metricsOf is the daemon's /metrics, read with the admin key.
func (d *daemonProc) metricsOf(t *testing.T) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.sock)
	}}}
	req, _ := http.NewRequest("GET", "http://airlock/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+d.adminKey(t))
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// A pool of 3 fills and stays frozen; a create naming it is given one at
// once, with its own env, metadata and TTL, recorded as from the pool,
// and the pool is made whole again; a plain create of the pool's spec
// takes one too; a create with a workspace is made afresh and says why;
// a pool past the tenant's quota is refused; removing a pool destroys its
// ready sandboxes; the metrics count it all.
func TestPoolsServe(t *testing.T) { forEachWall(t, poolsServe) }

func poolsServe(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "pools", api.Quotas{MaxSandboxes: 8})
	def := &api.SetPool{Size: 3, Limits: api.Limits{MemoryBytes: 256 << 20}}
	if _, err := c.SetPool(ctx, "warm", def); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, "warm", 3)
	ready := pooledIDs(t, c)
	if len(ready) != 3 {
		t.Fatalf("sandbox.pooled records: %v", ready)
	}
	for _, id := range ready {
		if !w.frozen(t, id) {
			t.Errorf("pooled sandbox %s is not frozen", id)
		}
	}
	if l, err := c.Sandboxes(ctx); err != nil || len(l) != 0 {
		t.Errorf("pooled sandboxes are listed: %+v %v", l, err)
	}

	// A hit.
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Pool: "warm", Env: map[string]string{"TASK": "42"}, Metadata: map[string]string{"k": "v"}, TTL: "10m"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ready, sb.ID) || sb.Pool != "warm" || sb.PoolMiss != "" || sb.Metadata["k"] != "v" || sb.Limits.MemoryBytes != 256<<20 {
		t.Fatalf("a create from the pool: %+v", sb)
	}
	if out, _, end := run(t, c, sb.ID, sh(`echo "$TASK"`)); end.ExitCode != 0 || out != "42\n" {
		t.Errorf("the taken sandbox's command: %q %+v", out, end)
	}
	if w.frozen(t, sb.ID) {
		t.Error("the taken sandbox is still frozen")
	}
	recs, err := c.Audit(ctx, sb.ID, "sandbox.created")
	if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Data), `"pool":"warm"`) {
		t.Errorf("the taken sandbox's sandbox.created: %+v %v", recs, err)
	}
	if l, err := c.Sandboxes(ctx); err != nil || len(l) != 1 || l[0].ID != sb.ID {
		t.Errorf("the taken sandbox is not listed as the caller's: %+v %v", l, err)
	}
	p := waitPool(t, c, "warm", 3)
	if p.Hits != 1 {
		t.Errorf("after a hit: %+v", p)
	}

	// Transparent: a plain create of the pool's spec.
	plain, err := c.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Pool != "warm" {
		t.Errorf("a create matching the pool was not given one: %+v", plain)
	}

	// A workspace cannot be given to a made sandbox: made afresh.
	ws := workspace(t)
	miss, err := c.CreateSandbox(ctx, &api.CreateSandbox{Pool: "warm", Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	if miss.Pool != "" || !strings.Contains(miss.PoolMiss, "workspace") || slices.Contains(pooledIDs(t, c), miss.ID) {
		t.Errorf("a create with a workspace: %+v", miss)
	}
	if _, _, end := run(t, c, miss.ID, sh("test -x /workspace/attack")); end.ExitCode != 0 {
		t.Errorf("the fresh sandbox's workspace: %+v", end)
	}
	if recs, err := c.Audit(ctx, miss.ID, "sandbox.created"); err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Data), `"pool_miss":"pool warm: a workspace`) {
		t.Errorf("the fresh sandbox's sandbox.created: %+v %v", recs, err)
	}

	// Quotas: 3 live + 3 pooled of 8; a pool of 3 more is refused.
	_, err = c.SetPool(ctx, "more", &api.SetPool{Size: 3})
	wantCode(t, "a pool past the quota", err, api.CodeQuotaExceeded)
	if err == nil || !strings.Contains(err.Error(), "may have 8 sandboxes") {
		t.Errorf("the refusal: %v", err)
	}

	// The takes' refills may still be under way: the metrics are read
	// once the pool is full again.
	waitPool(t, c, "warm", 3)
	m := d.metricsOf(t)
	for _, want := range []string{"airlock_pool_hits_total 2", "airlock_pool_misses_total 1", "airlock_pool_ready_sandboxes 3", "airlock_pool_refill_seconds_count"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// Removing the pool destroys its ready sandboxes, not the taken ones.
	var idle []string
	for _, id := range pooledIDs(t, c) {
		if id != sb.ID && id != plain.ID {
			if got, err := c.Sandbox(ctx, id); err != nil || got.State != api.StateEnded {
				idle = append(idle, id)
			}
		}
	}
	if len(idle) != 3 {
		t.Fatalf("ready before the removal: %v", idle)
	}
	if err := c.DeletePool(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	for _, id := range idle {
		got, err := c.Sandbox(ctx, id)
		if err != nil || got.State != api.StateEnded || got.EndReason != `pool "warm" was removed` {
			t.Errorf("pooled %s after its pool's removal: %+v %v", id, got, err)
		}
		if procs := w.cgroupProcs(id); len(procs) != 0 {
			t.Errorf("pooled %s runs on: %v", id, procs)
		}
	}
	if _, err := c.Pool(ctx, "warm"); code(err) != api.CodeNotFound {
		t.Errorf("a removed pool: %v", err)
	}
	if out, _, _ := run(t, c, sb.ID, sh("echo alive")); out != "alive\n" {
		t.Errorf("a taken sandbox after its pool's removal: %q", out)
	}

	// A proxy-mode pool of an OCI image: the taken sandbox's egress goes
	// through its proxy, which refuses a host off the allow-list (nothing
	// leaves the machine); a create with another allow-list is made
	// afresh.
	img := ociLayout(t)
	netDef := &api.SetPool{Size: 1, Image: img, Network: api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}}
	if _, err := c.SetPool(ctx, "net", netDef); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, "net", 1)
	nb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Image: img, Network: api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	if nb.Pool != "net" {
		t.Errorf("a proxy-mode create matching the pool: %+v", nb)
	}
	fetch := &api.Exec{Cmd: []string{"attack", "fetch", "http://denied.test/", "-", "proxy"}}
	if out, _, _ := run(t, c, nb.ID, fetch); !strings.HasPrefix(out, "STATUS 403") {
		t.Errorf("egress of a taken proxy-mode sandbox: %q", out)
	}
	other, err := c.CreateSandbox(ctx, &api.CreateSandbox{Pool: "net", Network: api.Network{Mode: "proxy", Allow: []string{"other.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	if other.Pool != "" || !strings.Contains(other.PoolMiss, "egress policy") {
		t.Errorf("a create with another allow-list: %+v", other)
	}
	if _, err := d.admin.KillAll(ctx, ""); err != nil {
		t.Fatal(err)
	}
	noResidue(t)
}

// A restarted daemon leaves no pooled sandbox behind: those the last
// daemon made ahead (frozen) are destroyed at its start and recorded as
// ended, and the pools, read back from its database, are made afresh;
// the sandboxes its tenants took are adopted as any other. The kill
// switch and the tenant's deletion end a pool's sandboxes and remove it.
// The CLI sets, lists and removes pools.
func TestPoolsRestartAndKillSwitch(t *testing.T) { forEachWall(t, poolsRestartAndKillSwitch) }

func poolsRestartAndKillSwitch(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "restart", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) result {
		t.Helper()
		cmd := exec.Command(airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", data}, args...)...)
		cmd.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock, "AIRLOCK_API_KEY="+tn.Key)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		r := result{stdout: out.String(), stderr: errb.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		}
		return r
	}
	if r := cli("pool", "set", "py", "--size", "2", "--memory", "128M", "--pids", "64"); r.code != 0 || !strings.Contains(r.stdout, "pool py: 2 sandboxes") {
		t.Fatalf("pool set: %s", r)
	}
	c := d.client(t, tn.Key)
	waitPool(t, c, "py", 2)
	r := cli("pool", "ls", "--json")
	var ls []api.Pool
	if err := json.Unmarshal([]byte(r.stdout), &ls); r.code != 0 || err != nil || len(ls) != 1 || ls[0].Name != "py" || ls[0].Limits.MemoryBytes != 128<<20 || ls[0].Limits.Pids != 64 {
		t.Fatalf("pool ls --json: %s (%v)", r, err)
	}
	r = cli("create", "--pool", "py", "-e", "A=b")
	if r.code != 0 {
		t.Fatalf("create --pool: %s", r)
	}
	taken := strings.TrimSpace(r.stdout)
	waitPool(t, c, "py", 2)
	var idle []string
	for _, id := range pooledIDs(t, c) {
		if id != taken {
			idle = append(idle, id)
		}
	}
	if len(idle) != 2 {
		t.Fatalf("ready: %v (taken %s)", idle, taken)
	}

	d.kill9()
	d = w.startDaemon(t, data)
	c = d.client(t, tn.Key)
	for _, id := range idle {
		got, err := c.Sandbox(ctx, id)
		if err != nil || got.State != api.StateEnded || !strings.Contains(got.EndReason, "not kept across a daemon restart") {
			t.Errorf("pooled %s after a restart: %+v %v", id, got, err)
		}
		if procs := w.cgroupProcs(id); len(procs) != 0 {
			t.Errorf("pooled %s runs on after a restart: %v", id, procs)
		}
	}
	if out, _, end := run(t, c, taken, sh(`echo "$A"`)); end.ExitCode != 0 || out != "b\n" {
		t.Errorf("the taken sandbox after a restart: %q %+v", out, end)
	}
	// The pool is set again, as recorded, and made afresh.
	if p := waitPool(t, c, "py", 2); p.Limits.MemoryBytes != 128<<20 || p.Limits.Pids != 64 {
		t.Errorf("the pool after a restart: %+v", p)
	}
	fresh := pooledIDs(t, c)
	for _, id := range fresh[len(fresh)-2:] {
		if slices.Contains(idle, id) || id == taken {
			t.Errorf("a pooled sandbox of the last daemon in the pool after a restart: %s", id)
		}
	}

	// The kill switch: the pool's sandboxes end and the pool goes.
	if _, err := c.SetPool(ctx, "k", &api.SetPool{Size: 1, Limits: api.Limits{Pids: 65}}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, "k", 1)
	if _, err := d.admin.KillAll(ctx, "restart"); err != nil {
		t.Fatal(err)
	}
	if ps, err := c.Pools(ctx); err != nil || len(ps) != 0 {
		t.Errorf("pools after the kill switch: %+v %v", ps, err)
	}
	if r := cli("pool", "rm", "k"); r.code == 0 {
		t.Errorf("pool rm of a pool the kill switch removed: %s", r)
	}

	// The tenant's deletion ends its pooled sandboxes too.
	if _, err := c.SetPool(ctx, "d", &api.SetPool{Size: 2, Limits: api.Limits{Pids: 66}}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, "d", 2)
	last := pooledIDs(t, c)
	last = last[len(last)-2:]
	if err := d.admin.DeleteTenant(ctx, "restart"); err != nil {
		t.Fatal(err)
	}
	for _, id := range last {
		if procs := w.cgroupProcs(id); len(procs) != 0 {
			t.Errorf("pooled %s runs on after its tenant's deletion: %v", id, procs)
		}
	}
	noResidue(t)
}

// A create given a pooled sandbox answers once its sandbox.created record
// has its place in the log, before the record is on disk. The first exec
// right after that answer runs only once the record is durable: it is in
// the log before the exec's. A daemon killed right after such an answer
// leaves, after its restart, the sandbox either live with its
// sandbox.created record in the log, or ended (stored as pooled, as not
// yet the caller's): never live without its record; the log verifies
// either way.
func TestPooledCreateIsRecordedBeforeItIsUsed(t *testing.T) {
	forEachWall(t, pooledCreateIsRecordedBeforeItIsUsed)
}

func pooledCreateIsRecordedBeforeItIsUsed(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "durable", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	c := d.client(t, tn.Key)
	if _, err := c.SetPool(ctx, "p", &api.SetPool{Size: 2, Limits: api.Limits{MemoryBytes: 128 << 20}}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, "p", 2)
	a, err := c.CreateSandbox(ctx, &api.CreateSandbox{Pool: "p"})
	if err != nil || a.Pool != "p" {
		t.Fatalf("a create from the pool: %+v %v", a, err)
	}
	if _, _, end := run(t, c, a.ID, sh("true")); end.ExitCode != 0 {
		t.Fatalf("the first exec: %+v", end)
	}
	recs, err := c.Audit(ctx, a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	if i, j := slices.Index(kinds, "sandbox.created"), slices.Index(kinds, "exec.start"); i < 0 || j < 0 || i > j {
		t.Errorf("records of a pooled sandbox and its first exec: %v", kinds)
	}

	b, err := c.CreateSandbox(ctx, &api.CreateSandbox{Pool: "p"})
	if err != nil || b.Pool != "p" {
		t.Fatalf("a create from the pool: %+v %v", b, err)
	}
	d.kill9()
	d = w.startDaemon(t, data)
	c = d.client(t, tn.Key)
	got, err := c.Sandbox(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	created, err := c.Audit(ctx, b.ID, "sandbox.created")
	if err != nil {
		t.Fatal(err)
	}
	switch got.State {
	case api.StateRunning:
		if len(created) != 1 {
			t.Errorf("%s is live after the restart without its sandbox.created record: %v", b.ID, created)
		}
		if _, _, end := run(t, c, b.ID, sh("true")); end.ExitCode != 0 {
			t.Errorf("an exec on the adopted sandbox: %+v", end)
		}
	case api.StateEnded:
		if procs := w.cgroupProcs(b.ID); len(procs) != 0 {
			t.Errorf("%s ended at the restart but runs on: %v", b.ID, procs)
		}
	default:
		t.Errorf("%s after the restart: %+v", b.ID, got)
	}
	t.Logf("given sandbox after a crash right after its create: %s (%s)", got.State, got.EndReason)
	if _, err := d.admin.KillAll(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if r := auditCLI(t, data, "verify"); r.code != 0 || !strings.HasPrefix(r.stdout, "ok:") {
		t.Errorf("verify: %s", r)
	}
	noResidue(t)
}
