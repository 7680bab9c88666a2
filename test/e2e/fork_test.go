package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/test/fakenet"
)

// forkTenant is a tenant with quotas q, its client and key.
func forkTenant(t *testing.T, d *daemonProc, name string, q api.Quotas) (*client.Client, string) {
	t.Helper()
	tn, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: name, Quotas: q, Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	return d.client(t, tn.Key), tn.Key
}

// snapshotDirs lists what is in the daemon's snapshot directory.
func snapshotDirs(t *testing.T, d *daemonProc) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.data, "snapshots"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// counterPID is the pid of the process tagged counter in sandbox id.
func counterPID(t *testing.T, c *client.Client, id string) uint32 {
	t.Helper()
	ps, err := c.Processes(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Tag == "counter" {
			return p.PID
		}
	}
	t.Fatalf("no counter in %s: %+v", id, ps)
	return 0
}

// `airlock fork --count 2` of a gVisor sandbox: two new sandboxes, each
// continuing from the source's memory (its counter goes on from where it
// was, not from 0) and files, apart from each other and from the source,
// which runs on; the checkpoint is gone once they are restored, nothing is
// listed as a snapshot, and the fork's files go with the last copy. A fork
// past the tenant's max_sandboxes is refused and makes nothing. One
// sandbox.forked record names the copies.
func TestGVisorFork(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice, key := forkTenant(t, d, "alice", api.Quotas{MaxSandboxes: 3})
	src, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", TTL: "10m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, src.ID) }()
	before := startCounting(t, alice, src.ID)

	// Past max_sandboxes (1 + 3 > 3): refused, nothing made or saved.
	_, err = alice.Fork(ctx, src.ID, 3)
	wantCode(t, "a fork past max_sandboxes", err, api.CodeQuotaExceeded)
	if sbs, err := alice.Sandboxes(ctx); err != nil || len(sbs) != 1 {
		t.Errorf("sandboxes after the refused fork: %+v %v", sbs, err)
	}
	if dirs := snapshotDirs(t, d); len(dirs) != 0 {
		t.Errorf("the refused fork left %v", dirs)
	}

	r := cliAs(t, d, key, nil, nil, "fork", src.ID, "--count", "2")
	if r.code != 0 || !strings.Contains(r.stderr, "with its memory") {
		t.Fatalf("airlock fork: %s", r)
	}
	ids := strings.Fields(r.stdout)
	for _, id := range ids {
		defer func() { _ = alice.Destroy(ctx, id) }()
	}
	if len(ids) != 2 || ids[0] == ids[1] || slices.Contains(ids, src.ID) {
		t.Fatalf("fork printed %q", r.stdout)
	}
	afterSrc := countPast(t, alice, src.ID, before) // the source runs on
	for _, id := range ids {
		got, err := alice.Sandbox(ctx, id)
		if err != nil || got.Isolation != "gvisor" {
			t.Errorf("copy %s: %+v %v", id, got, err)
		}
		n := count(t, alice, id)
		if n < before {
			t.Errorf("copy %s's counter is at %d, below the %d it had before the fork", id, n, before)
		}
		countPast(t, alice, id, n)
		if out, _, _ := run(t, alice, id, sh("cat /workspace/w.txt /tmp/t.txt")); out != "kept\nscratch\n" {
			t.Errorf("files in copy %s: %q", id, out)
		}
	}
	// Apart: copy 0's counter stopped and a file written there; copy 1
	// and the source count on and do not see the file.
	if err := alice.Signal(ctx, ids[0], counterPID(t, alice, ids[0]), "KILL"); err != nil {
		t.Fatal(err)
	}
	if _, _, end := run(t, alice, ids[0], sh("echo mine > /workspace/only0.txt")); end.ExitCode != 0 {
		t.Fatalf("write in copy 0: %+v", end)
	}
	countPast(t, alice, ids[1], count(t, alice, ids[1]))
	if n := countPast(t, alice, src.ID, afterSrc); n <= afterSrc {
		t.Errorf("the source's counter: %d", n)
	}
	for _, id := range []string{ids[1], src.ID} {
		if out, _, _ := run(t, alice, id, sh("test -e /workspace/only0.txt && echo seen || echo apart")); out != "apart\n" {
			t.Errorf("%s sees copy 0's file: %q", id, out)
		}
	}

	// The checkpoint is the fork's: not listed, its memory gone.
	if sns, err := alice.Snapshots(ctx); err != nil || len(sns) != 0 {
		t.Errorf("snapshots after the fork: %+v %v", sns, err)
	}
	if mem, _ := filepath.Glob(filepath.Join(d.data, "snapshots", "*", "memory")); len(mem) != 0 {
		t.Errorf("the fork's checkpoint is left: %v", mem)
	}
	recs, err := alice.Audit(ctx, src.ID, "sandbox.forked")
	if err != nil || len(recs) != 1 {
		t.Fatalf("sandbox.forked: %+v %v", recs, err)
	}
	var fr struct {
		Sandboxes []string `json:"sandboxes"`
		Memory    bool     `json:"memory"`
	}
	if err := json.Unmarshal(recs[0].Data, &fr); err != nil || !fr.Memory || !slices.Equal(fr.Sandboxes, ids) {
		t.Errorf("sandbox.forked says %s (%v), want %v", recs[0].Data, err, ids)
	}
	for _, id := range ids {
		if err := alice.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if dirs := snapshotDirs(t, d); len(dirs) != 0 {
		t.Errorf("the fork's files are left after its copies ended: %v", dirs)
	}
}

// fetcher is a process that keeps fetching http://allowed.test/ through
// the proxy its environment names (HTTP_PROXY, read once at its start),
// counting in memory the answers it gets, in /tmp/fetched.
const fetcher = `import os, time, urllib.request
n = 0
while True:
    try:
        urllib.request.urlopen("http://allowed.test/", timeout=5).read()
        n += 1
        with open("/tmp/fetched.new", "w") as f:
            f.write(str(n))
        os.rename("/tmp/fetched.new", "/tmp/fetched")
    except Exception as e:
        with open("/tmp/fetch-error", "w") as f:
            f.write(repr(e))
    time.sleep(0.2)
`

// fetched reads the fetcher's count in sandbox id (-1: none yet).
func fetched(t *testing.T, c *client.Client, id string) int {
	t.Helper()
	return numberIn(t, c, id, "/tmp/fetched")
}

// egressTo counts sandbox id's egress records that name host, once there
// is one (the proxy writes them as the requests end) or after 30 s.
func egressTo(t *testing.T, c *client.Client, id, host string) int {
	t.Helper()
	for range 300 {
		recs, err := c.Audit(context.Background(), id, "egress")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if strings.Contains(string(r.Data), host) {
				n++
			}
		}
		if n > 0 {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0
}

// A gVisor sandbox in proxy mode is forked and restored with its memory,
// each copy on a network of its own: the checkpoint holds no network
// stack, and a restore builds one on the copy's own namespace. A process
// that kept running across the fork, still naming the source's proxy
// address, reaches the copy's own proxy (every copy's requests are its
// own egress records), a new command resolves and fetches through it, and
// the policy still holds (a denied host is denied). A memory snapshot of
// a sandbox without a network is restored into proxy mode too.
func TestGVisorForkInProxyMode(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	fi := &fakeInternet{Internet: fakenet.New(t)}
	d := startDaemonOpts(t, daemonOpts{bin: airlockBin, fi: fi}, newDataDir(t), "--dns-upstream", "192.0.2.53:53", "--egress-allow-net", "192.0.2.0/24")
	ctx := context.Background()
	alice, _ := forkTenant(t, d, "alice", api.Quotas{})
	net := api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}
	src, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", TTL: "10m", Network: net})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, src.ID) }()
	before := startCounting(t, alice, src.ID)
	st, err := alice.ExecStream(ctx, src.ID, &api.Exec{Cmd: []string{"python3", "-c", fetcher}, Background: true, Tag: "fetcher"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := st.Next(); err != nil || ev.PID == 0 {
		t.Fatalf("start the fetcher: %+v %v", ev, err)
	}
	st.Close()
	waitFetched := func(id string, past int) int {
		t.Helper()
		for range 300 {
			if n := fetched(t, alice, id); n > past {
				return n
			}
			time.Sleep(100 * time.Millisecond)
		}
		out, _, _ := run(t, alice, id, sh("cat /tmp/fetch-error 2>/dev/null"))
		t.Fatalf("the fetcher in %s fetched nothing past %d (last error: %s)", id, past, out)
		return 0
	}
	waitFetched(src.ID, 0)

	fk, err := alice.Fork(ctx, src.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range fk.Sandboxes {
		ids = append(ids, c.ID)
		defer func() { _ = alice.Destroy(ctx, c.ID) }()
	}
	if !fk.Memory || len(ids) != 2 {
		t.Fatalf("fork: %+v", fk)
	}
	for _, id := range ids {
		got, err := alice.Sandbox(ctx, id)
		if err != nil || got.Network.Mode != "proxy" || got.Isolation != "gvisor" {
			t.Errorf("copy %s: %+v %v", id, got, err)
		}
		if n := count(t, alice, id); n < before {
			t.Errorf("copy %s's counter is at %d, below the %d it had before the fork", id, n, before)
		}
		// The fetcher started in the source goes on, through this copy's
		// proxy: its requests are this copy's.
		waitFetched(id, fetched(t, alice, id))
		if n := egressTo(t, alice, id, "allowed.test"); n == 0 {
			t.Errorf("copy %s has no egress record of its fetcher's requests", id)
		}
		// A new command resolves and fetches through the copy's own
		// resolver and proxy; the policy is the source's.
		if out, _, end := run(t, alice, id, sh("getent hosts allowed.test >/dev/null && curl -s -o /dev/null -w '%{http_code}' http://allowed.test/ && curl -s -o /dev/null -w ' %{http_code}' http://evil.test/")); end.ExitCode != 0 || out != "200 403" {
			t.Errorf("copy %s: resolve and fetch allowed.test, then evil.test: %q %+v", id, out, end)
		}
	}
	// The source runs on, its own fetcher too.
	countPast(t, alice, src.ID, before)
	waitFetched(src.ID, fetched(t, alice, src.ID))

	// A memory snapshot of a sandbox with no network, restored into proxy
	// mode: the restored processes run on, and the network is there.
	plain, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, plain.ID) }()
	n := startCounting(t, alice, plain.ID)
	snap, err := alice.SnapshotWith(ctx, plain.ID, &api.CreateSnapshot{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.DeleteSnapshot(ctx, snap.ID) }()
	from, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + snap.ID, TTL: "5m", Network: net})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, from.ID) }()
	countPast(t, alice, from.ID, n)
	if out, _, end := run(t, alice, from.ID, sh("curl -s -o /dev/null -w '%{http_code}' http://allowed.test/")); end.ExitCode != 0 || out != "200" {
		t.Errorf("the restored sandbox fetches allowed.test: %q %+v", out, end)
	}
}
