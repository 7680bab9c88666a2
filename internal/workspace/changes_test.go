package workspace

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func mkfiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func openPath(t *testing.T, p string) *os.File {
	t.Helper()
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), p)
	t.Cleanup(func() { f.Close() })
	return f
}

// An upper layer as overlayfs writes it: changed and new files, whiteouts
// (0:0 character devices) and opaque directories (user.overlay.opaque=y).
func TestChangesFromUpperLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts are character devices: mknod needs root")
	}
	lower, upper := t.TempDir(), t.TempDir()
	mkfiles(t, lower, map[string]string{"a.txt": "one\n", "b.txt": "bee\n", "same.txt": "same\n", "d/x": "x\n", "d/y": "y\n", "e/z": "z\n"})
	mkfiles(t, upper, map[string]string{"a.txt": "two\n", "new.txt": "new\n", "same.txt": "same\n", "d/y2": "y2\n"})
	if err := unix.Mknod(filepath.Join(upper, "b.txt"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(upper, "e"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(upper, "d"), "user.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("no user xattrs here: %v", err)
	}
	_ = os.Symlink("/etc/shadow", filepath.Join(upper, "evil"))
	set, err := Changes(lower, openPath(t, upper), openPath(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range set.Changes {
		got = append(got, string(c.Kind)+" "+c.Path)
	}
	want := "modified a.txt,deleted b.txt,deleted d/x,deleted d/y,added d/y2,deleted e/z,added evil,added new.txt"
	if strings.Join(got, ",") != want {
		t.Fatalf("changes\n got %s\nwant %s", strings.Join(got, ","), want)
	}
	var diff bytes.Buffer
	if err := set.WriteDiff(&diff); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"-one\n+two\n", "--- a/b.txt\n+++ /dev/null\n", "added symlink evil -> /etc/shadow"} {
		if !strings.Contains(diff.String(), w) {
			t.Errorf("diff lacks %q:\n%s", w, diff.String())
		}
	}
	if strings.Contains(diff.String(), "root:") {
		t.Fatal("the diff followed a symlink out of the workspace")
	}
}

func TestReadCappedRefusesEscapes(t *testing.T) {
	root := t.TempDir()
	_ = os.Symlink("/etc/passwd", filepath.Join(root, "abs"))
	_ = os.Symlink("../../../../../../etc/passwd", filepath.Join(root, "rel"))
	_ = unix.Mkfifo(filepath.Join(root, "fifo"), 0o644)
	mkfiles(t, root, map[string]string{"big": strings.Repeat("x", 100)})
	r := openPath(t, root)
	for _, p := range []string{"abs", "rel", "fifo", "../etc/passwd", "/etc/passwd"} {
		if b, err := readCapped(r, p, 1<<20); err == nil {
			t.Errorf("read %s: %q", p, b)
		}
	}
	if _, err := readCapped(r, "big", 10); err == nil {
		t.Error("size cap not enforced")
	}
}

func TestLinkStaysInside(t *testing.T) {
	for _, c := range []struct {
		rel, target string
		ok          bool
	}{
		{"a", "b", true}, {"d/a", "../b", true}, {"d/a", "../../b", false},
		{"a", "/etc/passwd", false}, {"a", "..", false}, {"d/e/a", "../../x", true}, {"a", "", false},
	} {
		if got := linkStaysInside(c.rel, c.target); got != c.ok {
			t.Errorf("linkStaysInside(%q, %q) = %v", c.rel, c.target, got)
		}
	}
}
