package hostpath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree is a root holding a directory, a file, links that stay inside and
// links that lead out (absolute, relative, through a chain), next to a
// secret outside it.
func tree(t testing.TB) (root, secret string) {
	base := t.TempDir()
	root = filepath.Join(base, "root")
	secret = filepath.Join(base, "secret")
	for _, d := range []string{root, filepath.Join(root, "ws"), secret} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "ws", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"in":      "ws",
		"abs":     secret,
		"up":      "../secret",
		"chain":   "up",
		"ws/deep": "../../secret",
		"self":    ".",
		"slash":   "/",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	return root, secret
}

func TestOpenStaysBeneathRoot(t *testing.T) {
	root, secret := tree(t)
	for _, p := range []string{"ws", "ws/f", "in", "in/f", "self/ws", "."} {
		f, err := Open(root, filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		f.Close()
	}
	for _, p := range []string{"abs", "up", "chain", "ws/deep", "slash", "slash/etc", "ws/deep/x", "in/../up"} {
		f, err := Open(root, filepath.Join(root, p))
		if err == nil {
			f.Close()
			t.Errorf("%s: opened, want refused", p)
		} else if !errors.Is(err, ErrOutside) {
			t.Errorf("%s: %v, want ErrOutside", p, err)
		}
	}
	for _, p := range []string{secret, filepath.Dir(root), root + "x", "/"} {
		if f, err := Open(root, p); !errors.Is(err, ErrOutside) {
			if f != nil {
				f.Close()
			}
			t.Errorf("%s: %v, want ErrOutside", p, err)
		}
	}
}

// The descriptor is what counts: swapping the directory for a link after
// the open changes nothing for whoever uses it.
func TestOpenedDirectoryOutlivesASwap(t *testing.T) {
	root, secret := tree(t)
	f, err := Open(root, filepath.Join(root, "ws"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Rename(filepath.Join(root, "ws"), filepath.Join(root, "old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(root, "ws")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(FDPath(f), "f")); err != nil {
		t.Errorf("the opened directory lost its file: %v", err)
	}
}

// FuzzOpenStaysBeneathRoot: whatever path is asked for, what is opened
// lies inside the root.
func FuzzOpenStaysBeneathRoot(f *testing.F) {
	for _, s := range []string{"ws", "abs", "up/x", "chain", "ws/deep", "in/../..", "self/self/up", "slash/etc/passwd", "..", "a/../../secret"} {
		f.Add(s)
	}
	root, _ := tree(f)
	f.Fuzz(func(t *testing.T, rel string) {
		p := filepath.Join(root, rel)
		fd, err := Open(root, p)
		if err != nil {
			return
		}
		defer fd.Close()
		real, err := os.Readlink(FDPath(fd))
		if err != nil {
			t.Fatal(err)
		}
		if real != root && !strings.HasPrefix(real, root+"/") {
			t.Fatalf("%q opened %s, outside %s", rel, real, root)
		}
	})
}

// A root is kept by its real path. If its name is later swapped for a link
// (a tenant able to rename its own root, /home/alice/work, points it at the
// daemon's data directory), nothing is opened through it.
func TestOpenRefusesARootSwappedForALink(t *testing.T) {
	root, secret := tree(t)
	if err := os.WriteFile(filepath.Join(secret, "admin.key"), []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(root, root+".aside"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, root); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{root, filepath.Join(root, "admin.key")} {
		f, err := Open(root, p)
		if err == nil {
			f.Close()
			t.Errorf("%s: opened through a root swapped for a link", p)
		} else if !errors.Is(err, ErrOutside) {
			t.Errorf("%s: %v, want ErrOutside", p, err)
		}
	}
	// A parent of the root swapped for a link is refused alike.
	parent := filepath.Dir(root)
	moved := parent + ".moved"
	if err := os.Rename(parent, moved); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(parent); os.Rename(moved, parent) })
	if err := os.Symlink(moved, parent); err != nil {
		t.Fatal(err)
	}
	if f, err := Open(root, filepath.Join(root, "admin.key")); err == nil {
		f.Close()
		t.Error("opened through a root whose parent is now a link")
	}
}
