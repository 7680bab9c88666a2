package checkout

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// commitRepo makes a repository at dir with one commit and returns its
// hash.
func commitRepo(t *testing.T, dir string) string {
	r, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wt, _ := r.Worktree()
	if _, err := wt.Add("README"); err != nil {
		t.Fatal(err)
	}
	h, err := wt.Commit("one", &git.CommitOptions{Author: &object.Signature{Name: "t", Email: "t@t", When: time.Unix(0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// A tenant's repository is read beneath its directory: objects reached
// through a link or an alternates file outside it are not there.
func TestRepoBeneathFollowsNoLinkOut(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "host-repo")
	hash := commitRepo(t, outside)

	in := t.TempDir()
	ok := filepath.Join(in, "ok")
	okHash := commitRepo(t, ok)
	linked := filepath.Join(in, "linked")
	if err := os.MkdirAll(linked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, ".git"), filepath.Join(linked, ".git")); err != nil {
		t.Fatal(err)
	}
	alt := filepath.Join(in, "alt")
	if _, err := git.PlainInit(alt, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(alt, ".git", "objects", "info", "alternates"), []byte(filepath.Join(outside, ".git", "objects")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	open := func(p string) *os.File {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	ws, cleanup, err := FromRepoBeneath(context.Background(), open(ok), ok, okHash, t.TempDir(), "a")
	if err != nil {
		t.Fatalf("a repository inside: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "README")); err != nil || string(b) != "hello\n" {
		t.Errorf("checkout: %q %v", b, err)
	}
	cleanup()
	for name, dir := range map[string]string{"a .git linked out": linked, "alternates out": alt} {
		if _, cleanup, err := FromRepoBeneath(context.Background(), open(dir), dir, hash, t.TempDir(), "b"); err == nil {
			cleanup()
			t.Errorf("%s: checked out the host's repository", name)
		}
	}
}
