package remote

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil/tartest"
	"github.com/airlock-sandbox/airlock/internal/workspace"
	"golang.org/x/sys/unix"
)

// A download ships a file's further hard links as link entries: cp makes
// them links to the file it wrote, and never to anything else (a host
// file, a symlink, a name the archive did not write).
func TestExtractTarHardLinks(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	_, err := extractTarAs(dst, bytes.NewReader(tartest.Tar(t,
		tartest.Entry{Name: "d/", Type: tar.TypeDir},
		tartest.Entry{Name: "d/a", Type: tar.TypeReg, Body: "content"},
		tartest.Entry{Name: "b", Type: tar.TypeLink, Link: "d/a"},
	)), "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(dst, "d/a"))
	b, err := os.Stat(filepath.Join(dst, "b"))
	if err != nil || !os.SameFile(a, b) {
		t.Errorf("the link was not made: %v", err)
	}
	for _, hostile := range [][]tartest.Entry{
		{{Name: "x", Type: tar.TypeLink, Link: secret}},
		{{Name: "x", Type: tar.TypeLink, Link: "../../../../../../../../" + secret}},
		{{Name: "l", Type: tar.TypeSymlink, Link: secret}, {Name: "x", Type: tar.TypeLink, Link: "l"}},
		{{Name: "x", Type: tar.TypeLink, Link: "never-written"}},
	} {
		dst := t.TempDir()
		if _, err := extractTarAs(dst, bytes.NewReader(tartest.Tar(t, hostile...)), "", "", false); err == nil {
			t.Errorf("%+v: no error", hostile)
		}
		if _, err := os.Lstat(filepath.Join(dst, "x")); err == nil {
			t.Errorf("%+v: x was made", hostile)
		}
	}
}

// Whatever archive cp is given, nothing appears outside its destination.
func FuzzExtractTarStaysInside(f *testing.F) {
	f.Add(tartest.Tar(f, tartest.Entry{Name: "a", Type: tar.TypeReg, Body: "x"}, tartest.Entry{Name: "b", Type: tar.TypeLink, Link: "a"}))
	f.Add(tartest.Tar(f, tartest.Entry{Name: "l", Type: tar.TypeSymlink, Link: ".."}, tartest.Entry{Name: "l/x", Type: tar.TypeReg, Body: "x"}))
	f.Add(tartest.Tar(f, tartest.Entry{Name: "l", Type: tar.TypeSymlink, Link: "/"}, tartest.Entry{Name: "b", Type: tar.TypeLink, Link: "l"}))
	f.Add(tartest.Tar(f, tartest.Entry{Name: "../x", Type: tar.TypeReg, Body: "x"}, tartest.Entry{Name: "y", Type: tar.TypeLink, Link: "../x"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		root := t.TempDir()
		dst := filepath.Join(root, "dst")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		_, _ = extractTarAs(dst, bytes.NewReader(b), "", "", false)
		ents, _ := os.ReadDir(root)
		if len(ents) != 1 || ents[0].Name() != "dst" {
			t.Fatalf("written outside the destination: %v", ents)
		}
	})
}

// cp SANDBOX:/workspace/a/b DIR writes DIR/b: the daemon names a
// download's entries by their path below /workspace (a/b/...), and cp
// keeps the base name (or DEST's, or none for SRC/.), hard links
// included, at any depth.
func TestExtractNestedDownload(t *testing.T) {
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "a/b/c"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a/b/c/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "a/b/c/f"), filepath.Join(src, "a/b/g")); err != nil {
		t.Fatal(err)
	}
	root, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, c := range []struct {
		p, as string
		dir   bool
		want  string
	}{
		{"/workspace/a/b", "b", true, "b/c/f"},
		{"/workspace/a/b/", "new", true, "new/c/f"},
		{"/workspace/a/b", "", true, "c/f"},
		{"/workspace/a/b/c/f", "f", false, "f"},
		{"/workspace/a/b/c/f", "renamed", false, "renamed"},
		{"/workspace", "ws", true, "ws/a/b/c/f"},
	} {
		var buf bytes.Buffer
		if err := workspace.Tar(context.Background(), root, strings.TrimPrefix(c.p, "/workspace"), 1<<20, func([]string) io.Writer { return &buf }); err != nil {
			t.Fatal(err)
		}
		dst := t.TempDir()
		rel, ok := workspaceRel(c.p)
		if !ok {
			t.Fatalf("%s: not in /workspace", c.p)
		}
		skipped, err := extractTarAs(dst, &buf, rel, c.as, c.dir)
		if err != nil || len(skipped) > 0 {
			t.Fatalf("%s as %q: %v %v", c.p, c.as, err, skipped)
		}
		if b, err := os.ReadFile(filepath.Join(dst, c.want)); err != nil || string(b) != "x" {
			t.Errorf("%s as %q: %s: %q %v", c.p, c.as, c.want, b, err)
		}
	}
	for p, want := range map[string]string{"/workspace": "", "/workspace/out": "out", "/workspace/a/b/": "a/b", "/workspace/../workspace/x": "x"} {
		if got, ok := workspaceRel(p); got != want || !ok {
			t.Errorf("workspaceRel(%q) = %q %v, want %q", p, got, ok, want)
		}
	}
	for _, p := range []string{"/etc/hostname", "/workspaces/x", "/"} {
		if _, ok := workspaceRel(p); ok {
			t.Errorf("workspaceRel(%q): in /workspace", p)
		}
	}
}

// Where cp puts a copy follows docker cp's table, one row per case.
func TestPlaceForFollowsDockerCp(t *testing.T) {
	for _, c := range []struct {
		row               string
		srcDir, contents  bool
		dest, kind        string
		wantDir, wantName string
		wantErr           bool
	}{
		{"file -> existing dir", false, false, "/w/d", "dir", "/w/d", "src", false},
		{"file -> existing file", false, false, "/w/f", "file", "/w", "f", false},
		{"file -> new name", false, false, "/w/new", "", "/w", "new", false},
		{"file -> missing dir/", false, false, "/w/new/", "", "", "", true},
		{"dir -> existing dir", true, false, "/w/d", "dir", "/w/d", "src", false},
		{"dir -> new dir", true, false, "/w/new", "", "/w", "new", false},
		{"dir -> new dir/", true, false, "/w/new/", "", "/w", "new", false},
		{"dir -> existing file", true, false, "/w/f", "file", "", "", true},
		{"dir/. -> existing dir", true, true, "/w/d", "dir", "/w/d", "", false},
		{"dir/. -> new dir", true, true, "/w/new", "", "/w", "new", false},
		{"relative new name", false, false, "new", "", ".", "new", false},
	} {
		dir, name, err := placeFor("src", c.srcDir, c.contents, c.dest, c.kind)
		if (err != nil) != c.wantErr || dir != c.wantDir || name != c.wantName {
			t.Errorf("%s: %q %q %v, want %q %q (error %v)", c.row, dir, name, err, c.wantDir, c.wantName, c.wantErr)
		}
	}
	for _, c := range []struct {
		in, want string
		contents bool
	}{{"d/.", "d", true}, {"/a/d/.", "/a/d", true}, {".", ".", true}, {"/.", "/", true}, {"d", "d", false}, {"d/", "d/", false}, {"./d", "./d", false}} {
		if got, contents := contentsOf(c.in); got != c.want || contents != c.contents {
			t.Errorf("contentsOf(%q) = %q %v", c.in, got, contents)
		}
	}
}

// tarLocal names a directory's entries under the name it is given, or
// without one for its contents (no entry for itself).
func TestTarLocalNames(t *testing.T) {
	src := t.TempDir()
	_ = os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	_ = os.WriteFile(filepath.Join(src, "sub", "f"), []byte("x"), 0o644)
	for as, want := range map[string]string{"as": "as/ as/sub/ as/sub/f", "": "sub/ sub/f"} {
		var b bytes.Buffer
		if _, err := tarLocal(src, as, &b); err != nil {
			t.Fatal(err)
		}
		var names []string
		tr := tar.NewReader(&b)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			names = append(names, h.Name)
		}
		if got := strings.Join(names, " "); got != want {
			t.Errorf("as %q: %s, want %s", as, got, want)
		}
	}
}

// cp wrote the modes a sandbox chose, up to the user's umask: with umask
// 0 (or 002) a sandbox's 0666 file and 0777 directory were writable by
// every user of the host. cp drops group and other write itself.
func TestExtractTarDropsGroupAndOtherWrite(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range []*tar.Header{
		{Name: "open/", Typeflag: tar.TypeDir, Mode: 0o777},
		{Name: "open/f", Typeflag: tar.TypeReg, Mode: 0o666},
		{Name: "open/run", Typeflag: tar.TypeReg, Mode: 0o777},
		{Name: "open/private", Typeflag: tar.TypeReg, Mode: 0o600},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	_ = tw.Close()
	old := unix.Umask(0)
	defer unix.Umask(old)
	dst := t.TempDir()
	if _, err := extractTarAs(dst, &b, "", "", false); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"open": os.ModeDir | 0o755, "open/f": 0o644, "open/run": 0o755, "open/private": 0o600} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, want %v (%v)", p, fi.Mode(), want, err)
		}
	}
}
