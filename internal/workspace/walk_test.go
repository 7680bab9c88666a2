package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/workspace/internal/wstest"
	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
	"github.com/airlock-sandbox/airlock/internal/workspace/snapshot"
)

// deepTree makes levels nested directories called name under dir, one
// name at a time (the path outgrows PATH_MAX), with a file at the bottom.
func deepTree(t *testing.T, dir, name string, levels int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range levels {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	f, err := unix.Openat(fd, "bottom", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(f)
}

// hardLinks makes file name (size bytes of text) under dir and n more
// links to it.
func hardLinks(t *testing.T, dir, name string, size, n int) {
	t.Helper()
	line := strings.Repeat("x", 63) + "\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Repeat(line, size/64)), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := os.Link(filepath.Join(dir, name), filepath.Join(dir, fmt.Sprintf("%s-link%04d", name, i))); err != nil {
			t.Fatal(err)
		}
	}
}

func unreadHas(us []safefs.Unread, path, why string) bool {
	for _, u := range us {
		if strings.HasPrefix(u.Path, path) && strings.Contains(u.Why, why) {
			return true
		}
	}
	return false
}

// A tree deeper than PATH_MAX, and one deeper than MaxDepth, next to a
// changed README: the change set, the diff, the archive, the export and
// the snapshot still show the README and name both subtrees.
func TestDeepTreesAreNamedAndEverythingElseShown(t *testing.T) {
	lower, upper := t.TempDir(), t.TempDir()
	wstest.Mkfiles(t, lower, map[string]string{"README": "hello\n"})
	wstest.Mkfiles(t, upper, map[string]string{"README": "hello\nbackdoor\n", "z-after": "after\n"})
	long := strings.Repeat("d", 200)
	deepTree(t, upper, long, 30) // 6030 bytes of path
	if err := os.Mkdir(filepath.Join(upper, "many"), 0o755); err != nil {
		t.Fatal(err)
	}
	deepTree(t, filepath.Join(upper, "many"), "m", safefs.MaxDepth+10)

	set, err := Changes(context.Background(), lower, wstest.OpenPath(t, upper), wstest.OpenPath(t, upper))
	if err != nil {
		t.Fatalf("the walk failed whole: %v", err)
	}
	paths := map[string]Kind{}
	for _, c := range set.Changes {
		paths[c.Path] = c.Kind
	}
	if paths["README"] != Modified || paths["z-after"] != Added {
		t.Errorf("README or z-after missing from the changes: %v", set.Changes[:min(len(set.Changes), 5)])
	}
	if !unreadHas(set.Unread, long, "longer than") || !unreadHas(set.Unread, "many/m/m", "deeper than") {
		t.Errorf("the deep subtrees are not named: %v", set.Unread)
	}
	var diff bytes.Buffer
	if err := set.WriteDiff(&diff, MaxDiffBytes); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"+backdoor", "airlock: not read: " + long, "deeper than 256 levels"} {
		if !strings.Contains(diff.String(), want) {
			t.Errorf("the diff lacks %q", want)
		}
	}

	var tarball bytes.Buffer
	var skipped []string
	err = Tar(context.Background(), wstest.OpenPath(t, upper), "", 1<<20, func(s []string) io.Writer { skipped = s; return &tarball })
	if err != nil {
		t.Fatalf("the archive failed whole: %v", err)
	}
	if !strings.Contains(strings.Join(skipped, "\n"), long) || !tarHas(t, tarball.Bytes(), "README") {
		t.Errorf("archive: README missing or the deep subtree not named: %v", skipped)
	}

	dst := filepath.Join(t.TempDir(), "out")
	skipped, err = set.Export(dst)
	if err != nil {
		t.Fatalf("the export failed whole: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "README")); !strings.Contains(string(b), "backdoor") || !strings.Contains(strings.Join(skipped, "\n"), long) {
		t.Errorf("export: README %q, skipped %v", b, skipped)
	}

	if os.Geteuid() == 0 {
		snap := t.TempDir()
		w, err := snapshot.NewWriter(snap, sha256.New(), 1<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		skipped, err = w.CopyTree(context.Background(), wstest.OpenPath(t, upper), func(u, g uint32) (uint32, uint32) { return u, g })
		if err != nil {
			t.Fatalf("the snapshot failed whole: %v", err)
		}
		if _, err := os.Stat(filepath.Join(snap, "z-after")); err != nil || !strings.Contains(strings.Join(skipped, "\n"), "deeper than") {
			t.Errorf("snapshot: z-after %v, skipped %v", err, skipped)
		}
	}
}

func tarHas(t *testing.T, b []byte, name string) bool {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err != nil {
			return false
		}
		if h.Name == name {
			return true
		}
	}
}

// One 1 MiB file and 300 links to it: every reader reads it once.
func TestHardLinksAreReadOnce(t *testing.T) {
	const size, links = 1 << 20, 300
	upper := t.TempDir()
	hardLinks(t, upper, "big", size, links)

	set, err := Changes(context.Background(), "", wstest.OpenPath(t, upper), wstest.OpenPath(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Changes) != links+1 {
		t.Fatalf("%d changes, want %d", len(set.Changes), links+1)
	}
	first := set.Digest(set.Changes[0])
	for _, c := range set.Changes[1:] {
		if c.HardLink != "big" || set.Digest(c) != first {
			t.Fatalf("%s: hard link %q, digest %q (want big, %q)", c.Path, c.HardLink, set.Digest(c), first)
		}
	}
	if set.hashed != size {
		t.Errorf("digests read %d bytes, want %d", set.hashed, size)
	}
	var diff bytes.Buffer
	if err := set.WriteDiff(&diff, MaxDiffBytes); err != nil {
		t.Fatal(err)
	}
	if n := diff.Len(); n > size+size/8+links*100 {
		t.Errorf("the diff is %d bytes: the file's content was repeated", n)
	}
	if !strings.Contains(diff.String(), "added file big-link0299 (a hard link to big: the same content)") {
		t.Error("the diff does not name the links")
	}

	var tarball bytes.Buffer
	if err := Tar(context.Background(), wstest.OpenPath(t, upper), "", size+1, func([]string) io.Writer { return &tarball }); err != nil {
		t.Fatalf("archive: %v", err)
	}
	if n := tarball.Len(); n > size+links*2048 {
		t.Errorf("the archive is %d bytes: the file's content was repeated", n)
	}
	dst := t.TempDir()
	if err := extractAll(tarball.Bytes(), dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(dst, "big"))
	b, err := os.Stat(filepath.Join(dst, "big-link0299"))
	if err != nil || !os.SameFile(a, b) || b.Size() != size {
		t.Errorf("the archive's links do not unpack to the file: %v", err)
	}

	out := filepath.Join(t.TempDir(), "export")
	if _, err := set.Export(out); err != nil {
		t.Fatal(err)
	}
	a, _ = os.Stat(filepath.Join(out, "big"))
	b, err = os.Stat(filepath.Join(out, "big-link0150"))
	if err != nil || !os.SameFile(a, b) {
		t.Errorf("the export copied a link's content again: %v", err)
	}

	if os.Geteuid() == 0 {
		snap := t.TempDir()
		w, err := snapshot.NewWriter(snap, sha256.New(), 2*size, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if _, err := w.CopyTree(context.Background(), wstest.OpenPath(t, upper), func(u, g uint32) (uint32, uint32) { return u, g }); err != nil {
			t.Fatalf("snapshot: %v (the links counted as copies?)", err)
		}
		if w.Written() != size {
			t.Errorf("the snapshot wrote %d bytes, want %d", w.Written(), size)
		}
		a, _ = os.Stat(filepath.Join(snap, "big"))
		b, err = os.Stat(filepath.Join(snap, "big-link0007"))
		if err != nil || !os.SameFile(a, b) {
			t.Errorf("the snapshot copied a link's content again: %v", err)
		}
	}
}

// extractAll unpacks regular files and hard links (test helper).
func extractAll(b []byte, dst string) error {
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dst, h.Name)
		switch h.Typeflag {
		case tar.TypeReg:
			c, _ := io.ReadAll(tr)
			if err := os.WriteFile(p, c, 0o644); err != nil {
				return err
			}
		case tar.TypeLink:
			if err := os.Link(filepath.Join(dst, h.Linkname), p); err != nil {
				return err
			}
		}
	}
}

// Many distinct files: the diff stops diffing at its budget, names the
// rest and says so; the archive past its cap fails before its first byte.
func TestDiffAndArchiveKeepTheirBudgets(t *testing.T) {
	upper := t.TempDir()
	line := strings.Repeat("y", 63) + "\n"
	for i := range 40 {
		if err := os.WriteFile(filepath.Join(upper, "f"+strconv.Itoa(100+i)), []byte(strings.Repeat(line, 4096)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set, err := Changes(context.Background(), "", wstest.OpenPath(t, upper), wstest.OpenPath(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	const budget = 1 << 20
	var diff bytes.Buffer
	if err := set.WriteDiff(&diff, budget); err != nil {
		t.Fatal(err)
	}
	if diff.Len() > budget+(1<<19) {
		t.Errorf("the diff is %d bytes, budget %d", diff.Len(), budget)
	}
	if !strings.Contains(diff.String(), "not diffed: the diff is past its budget") || !strings.Contains(diff.String(), "airlock: the diff reached its budget") {
		t.Error("the diff does not say what it left out")
	}
	started := false
	err = Tar(context.Background(), wstest.OpenPath(t, upper), "", budget, func([]string) io.Writer { started = true; return io.Discard })
	if !errors.Is(err, safefs.ErrTooLarge) || started {
		t.Errorf("archive past its cap: %v (started %v)", err, started)
	}
}

// A walk whose time is up stops and says so.
func TestWalkStopsWhenItsTimeIsUp(t *testing.T) {
	upper := t.TempDir()
	wstest.Mkfiles(t, upper, map[string]string{"a": "a\n", "b/c": "c\n"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	set, err := Changes(ctx, "", wstest.OpenPath(t, upper), wstest.OpenPath(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Changes) != 0 || !unreadHas(set.Unread, ".", "cancelled") {
		t.Errorf("changes %v, unread %v", set.Changes, set.Unread)
	}
}
