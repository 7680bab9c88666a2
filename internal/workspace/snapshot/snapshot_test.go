package snapshot

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/workspace/internal/wstest"
)

// The writer never follows a symlink in the destination, whatever names
// it is given: a link the sandbox made cannot carry a write elsewhere.
func TestWriterFollowsNoSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the writer sets owners: needs root")
	}
	dst, outside := t.TempDir(), t.TempDir()
	w, err := NewWriter(dst, sha256.New(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.symlink("link", outside, 0, 0); err != nil {
		t.Fatal(err)
	}
	src, _ := os.Open("/etc/hostname")
	defer src.Close()
	if err := w.file(context.Background(), "link/planted", src, 1, 0o644, 0, 0); err == nil {
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

// A snapshot writes no setuid or setgid bit on the host, neither for what
// the sandbox made (CopyTree, ApplyUpper) nor for the image it copies
// (LinkTree), whose own files keep theirs; sticky stays.
func TestSnapshotStripsSetID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the writer sets owners: needs root")
	}
	src := t.TempDir()
	wstest.Mkfiles(t, src, map[string]string{"suid": "#!/bin/sh\n", "shared/f": "y", "tmp/t": "z"})
	modes := map[string]os.FileMode{
		"suid":   0o755 | os.ModeSetuid | os.ModeSetgid,
		"shared": os.ModePerm | os.ModeSetgid,
		"tmp":    os.ModePerm | os.ModeSticky,
	}
	for p, m := range modes {
		if err := os.Chmod(filepath.Join(src, p), m); err != nil {
			t.Fatal(err)
		}
	}
	check := func(dst string) {
		t.Helper()
		for p, m := range modes {
			fi, err := os.Lstat(filepath.Join(dst, p))
			if want := m &^ (os.ModeSetuid | os.ModeSetgid); err != nil || fi.Mode()&^os.ModeDir != want {
				t.Errorf("%s: %v (%v), want %v", filepath.Join(dst, p), fi.Mode(), err, want)
			}
		}
	}
	copied := t.TempDir()
	w, err := NewWriter(copied, sha256.New(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.CopyTree(context.Background(), wstest.OpenPath(t, src), func(u, g uint32) (uint32, uint32) { return u, g }); err != nil {
		t.Fatal(err)
	}
	check(copied)
	linked := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(linked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := LinkTree(context.Background(), src, linked); err != nil {
		t.Fatal(err)
	}
	check(linked)
	if fi, _ := os.Stat(filepath.Join(src, "suid")); fi.Mode()&os.ModeSetuid == 0 {
		t.Error("LinkTree changed the image's own file")
	}
}

// The writer tells its counter of every byte of file content it writes,
// as it writes them; and a context that ends stops it within the file at
// work, with the context's error, for the tree copy and the image's links
// alike.
func TestWriterCountsAndStopsOnCancel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the writer sets owners: needs root")
	}
	const size = 4 << 20
	src := t.TempDir()
	wstest.Mkfiles(t, src, map[string]string{"a": strings.Repeat("a", size), "sub/b": strings.Repeat("b", size), "sub/c": ""})
	owner := func(u, g uint32) (uint32, uint32) { return u, g }

	var counted int64
	calls := 0
	w, err := NewWriter(t.TempDir(), sha256.New(), 1<<30, func(n int64) { counted += n; calls++ })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.CopyTree(context.Background(), wstest.OpenPath(t, src), owner); err != nil {
		t.Fatal(err)
	}
	if counted != 2*size || w.Written() != 2*size || calls < 2*size/(64<<10) {
		t.Errorf("counted %d bytes in %d reports, written %d: want %d, in pieces", counted, calls, w.Written(), 2*size)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	counted = 0
	dst := t.TempDir()
	w, err = NewWriter(dst, sha256.New(), 1<<30, func(n int64) { counted += n; cancel() })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = w.CopyTree(ctx, wstest.OpenPath(t, src), owner)
	if !errors.Is(err, context.Canceled) || counted == 0 || counted >= size {
		t.Errorf("cancelled after the first piece: %v, %d bytes copied (a file is %d)", err, counted, size)
	}
	if _, err := os.Stat(filepath.Join(dst, "sub", "b")); err == nil {
		t.Error("the copy went on to the next file")
	}
	if _, err := w.ApplyUpper(ctx, wstest.OpenPath(t, src), owner); !errors.Is(err, context.Canceled) {
		t.Errorf("an upper layer applied under an ended context: %v", err)
	}
	linked := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(linked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := LinkTree(ctx, src, linked); !errors.Is(err, context.Canceled) {
		t.Errorf("an image linked under an ended context: %v", err)
	}
}
