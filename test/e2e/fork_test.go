package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
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

// A gVisor sandbox in proxy mode is not forked, nor its memory saved: it
// says why, and makes nothing; a memory snapshot is not restored into a
// proxy-mode sandbox.
func TestGVisorForkRefusedInProxyMode(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice, _ := forkTenant(t, d, "alice", api.Quotas{})
	src, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", TTL: "5m", Network: api.Network{Mode: "proxy"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, src.ID) }()
	_, err = alice.Fork(ctx, src.ID, 1)
	wantCode(t, "a fork of a proxy-mode gvisor sandbox", err, api.CodeFailedPrecondition)
	if err == nil || !strings.Contains(err.Error(), "proxy mode") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	// Nor is its memory saved for a restore elsewhere.
	_, err = alice.SnapshotWith(ctx, src.ID, &api.CreateSnapshot{Memory: true})
	wantCode(t, "a memory snapshot of a proxy-mode gvisor sandbox", err, api.CodeFailedPrecondition)
	if sbs, err := alice.Sandboxes(ctx); err != nil || len(sbs) != 1 {
		t.Errorf("sandboxes after the refusal: %+v %v", sbs, err)
	}
	if dirs := snapshotDirs(t, d); len(dirs) != 0 {
		t.Errorf("the refusals left %v", dirs)
	}
	// And a sandbox restored from memory gets no network.
	plain, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, plain.ID) }()
	snap, err := alice.SnapshotWith(ctx, plain.ID, &api.CreateSnapshot{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.DeleteSnapshot(ctx, snap.ID) }()
	_, err = alice.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + snap.ID, TTL: "5m", Network: api.Network{Mode: "proxy"}})
	wantCode(t, "a proxy-mode restore", err, api.CodeFailedPrecondition)
}

// On the container wall a fork copies files only, and says so: the copies
// have the source's /workspace and root changes as at the fork (not what
// the source writes after), none of its processes; memory false in the
// answer and a line on stderr.
func TestContainerForkCopiesFiles(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice, key := forkTenant(t, d, "alice", api.Quotas{})
	src, err := alice.CreateSandbox(ctx, &api.CreateSandbox{TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, src.ID) }()
	if _, _, end := run(t, alice, src.ID, sh("echo kept > /workspace/w.txt")); end.ExitCode != 0 {
		t.Fatalf("write: %+v", end)
	}
	r := cliAs(t, d, key, nil, nil, "fork", src.ID, "--count", "2", "--json")
	if r.code != 0 || !strings.Contains(r.stderr, "files only, not its memory") {
		t.Fatalf("airlock fork: %s", r)
	}
	var f api.Fork
	if err := json.Unmarshal([]byte(r.stdout), &f); err != nil {
		t.Fatalf("fork --json: %v: %q", err, r.stdout)
	}
	for _, sb := range f.Sandboxes {
		defer func() { _ = alice.Destroy(ctx, sb.ID) }()
	}
	if f.Memory || f.Source != src.ID || len(f.Sandboxes) != 2 || f.Sandboxes[0].ID == f.Sandboxes[1].ID {
		t.Fatalf("fork: %+v", f)
	}
	if _, _, end := run(t, alice, src.ID, sh("echo later > /workspace/w.txt")); end.ExitCode != 0 {
		t.Fatalf("write: %+v", end)
	}
	for _, sb := range f.Sandboxes {
		if out, _, _ := run(t, alice, sb.ID, sh("cat /workspace/w.txt")); out != "kept\n" {
			t.Errorf("copy %s's file: %q", sb.ID, out)
		}
	}
	recs, err := alice.Audit(ctx, src.ID, "sandbox.forked")
	if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Data), `"memory":false`) {
		t.Errorf("sandbox.forked: %+v %v", recs, err)
	}
	for _, sb := range f.Sandboxes {
		if err := alice.Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if dirs := snapshotDirs(t, d); len(dirs) != 0 {
		t.Errorf("the fork's files are left after its copies ended: %v", dirs)
	}
}
