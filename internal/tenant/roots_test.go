package tenant

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

// Roots are checked when granted: absolute, existing directories apart
// from the daemon's own, kept by their real path, once.
func TestRootsAreCheckedWhenGranted(t *testing.T) {
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
	if err := os.Mkdir(filepath.Join(data, "audit"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, roots := range map[string][]string{
		"relative":        {"srv/t"},
		"missing":         {filepath.Join(root, "nope")},
		"the whole host":  {"/"},
		"the data dir":    {data},
		"a parent of it":  {filepath.Dir(data)},
		"inside the data": {filepath.Join(data, "audit")},
	} {
		if _, err := s.Create(ctx, admin, &api.CreateTenant{Name: "x", Roots: roots}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("root %s: %v, want invalid argument", name, err)
		}
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	tn, err := s.Create(ctx, admin, &api.CreateTenant{Name: "acme", Roots: []string{link, root}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tn.Roots, []string{root}) {
		t.Errorf("roots kept as %v, want the real path once", tn.Roots)
	}
	p, err := s.Authenticate(ctx, tn.Key, "")
	if err != nil || !slices.Equal(p.Roots, []string{root}) {
		t.Fatalf("signed in with roots %v: %v", p, err)
	}
	if _, err := s.Update(ctx, admin, "acme", &api.UpdateTenant{Roots: &[]string{data}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an update to the data dir: %v", err)
	}
}
