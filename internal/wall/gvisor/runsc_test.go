package gvisor

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeRunsc writes a runsc at dir/runsc that reports version and counts
// its runs in dir/runs.
func fakeRunsc(t *testing.T, path, version string) {
	t.Helper()
	runs := filepath.Join(filepath.Dir(path), "runs")
	script := "#!/bin/sh\necho run >> " + runs + "\necho 'runsc version " + version + "'\n"
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func runsOf(t *testing.T, dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "runs"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run\n")
}

// A runsc checked at the pinned version is not run again while it is the
// same file, unchanged; a runsc replaced, or written in place, is checked
// again, and a wrong one fails as it would unremembered.
func TestCheckCachedRunsAReplacedOrWrittenRunscAgain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runsc must be root's: needs root")
	}
	dir := t.TempDir()
	path, cache := filepath.Join(dir, "runsc"), filepath.Join(dir, "state", runscChecked)
	if err := os.Mkdir(filepath.Dir(cache), 0o700); err != nil {
		t.Fatal(err)
	}
	fakeRunsc(t, path, Pinned)
	for i := 0; i < 2; i++ {
		if r := CheckCached(path, cache); r.Err != nil || r.Version != Pinned {
			t.Fatalf("check %d: %+v", i, r)
		}
	}
	if n := runsOf(t, dir); n != 1 {
		t.Fatalf("the unchanged runsc ran %d times, want once", n)
	}
	if fi, err := os.Stat(cache); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("cache: %v %v", fi, err)
	}

	// Replaced (a new file renamed over it).
	fakeRunsc(t, path, "v0.0.0-not-the-pin")
	r := CheckCached(path, cache)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "--isolation gvisor needs runsc") || !strings.Contains(r.Err.Error(), "not-the-pin") {
		t.Fatalf("replaced by a wrong runsc: %+v", r)
	}
	if n := runsOf(t, dir); n != 2 {
		t.Fatalf("the replaced runsc was not run (%d runs)", n)
	}

	// Back to the pinned one, remembered; then written in place (same
	// inode, same size) to report another version.
	fakeRunsc(t, path, Pinned)
	if r := CheckCached(path, cache); r.Err != nil {
		t.Fatal(r.Err)
	}
	fi, _ := os.Stat(path)
	b, _ := os.ReadFile(path)
	wrong := strings.Replace(string(b), Pinned, strings.Repeat("x", len(Pinned)), 1)
	if err := os.WriteFile(path, []byte(wrong), 0o755); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(path); !os.SameFile(fi, after) || after.Size() != fi.Size() {
		t.Fatal("not written in place")
	}
	if r := CheckCached(path, cache); r.Err == nil {
		t.Fatalf("runsc written in place to another version: %+v", r)
	}
	if n := runsOf(t, dir); n != 4 {
		t.Fatalf("the written runsc was not run (%d runs)", n)
	}
}

// The cache is believed only as a file of root's that no one else may
// read or write.
func TestCheckCachedBelievesOnlyARootOnlyCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runsc must be root's: needs root")
	}
	dir := t.TempDir()
	path, cache := filepath.Join(dir, "runsc"), filepath.Join(dir, runscChecked)
	fakeRunsc(t, path, "v0.0.0-not-the-pin")
	var st = statOf(t, path)
	for _, c := range []struct {
		mode     os.FileMode
		uid      int
		believed bool
	}{{0o600, 0, true}, {0o644, 0, false}, {0o620, 0, false}, {0o600, 1000, false}} {
		_ = os.Remove(cache)
		if err := os.WriteFile(cache, []byte(identity(&st)), c.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(cache, c.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(cache, c.uid, c.uid); err != nil {
			t.Fatal(err)
		}
		if got := CheckCached(path, cache).Err == nil; got != c.believed {
			t.Errorf("cache mode %o uid %d: believed %v, want %v", c.mode, c.uid, got, c.believed)
		}
	}
}

func statOf(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A wall checks its runsc at every use: one replaced by a wrong one while
// the wall lives (a daemon) fails the next create's check.
func TestWallChecksARunscReplacedWhileItLives(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runsc must be root's: needs root")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "runsc")
	fakeRunsc(t, path, Pinned)
	w, err := New(filepath.Join(dir, "state"), path, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if r := w.Runsc(); r.Err != nil || w.Version() != Pinned {
		t.Fatalf("pinned runsc: %+v", r)
	}
	fakeRunsc(t, path, "v0.0.0-not-the-pin")
	if r := w.Runsc(); r.Err == nil {
		t.Fatalf("runsc replaced by a wrong one while the wall lives: %+v", r)
	}
}
