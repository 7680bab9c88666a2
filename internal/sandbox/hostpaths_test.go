package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// A tenant names host paths only under its roots: every other workspace,
// repo or image path is refused before anything touches the host, by
// create and by the MCP spec alike. (Roots themselves are checked when
// granted: internal/tenant.)
func TestTenantHostPathsOnlyUnderRoots(t *testing.T) {
	data := t.TempDir()
	db, err := store.Open(filepath.Join(data, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := New(Config{Store: db})
	tenants := tenant.New(tenant.Config{Store: db, Sandboxes: s, Reserved: []string{data}})
	ctx := context.Background()
	admin := &tenant.Principal{Admin: true}
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "ws"), 0o755); err != nil {
		t.Fatal(err)
	}
	tn, err := tenants.Create(ctx, admin, &api.CreateTenant{Name: "acme", Roots: []string{root}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := tenants.Authenticate(ctx, tn.Key, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []*api.CreateSandbox{
		{Workspace: data},
		{Workspace: "/root"},
		{Workspace: filepath.Dir(root)},
		{Repo: "/srv/repo"},
		{Image: "/"},
		{Image: "oci:/var/lib/airlock/images"},
		{Image: "docker-archive:/etc/shadow"},
		{Workspace: root + "x"}, // a sibling that shares the prefix
	} {
		if _, err := s.Create(ctx, p, req); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("create %+v: %v, want permission denied", req, err)
		}
		if err := s.SetMCPSpec(ctx, p, req); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("mcp spec %+v: %v, want permission denied", req, err)
		}
	}
	if err := s.SetMCPSpec(ctx, p, &api.CreateSandbox{Workspace: filepath.Join(root, "ws")}); err != nil {
		t.Errorf("a workspace under the root: %v", err)
	}
	// Taking the roots away takes the paths.
	if _, err := tenants.Update(ctx, admin, "acme", &api.UpdateTenant{Roots: &[]string{}}); err != nil {
		t.Fatal(err)
	}
	p, _ = tenants.Authenticate(ctx, tn.Key, "")
	if err := s.SetMCPSpec(ctx, p, &api.CreateSandbox{Workspace: filepath.Join(root, "ws")}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("after the roots were taken: %v", err)
	}
	// The embedded service (airlock mcp, root on the host) keeps host paths.
	emb := New(Config{Store: db, HostPaths: true})
	if err := emb.SetMCPSpec(ctx, p, &api.CreateSandbox{Workspace: "/root"}); err != nil {
		t.Errorf("embedded: %v", err)
	}
}
