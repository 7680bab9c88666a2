package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

// postCreate sends POST /v1/sandboxes with key and answers its status and
// sandbox (the client hides the status: 201 made, 200 found).
func (d *daemonProc) postCreate(t *testing.T, key string, req *api.CreateSandbox) (int, *api.Sandbox) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.sock)
	}}}
	body, _ := json.Marshal(req)
	r, _ := http.NewRequest("POST", "http://airlock/v1/sandboxes", bytes.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+key)
	r.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(r)
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	defer res.Body.Close()
	var sb api.Sandbox
	if err := json.NewDecoder(res.Body).Decode(&sb); err != nil {
		t.Errorf("create answered %d, not a sandbox: %v", res.StatusCode, err)
	}
	return res.StatusCode, &sb
}

// clusterKey is a tenant key as a cluster's controller makes one
// (airlock_ and 64 hex digits) and its SHA-256, as POST /v1/tenants takes it.
func clusterKey() (key, digest string) {
	var b [32]byte
	_, _ = rand.Read(b[:])
	key = "airlock_" + hex.EncodeToString(b[:])
	h := sha256.Sum256([]byte(key))
	return key, hex.EncodeToString(h[:])
}

// A create naming an external id makes one sandbox (201); a repeat, and
// creates of one id at once, answer it (200) and make nothing; the id is
// on the sandbox, its sandbox.created record and the listing by external
// id; the admin lists every tenant's sandboxes with their ids, a tenant
// may not. The daemon killed and started again adopts the sandbox and
// still knows its id; once it has ended, a repeat answers it ended.
func TestExternalIDIsIdempotent(t *testing.T) {
	ctx := context.Background()
	data := newDataDir(t)
	d := startDaemon(t, data)
	key, digest := clusterKey()
	if _, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "ns-ext", KeySHA256: digest}); err != nil {
		t.Fatal(err)
	}
	c := d.client(t, key)
	req := &api.CreateSandbox{ExternalID: "5f0c2c1e-uid", Metadata: map[string]string{"k8s.namespace": "ns-ext", "k8s.name": "a"}}
	st, sb := d.postCreate(t, key, req)
	if st != http.StatusCreated || sb.ExternalID != req.ExternalID {
		t.Fatalf("first create: %d %+v", st, sb)
	}
	st, again := d.postCreate(t, key, req)
	if st != http.StatusOK || again.ID != sb.ID {
		t.Errorf("repeat: %d %s, want 200 %s", st, again.ID, sb.ID)
	}
	recs, err := c.Audit(ctx, sb.ID, "sandbox.created")
	if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Data), `"external_id":"5f0c2c1e-uid"`) {
		t.Errorf("sandbox.created: %+v %v", recs, err)
	}

	// At once: one made, every create answers it.
	const n = 8
	var mu sync.Mutex
	statuses, ids := map[int]int{}, map[string]bool{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			st, sb := d.postCreate(t, key, &api.CreateSandbox{ExternalID: "burst"})
			mu.Lock()
			defer mu.Unlock()
			statuses[st]++
			ids[sb.ID] = true
		})
	}
	wg.Wait()
	if statuses[http.StatusCreated] != 1 || statuses[http.StatusOK] != n-1 || len(ids) != 1 {
		t.Errorf("%d creates of one id at once: statuses %v, sandboxes %v", n, statuses, ids)
	}
	if l, err := c.ListSandboxes(ctx, api.ListSandboxes{ExternalID: "burst"}); err != nil || len(l) != 1 {
		t.Errorf("list of id burst: %+v %v", l, err)
	}
	if l, err := c.ListSandboxes(ctx, api.ListSandboxes{}); err != nil || len(l) != 2 {
		t.Errorf("the tenant's sandboxes: %d %v, want 2", len(l), err)
	}
	if _, err := c.ListSandboxes(ctx, api.ListSandboxes{All: true}); code(err) != api.CodePermissionDenied {
		t.Errorf("a tenant listing all: %v", err)
	}
	all, err := d.admin.ListSandboxes(ctx, api.ListSandboxes{All: true})
	found := false
	for _, s := range all {
		if s.ID == sb.ID {
			found = s.Tenant == "ns-ext" && s.TenantID != "" && s.ExternalID == req.ExternalID && s.Metadata["k8s.name"] == "a"
		}
	}
	if err != nil || !found {
		t.Errorf("admin, all: %+v %v", all, err)
	}

	// A daemon killed and started again adopts it, its id known.
	d.kill9()
	d2 := startDaemon(t, data)
	c = d2.client(t, key)
	st, adopted := d2.postCreate(t, key, req)
	if st != http.StatusOK || adopted.ID != sb.ID || adopted.State != api.StateRunning {
		t.Fatalf("repeat after a restart: %d %+v", st, adopted)
	}
	if out, _, end := run(t, c, sb.ID, sh("echo adopted")); out != "adopted\n" || end.ExitCode != 0 {
		t.Errorf("exec in the adopted sandbox: %q %+v", out, end)
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	st, ended := d2.postCreate(t, key, req)
	if st != http.StatusOK || ended.ID != sb.ID || ended.State != api.StateEnded {
		t.Errorf("repeat after its end: %d %+v", st, ended)
	}
	if l, err := c.ListSandboxes(ctx, api.ListSandboxes{ExternalID: req.ExternalID}); err != nil || len(l) != 1 || l[0].State != api.StateEnded {
		t.Errorf("list of its id after its end: %+v %v", l, err)
	}
	if _, err := c.CreateSandbox(ctx, &api.CreateSandbox{ExternalID: "has space"}); code(err) != api.CodeInvalidArgument {
		t.Errorf("a malformed external id: %v", err)
	}
}

// A tenant made with a key of the controller's shape that the admin holds
// (given by its SHA-256) signs in with it, its creation showing no key; the
// key replaced by PATCH stops working at once and the new one works. A
// pool_only create binds a ready pooled sandbox, its env and metadata
// applied, and with none ready fails failed_precondition, making nothing.
func TestTenantWithCallerKey(t *testing.T) {
	ctx := context.Background()
	d := startDaemon(t, newDataDir(t))
	k1, d1 := clusterKey()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "ns-key", KeySHA256: d1, Quotas: api.Quotas{MaxSandboxes: 1}})
	if err != nil || tn.Key != "" {
		t.Fatalf("create: %+v %v", tn, err)
	}
	if _, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "ns-bad", KeySHA256: strings.ToUpper(d1)}); code(err) != api.CodeInvalidArgument {
		t.Errorf("an upper-case digest: %v", err)
	}
	c := d.client(t, k1)
	// A pool of one fills the quota: once its sandbox is taken, no
	// refill is admitted, and the pool stays empty.
	if _, err := c.SetPool(ctx, "warm", &api.SetPool{Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, "warm", 1)
	bind := &api.CreateSandbox{Pool: "warm", PoolOnly: true, ExternalID: "claim-uid", Env: map[string]string{"CLAIM": "c1"}, Metadata: map[string]string{"k8s.claim": "c1"}}
	sb, err := c.CreateSandbox(ctx, bind)
	if err != nil || sb.Pool != "warm" || sb.ExternalID != "claim-uid" || sb.Metadata["k8s.claim"] != "c1" {
		t.Fatalf("pool_only with one ready: %+v %v", sb, err)
	}
	if out, _, _ := run(t, c, sb.ID, sh(`echo "$CLAIM"`)); out != "c1\n" {
		t.Errorf("the bound sandbox's env: %q", out)
	}
	if _, err := c.CreateSandbox(ctx, &api.CreateSandbox{Pool: "warm", PoolOnly: true, ExternalID: "claim-2"}); code(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "pool warm had no sandbox ready") {
		t.Errorf("pool_only with none ready: %v", err)
	}
	if l, _ := c.ListSandboxes(ctx, api.ListSandboxes{}); len(l) != 1 {
		t.Errorf("after the refused bind: %d sandboxes, want 1", len(l))
	}

	k2, d2 := clusterKey()
	if _, err := d.admin.UpdateTenant(ctx, "ns-key", &api.UpdateTenant{KeySHA256: d2}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListSandboxes(ctx, api.ListSandboxes{}); code(err) != api.CodeUnauthenticated {
		t.Errorf("the replaced key: %v", err)
	}
	c2 := d.client(t, k2)
	if got, err := c2.Sandbox(ctx, sb.ID); err != nil || got.ID != sb.ID {
		t.Errorf("the new key: %+v %v", got, err)
	}
	if err := c2.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c2.DeletePool(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
}
