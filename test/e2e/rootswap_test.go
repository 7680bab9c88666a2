package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

// TestServeTenantRootSwappedForALink: a root is granted by its real path,
// but the tenant can rename it (the operator granted /home/alice/work and
// alice owns /home/alice) and leave a link to the daemon's data directory
// in its place. The root's own name is not followed: the create is
// refused, and the data directory never shows up in /workspace. A sandbox
// from a snapshot (its files are the daemon's, behind no link) still works.
func TestServeTenantRootSwappedForALink(t *testing.T) {
	forEachWall(t, serveTenantRootSwappedForALink)
}

func serveTenantRootSwappedForALink(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	home := t.TempDir()
	root := filepath.Join(home, "work")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	an, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "alice", Roots: []string{root}})
	if err != nil {
		t.Fatal(err)
	}
	alice := d.client(t, an.Key)
	adminKey, err := os.ReadFile(filepath.Join(data, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}

	// Before the swap: its root works, and a snapshot of it can be made.
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Workspace: root})
	if err != nil {
		t.Fatalf("a create in the root: %v", err)
	}
	snap, err := alice.Snapshot(ctx, sb.ID, "")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	_ = alice.Destroy(ctx, sb.ID)

	if err := os.Rename(root, root+".aside"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(data, root); err != nil {
		t.Fatal(err)
	}
	for _, req := range []api.CreateSandbox{{Workspace: root}, {Workspace: filepath.Join(root, "audit")}, {Image: "docker-archive:" + filepath.Join(root, "airlock.db")}} {
		sb, err := alice.CreateSandbox(ctx, &req)
		if err == nil {
			out, _, _ := run(t, alice, sb.ID, sh("cat /workspace/admin.key 2>&1; ls /workspace"))
			_ = alice.Destroy(ctx, sb.ID)
			t.Errorf("create %+v through the swapped root: made %s (%q)", req, sb.ID, out)
			continue
		}
		wantCode(t, "create through the swapped root", err, api.CodePermissionDenied)
		if strings.Contains(err.Error(), strings.TrimSpace(string(adminKey))) {
			t.Fatalf("the refusal holds the admin key: %v", err)
		}
	}

	// The snapshot's files are the daemon's: still usable.
	sb, err = alice.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + snap.ID})
	if err != nil {
		t.Fatalf("a create from a snapshot: %v", err)
	}
	_ = alice.Destroy(ctx, sb.ID)
}
