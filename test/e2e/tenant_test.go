package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// ociLayout writes the suite's test image as an OCI layout and names it.
func ociLayout(t *testing.T) string {
	t.Helper()
	lp, err := layout.Write(filepath.Join(t.TempDir(), "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(testImage(t)); err != nil {
		t.Fatal(err)
	}
	return "oci:" + string(lp)
}

// holdUnpack holds the daemon's image unpack lock: a create of an image
// not yet in its cache waits for it, in flight for as long as the test
// needs. It returns when such a create is waiting, and gives back the
// release.
func holdUnpack(t *testing.T, data string, create func()) (release func()) {
	t.Helper()
	lock := filepath.Join(data, "images", ".unpack.lock")
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	release = func() { f.Close() }
	t.Cleanup(release)
	go create()
	// /proc/locks shows a waiter as "N: -> FLOCK ... MAJ:MIN:INODE ...".
	ino := fmt.Sprintf(":%d ", st.Ino)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/locks")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "->") && strings.Contains(l, ino) {
				return release
			}
		}
	}
	t.Fatal("the create never waited for the image unpack lock")
	return nil
}

// waitLog waits for the daemon to log msg.
func (d *daemonProc) waitLog(t *testing.T, msg string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(d.log.String(), msg) {
			return
		}
	}
	t.Fatalf("the daemon never logged %q", msg)
}

type createAnswer struct {
	sb  *api.Sandbox
	err error
}

// Issue 12, item 5: a create in flight when the kill switch is thrown
// survived it. Now it ends destroyed, answers failed_precondition naming
// its sandbox, is recorded, and the kill switch answers only once it is
// gone; another tenant's sandbox is untouched.
func TestServeKillSwitchEndsCreatesInFlight(t *testing.T) {
	forEachWall(t, serveKillSwitchEndsCreatesInFlight)
}

func serveKillSwitchEndsCreatesInFlight(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	racer := d.tenant(t, "racer", api.Quotas{})
	other := d.tenant(t, "other", api.Quotas{})
	keep, err := other.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	img := ociLayout(t)
	created := make(chan createAnswer, 1)
	release := holdUnpack(t, data, func() {
		sb, err := racer.CreateSandbox(ctx, &api.CreateSandbox{Image: img})
		created <- createAnswer{sb, err}
	})
	type killAnswer struct {
		ids []string
		err error
	}
	killed := make(chan killAnswer, 1)
	go func() {
		ids, err := d.admin.KillAll(ctx, "racer")
		killed <- killAnswer{ids, err}
	}()
	d.waitLog(t, "kill switch: ending creates in flight")
	select {
	case k := <-killed:
		t.Fatalf("the kill switch answered %v while a create of its tenant was still being made", k)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	k := <-killed
	if k.err != nil || len(k.ids) != 1 {
		t.Fatalf("kill-all: %v %v", k.ids, k.err)
	}
	c := <-created
	wantCode(t, "a create the kill switch ended", c.err, api.CodeFailedPrecondition)
	if c.err == nil || !strings.Contains(c.err.Error(), k.ids[0]) || !strings.Contains(c.err.Error(), "kill switch") {
		t.Errorf("the create's answer should name its sandbox %s and the kill switch: %+v %v", k.ids[0], c.sb, c.err)
	}
	if l, err := racer.Sandboxes(ctx); err != nil || len(l) != 0 {
		t.Errorf("racer's sandboxes after the kill switch: %+v %v", l, err)
	}
	recs, err := racer.Audit(ctx, k.ids[0], "sandbox.destroyed")
	if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Data), "kill switch") {
		t.Errorf("the ended create's record: %+v %v", recs, err)
	}
	if _, _, end := run(t, other, keep.ID, sh("true")); end.ExitCode != 0 {
		t.Errorf("the other tenant's sandbox: %+v", end)
	}
	// The kill switch is not a ban: the tenant's next create runs.
	sb, err := racer.CreateSandbox(ctx, &api.CreateSandbox{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, end := run(t, racer, sb.ID, &api.Exec{Cmd: []string{"attack", "stat", "/bin/attack"}}); end.ExitCode != 0 {
		t.Errorf("a sandbox after the kill switch: %+v", end)
	}
	if _, err := d.admin.KillAll(ctx, ""); err != nil {
		t.Fatal(err)
	}
	noResidue(t)
}

// wideRepo makes a git repository at dir whose one commit holds dirs
// directories of files files each (one blob), and returns the commit.
func wideRepo(t *testing.T, dir string, dirs, files int) string {
	t.Helper()
	git := func(stdin string, args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "init", "-q", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	blob := git("x\n", "hash-object", "-w", "--stdin")
	var sub, top strings.Builder
	for i := range files {
		fmt.Fprintf(&sub, "100644 blob %s\tf%06d\n", blob, i)
	}
	tree := git(sub.String(), "mktree")
	for i := range dirs {
		fmt.Fprintf(&top, "040000 tree %s\td%04d\n", tree, i)
	}
	return git("", "commit-tree", git(top.String(), "mktree"), "-m", "wide")
}

// Issue 12 (second pass): a repository checkout ignored cancellation, so
// the kill switch waited for a create writing up to 1 Mi files on the
// host. The kill switch now ends a create held in its checkout at once,
// and the files it wrote are removed.
func TestServeKillSwitchEndsACheckoutInFlight(t *testing.T) {
	forEachWall(t, serveKillSwitchEndsACheckoutInFlight)
}

func serveKillSwitchEndsACheckoutInFlight(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	racer := d.tenant(t, "racer", api.Quotas{})
	repo := filepath.Join(t.TempDir(), "repo")
	commit := wideRepo(t, repo, 1000, 1000) // 10^6 files: the cap is 1 Mi
	created := make(chan createAnswer, 1)
	go func() {
		sb, err := racer.CreateSandbox(ctx, &api.CreateSandbox{Repo: repo, Commit: commit})
		created <- createAnswer{sb, err}
	}()
	tmp := filepath.Join(data, "tmp")
	writing := func() bool {
		m, _ := filepath.Glob(filepath.Join(tmp, "*", "d0000", "f000000"))
		return len(m) > 0
	}
	for deadline := time.Now().Add(60 * time.Second); !writing(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the checkout wrote nothing in 60 s")
		}
	}
	start := time.Now()
	ids, err := d.admin.KillAll(ctx, "racer")
	took := time.Since(start)
	if err != nil || len(ids) != 1 {
		t.Fatalf("kill-all: %v %v", ids, err)
	}
	t.Logf("the kill switch answered in %v", took)
	if took > 5*time.Second {
		t.Errorf("the kill switch waited %v for a checkout", took)
	}
	c := <-created
	wantCode(t, "a create the kill switch ended in its checkout", c.err, api.CodeFailedPrecondition)
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("the ended checkout left %d entries in %s", len(ents), tmp)
	}
	if l, err := racer.Sandboxes(ctx); err != nil || len(l) != 0 {
		t.Errorf("racer's sandboxes after the kill switch: %+v %v", l, err)
	}
	noResidue(t)
}

// Issue 12, items 5 and 6: a tenant deleted during a create kept that
// sandbox, and a tenant made again under its name inherited it, its
// snapshots and its audit records (bound by name). Now the create ends
// destroyed, and the new tenant (a new id) sees nothing of the old.
func TestServeDeletedTenantPassesNothingToItsName(t *testing.T) {
	forEachWall(t, serveDeletedTenantPassesNothingToItsName)
}

func serveDeletedTenantPassesNothingToItsName(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	old := d.tenant(t, "acme", api.Quotas{})
	ts, err := old.Tenants(ctx)
	if err != nil || len(ts) != 1 || ts[0].ID == "" {
		t.Fatalf("the tenant's own record: %+v %v", ts, err)
	}
	oldID := ts[0].ID
	sb, err := old.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.WriteFile(ctx, sb.ID, "/workspace/work.txt", []byte("the old acme's work"), 0o644); err != nil {
		t.Fatal(err)
	}
	sn, err := old.Snapshot(ctx, sb.ID, "old")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.AddSecret(ctx, "token", "old-acme-secret-value"); err != nil {
		t.Fatal(err)
	}
	if err := old.SetMCPSpec(ctx, &api.CreateSandbox{Hostname: "oldacme"}); err != nil {
		t.Fatal(err)
	}
	img := ociLayout(t)
	created := make(chan createAnswer, 1)
	release := holdUnpack(t, data, func() {
		sb, err := old.CreateSandbox(ctx, &api.CreateSandbox{Image: img})
		created <- createAnswer{sb, err}
	})
	deleted := make(chan error, 1)
	go func() { deleted <- d.admin.DeleteTenant(ctx, "acme") }()
	d.waitLog(t, "kill switch: ending creates in flight")
	release()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	c := <-created
	wantCode(t, "a create of a tenant deleted meanwhile", c.err, api.CodeFailedPrecondition)
	if c.err == nil || !strings.Contains(c.err.Error(), "tenant acme deleted") {
		t.Errorf("the create's answer: %+v %v", c.sb, c.err)
	}
	_, err = old.Sandboxes(ctx)
	wantCode(t, "the deleted tenant's key", err, api.CodeUnauthenticated)
	if ents, _ := os.ReadDir(filepath.Join(data, "snapshots")); len(ents) != 0 {
		t.Errorf("the deleted tenant's snapshot files are left: %v", ents)
	}

	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if tn.ID == "" || tn.ID == oldID {
		t.Fatalf("the new acme's id %q (the old one's %q)", tn.ID, oldID)
	}
	fresh := d.client(t, tn.Key)
	if l, err := fresh.Sandboxes(ctx); err != nil || len(l) != 0 {
		t.Errorf("the new acme lists sandboxes %+v %v", l, err)
	}
	_, err = fresh.Sandbox(ctx, sb.ID)
	wantCode(t, "the old acme's sandbox, read by the new", err, api.CodeNotFound)
	if l, err := fresh.Snapshots(ctx); err != nil || len(l) != 0 {
		t.Errorf("the new acme lists snapshots %+v %v", l, err)
	}
	_, err = fresh.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + sn.ID})
	wantCode(t, "the old acme's snapshot, used by the new", err, api.CodeNotFound)
	wantCode(t, "the old acme's snapshot, deleted by the new", fresh.DeleteSnapshot(ctx, sn.ID), api.CodeNotFound)
	if l, err := fresh.Secrets(ctx); err != nil || len(l) != 0 {
		t.Errorf("the new acme lists secrets %+v %v", l, err)
	}
	if m, err := fresh.MCPSpec(ctx); err != nil || m.Hostname != "" {
		t.Errorf("the new acme's MCP spec: %+v %v", m, err)
	}
	recs, err := fresh.Audit(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Kind != "tenant.created" || recs[0].Tenant != tn.ID {
		t.Errorf("the new acme reads %d records, want only its own tenant.created: %+v", len(recs), recs)
	}
	// The admin still reads the old one's history, under its id.
	if got, err := d.admin.Sandbox(ctx, sb.ID); err != nil || got.TenantID != oldID || got.Tenant != "acme" || got.State != api.StateEnded {
		t.Errorf("the old acme's sandbox, for the admin: %+v %v", got, err)
	}
	noResidue(t)
}

// Issue 12, item 13: deleting another tenant's snapshot answered "in use
// by a sandbox (<their id>)" before checking ownership, and snapshot ids
// were content digests shared by tenants: a content oracle. Now each
// tenant has its own ids, and another's is not found with nothing of
// theirs in the answer.
func TestServeSnapshotIDsAreNoOracle(t *testing.T) {
	forEachWall(t, serveSnapshotIDsAreNoOracle)
}

func serveSnapshotIDsAreNoOracle(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	bob := d.tenant(t, "bob", api.Quotas{})
	snap := func(c *client.Client) (*api.Sandbox, *api.Snapshot) {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFile(ctx, sb.ID, "/workspace/same.txt", []byte("the same content\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		sn, err := c.Snapshot(ctx, sb.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		return sb, sn
	}
	asb, asn := snap(alice)
	_, bsn := snap(bob)
	if asn.ID == bsn.ID {
		t.Fatalf("two tenants' snapshots of the same content share the id %s", asn.ID)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "snapshots")); len(ents) != 1 {
		t.Errorf("the same content should be one set of files: %v", ents)
	}
	from, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + asn.ID})
	if err != nil {
		t.Fatal(err)
	}
	for what, id := range map[string]string{"alice's snapshot, in use": asn.ID, "a missing one": "0123456789abcdef01234567"} {
		err := bob.DeleteSnapshot(ctx, id)
		wantCode(t, "bob deletes "+what, err, api.CodeNotFound)
		if err != nil && (strings.Contains(err.Error(), from.ID) || strings.Contains(err.Error(), asb.ID) || strings.Contains(err.Error(), "use")) {
			t.Errorf("bob deletes %s: the answer tells of alice's: %v", what, err)
		}
	}
	_, err = bob.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + asn.ID})
	wantCode(t, "bob creates from alice's snapshot", err, api.CodeNotFound)
	err = alice.DeleteSnapshot(ctx, asn.ID)
	wantCode(t, "alice deletes her snapshot in use", err, api.CodeFailedPrecondition)
	if err == nil || !strings.Contains(err.Error(), from.ID) {
		t.Errorf("alice's answer should name her own sandbox %s: %v", from.ID, err)
	}
	// Bob's record goes; the files stay while alice's runs from them.
	if err := bob.DeleteSnapshot(ctx, bsn.ID); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := run(t, alice, from.ID, sh("cat /workspace/same.txt")); out != "the same content\n" {
		t.Errorf("alice's sandbox from the snapshot reads %q", out)
	}
	if err := alice.Destroy(ctx, from.ID); err != nil {
		t.Fatal(err)
	}
	if err := alice.DeleteSnapshot(ctx, asn.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "snapshots")); len(ents) != 0 {
		t.Errorf("snapshot files left: %v", ents)
	}
	if _, err := d.admin.KillAll(ctx, ""); err != nil {
		t.Fatal(err)
	}
	noResidue(t)
}
