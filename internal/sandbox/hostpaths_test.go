package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// A tenant names host paths only under its roots: every other workspace,
// repo or image path is refused before anything touches the host, by
// create and by the MCP spec alike.
func TestTenantHostPathsOnlyUnderRoots(t *testing.T) {
	data := t.TempDir()
	db, err := store.Open(filepath.Join(data, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := New(Config{Store: db, Reserved: []string{data}})
	ctx := context.Background()
	admin := &Principal{Admin: true}
	root := t.TempDir()
	for _, d := range []string{filepath.Join(root, "ws"), filepath.Join(data, "audit")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Roots are checked when granted.
	for name, roots := range map[string][]string{
		"relative":        {"srv/t"},
		"missing":         {filepath.Join(root, "nope")},
		"the whole host":  {"/"},
		"the data dir":    {data},
		"a parent of it":  {filepath.Dir(data)},
		"inside the data": {filepath.Join(data, "audit")},
	} {
		if _, err := s.CreateTenant(ctx, admin, &api.CreateTenant{Name: "x", Roots: roots}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("root %s: %v, want invalid argument", name, err)
		}
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	tn, err := s.CreateTenant(ctx, admin, &api.CreateTenant{Name: "acme", Roots: []string{link, root}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tn.Roots, []string{root}) {
		t.Errorf("roots kept as %v, want the real path once", tn.Roots)
	}
	p, err := s.Authenticate(ctx, tn.Key, "")
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
	if _, err := s.UpdateTenant(ctx, admin, "acme", &api.UpdateTenant{Roots: &[]string{}}); err != nil {
		t.Fatal(err)
	}
	p, _ = s.Authenticate(ctx, tn.Key, "")
	if err := s.SetMCPSpec(ctx, p, &api.CreateSandbox{Workspace: filepath.Join(root, "ws")}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("after the roots were taken: %v", err)
	}
	// The embedded service (airlock mcp, root on the host) keeps host paths.
	emb := New(Config{Store: db, HostPaths: true})
	if err := emb.SetMCPSpec(ctx, p, &api.CreateSandbox{Workspace: "/root"}); err != nil {
		t.Errorf("embedded: %v", err)
	}
}
