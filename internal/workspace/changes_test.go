package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/workspace/internal/wstest"
	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
)

// An upper layer as overlayfs writes it: changed and new files, whiteouts
// (0:0 character devices) and opaque directories (user.overlay.opaque=y).
func TestChangesFromUpperLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts are character devices: mknod needs root")
	}
	lower, upper := t.TempDir(), t.TempDir()
	wstest.Mkfiles(t, lower, map[string]string{"a.txt": "one\n", "b.txt": "bee\n", "same.txt": "same\n", "d/x": "x\n", "d/y": "y\n", "e/z": "z\n"})
	wstest.Mkfiles(t, upper, map[string]string{"a.txt": "two\n", "new.txt": "new\n", "same.txt": "same\n", "d/y2": "y2\n"})
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
	set, err := Changes(context.Background(), lower, wstest.OpenPath(t, upper), wstest.OpenPath(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range set.Changes {
		got = append(got, string(c.Kind)+" "+c.Path)
	}
	want := "modified a.txt,deleted b.txt,deleted d/x,deleted d/y,added d/y2,deleted e,deleted e/z,added evil,added new.txt"
	if strings.Join(got, ",") != want {
		t.Fatalf("changes\n got %s\nwant %s", strings.Join(got, ","), want)
	}
	var diff bytes.Buffer
	if err := set.WriteDiff(&diff, MaxDiffBytes); err != nil {
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

// The issue-12 chain: with d -> ., d/d/d/../../.. looks (lexically) like
// it stays inside but the kernel climbs past the root. Export must not
// write it, nor any link that resolves outside, and must say so.
func TestExportRefusesLinksThatResolveOutside(t *testing.T) {
	ws := t.TempDir()
	wstest.Mkfiles(t, ws, map[string]string{"README.md": "x\n", "sub/f": "y\n"})
	for link, target := range map[string]string{
		"d":       ".",
		"e":       "d/d/d/d/d/d/d/d/../../../../../../../..",
		"sub/up":  "../d/..",
		"sub/ok":  "../README.md",
		"abs":     "/etc/shadow",
		"sub/esc": "../../x",
	} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "out")
	set := &Set{merged: wstest.OpenPath(t, ws)}
	skipped, err := set.Export(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"e", "sub/up", "abs", "sub/esc"} {
		if _, err := os.Lstat(filepath.Join(out, p)); err == nil {
			t.Errorf("exported %s", p)
		}
		if !strings.Contains(strings.Join(skipped, "\n"), p+" (symlink to ") {
			t.Errorf("%s not named in %q", p, skipped)
		}
	}
	for _, p := range []string{"d", "sub/ok"} {
		if _, err := os.Readlink(filepath.Join(out, p)); err != nil {
			t.Errorf("%s not exported: %v", p, err)
		}
	}
	// Nothing in the export resolves outside it.
	_ = filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeSymlink != 0 {
			if r, err := filepath.EvalSymlinks(p); err == nil && r != out && !strings.HasPrefix(r, out+"/") {
				t.Errorf("%s resolves to %s", p, r)
			}
		}
		return nil
	})
}

// Export and snapshots write no setuid or setgid bit on the host.
func TestExportStripsSetID(t *testing.T) {
	ws := t.TempDir()
	wstest.Mkfiles(t, ws, map[string]string{"suid": "x", "shared/f": "y"})
	if err := os.Chmod(filepath.Join(ws, "suid"), 0o755|os.ModeSetuid|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "shared"), os.ModePerm|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := (&Set{merged: wstest.OpenPath(t, ws)}).Export(out); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"suid", "shared"} {
		fi, err := os.Lstat(filepath.Join(out, p))
		if err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s: %v %v", p, fi.Mode(), err)
		}
	}
}

// Export set each mode as the sandbox left it: a sandbox made the user's
// exported files and directories writable by every user of the host
// (0666, 0777), whatever the user's umask. Export drops group and other
// write, as a careful tool does; the rest of the mode is kept.
func TestExportDropsGroupAndOtherWrite(t *testing.T) {
	ws := t.TempDir()
	wstest.Mkfiles(t, ws, map[string]string{"open": "x", "run": "y", "private": "z", "world/f": "w", "tmp/f": "v"})
	want := map[string]os.FileMode{"open": 0o644, "run": 0o755, "private": 0o600, "world": os.ModeDir | 0o755, "tmp": os.ModeDir | os.ModeSticky | 0o755, "world/f": 0o640}
	for p, m := range map[string]os.FileMode{"open": 0o666, "run": 0o777, "private": 0o600, "world": 0o777, "tmp": 0o777 | os.ModeSticky, "world/f": 0o660} {
		if err := os.Chmod(filepath.Join(ws, p), m); err != nil {
			t.Fatal(err)
		}
	}
	old := unix.Umask(0) // the export's process may have any umask
	defer unix.Umask(old)
	out := filepath.Join(t.TempDir(), "out")
	if _, err := (&Set{merged: wstest.OpenPath(t, ws)}).Export(out); err != nil {
		t.Fatal(err)
	}
	for p, m := range want {
		fi, err := os.Lstat(filepath.Join(out, p))
		if err != nil || fi.Mode() != m {
			t.Errorf("%s: %v, want %v (%v)", p, fi.Mode(), m, err)
		}
	}
}

// The archive of a sandbox's files (cp, the archive endpoint) records no
// setuid or setgid bit either.
func TestTarStripsSetID(t *testing.T) {
	ws := t.TempDir()
	wstest.Mkfiles(t, ws, map[string]string{"suid": "x", "shared/f": "y"})
	if err := os.Chmod(filepath.Join(ws, "suid"), 0o755|os.ModeSetuid|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "shared"), os.ModePerm|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Tar(context.Background(), wstest.OpenPath(t, ws), ".", 1<<20, func([]string) io.Writer { return &buf }); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			t.Errorf("%s: mode %o", h.Name, h.Mode)
		}
	}
}

// A name the sandbox chose reaches the diff quoted: no escape sequence,
// no forged line.
func TestDiffQuotesHostileNames(t *testing.T) {
	upper := t.TempDir()
	names := []string{"erase\x1b[2K", "clip\x1b]52;c;aGk=\a", "x\n+++ b/forged"}
	for _, n := range names {
		wstest.Mkfiles(t, upper, map[string]string{n: "hi\n"})
	}
	wstest.Mkfiles(t, upper, map[string]string{"bin\x1b[31m": "\x00\x01"})
	_ = os.Symlink("t\x1b[2J", filepath.Join(upper, "link\r"))
	_ = os.Mkdir(filepath.Join(upper, "dir\x07"), 0o755)
	set, err := Changes(context.Background(), "", wstest.OpenPath(t, upper), wstest.OpenPath(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	var diff bytes.Buffer
	if err := set.WriteDiff(&diff, MaxDiffBytes); err != nil {
		t.Fatal(err)
	}
	d := diff.String()
	if strings.ContainsAny(d, "\x1b\a\r") || strings.Contains(d, "\n+++ b/forged") {
		t.Fatalf("raw bytes in the diff:\n%q", d)
	}
	for _, w := range []string{`+++ "b/x\n+++ b/forged"`, `+++ "b/erase\033[2K"`, `Binary files /dev/null and "b/bin\033[31m" differ`, `added symlink "link\r" -> "t\033[2J"`, `new directory "dir\a"`} {
		if !strings.Contains(d, w) {
			t.Errorf("diff lacks %s:\n%s", w, d)
		}
	}
}

// An export made through sudo belongs to the invoking user, its top
// directory included: before, only what is inside was chowned, and the
// user could not add, rename or remove anything at the export's top.
func TestExportBelongsToTheSudoUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	t.Setenv("SUDO_UID", "4242")
	t.Setenv("SUDO_GID", "4343")
	ws := t.TempDir()
	wstest.Mkfiles(t, ws, map[string]string{"f": "x", "d/g": "y"})
	out := filepath.Join(t.TempDir(), "out")
	if _, err := (&Set{merged: wstest.OpenPath(t, ws)}).Export(out); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "f", "d", "d/g"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(out, p), &st); err != nil || st.Uid != 4242 || st.Gid != 4343 {
			t.Errorf("%q: owner %d:%d, %v", p, st.Uid, st.Gid, err)
		}
	}
}

// A deleted lower tree of empty directories (nothing in it was listed as
// a change) was walked whole whatever the change list held. Each deleted
// directory is a change, and the walk of the lower tree stops where the
// list is full, and says so.
func TestDeletedLowerTreeStopsAtTheChangeCap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts are character devices: mknod needs root")
	}
	lower, upper := t.TempDir(), t.TempDir()
	for i := range 40 {
		for j := range 40 {
			if err := os.MkdirAll(filepath.Join(lower, "gone", "d"+strconv.Itoa(i), "e"+strconv.Itoa(j)), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := unix.Mknod(filepath.Join(upper, "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	up := wstest.OpenPath(t, upper)
	u, err := safefs.Reopen(up)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	s := &Set{ctx: context.Background(), max: 10, upper: u, merged: up, w: safefs.NewWalker(context.Background()), digests: map[string]string{}}
	if s.lower, err = os.Open(lower); err != nil {
		t.Fatal(err)
	}
	defer s.lower.Close()
	s.walk(u, s.lower, "", 0)
	if len(s.Changes) != 10 || s.Truncated == "" || s.Changes[0].Path != "gone" || s.Changes[0].Type != "dir" {
		t.Errorf("changes %v, truncated %q", s.Changes, s.Truncated)
	}
	// The walk read the names of "gone" and of one directory in it, not
	// the 1,640 directories under it.
	if s.w.NamesRead() > 3*40*24 {
		t.Errorf("the walk read %d bytes of names past a full change list", s.w.NamesRead())
	}
}
