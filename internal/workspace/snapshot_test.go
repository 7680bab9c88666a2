package workspace

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
)

// The writer never follows a symlink in the destination, whatever names
// it is given: a link the sandbox made cannot carry a write elsewhere.
func TestWriterFollowsNoSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the writer sets owners: needs root")
	}
	dst, outside := t.TempDir(), t.TempDir()
	w, err := NewWriter(dst, sha256.New(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.symlink("link", outside, 0, 0); err != nil {
		t.Fatal(err)
	}
	src, _ := os.Open("/etc/hostname")
	defer src.Close()
	if err := w.file("link/planted", src, 1, 0o644, 0, 0); err == nil {
		t.Error("wrote through a symlink")
	}
	if err := w.dir("link/sub", 0o755, 0, 0); err == nil {
		t.Error("made a directory through a symlink")
	}
	if err := w.symlink("../../escape", "/", 0, 0); err == nil {
		if _, err := os.Lstat(filepath.Join(filepath.Dir(filepath.Dir(dst)), "escape")); err == nil {
			t.Error("a link was made outside the destination")
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("outside has %v", ents)
	}
	// A directory replaces a link of the same name; the link's target is
	// not touched.
	if err := w.dir("link", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "link")); err != nil || !fi.IsDir() {
		t.Errorf("link not replaced by a directory: %v %v", fi, err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the link's target was removed: %v", err)
	}
}
