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
	_, err := extractTar(dst, bytes.NewReader(tartest.Tar(t,
		tartest.Entry{Name: "d/", Type: tar.TypeDir},
		tartest.Entry{Name: "d/a", Type: tar.TypeReg, Body: "content"},
		tartest.Entry{Name: "b", Type: tar.TypeLink, Link: "d/a"},
	)))
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
		if _, err := extractTar(dst, bytes.NewReader(tartest.Tar(t, hostile...))); err == nil {
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
		_, _ = extractTar(dst, bytes.NewReader(b))
		ents, _ := os.ReadDir(root)
		if len(ents) != 1 || ents[0].Name() != "dst" {
			t.Fatalf("written outside the destination: %v", ents)
		}
	})
}

// cp SANDBOX:/workspace/a/b DIR writes DIR/b: the daemon names a
// download's entries by their path below /workspace (a/b/...), and cp
// keeps the base name, hard links included. Before, the entry a/b/ was
// made under DIR's missing a/, and cp failed.
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
	for _, p := range []string{"/workspace/a/b", "/workspace/a/b/", "/workspace/a/b/c/f"} {
		var buf bytes.Buffer
		if err := workspace.Tar(context.Background(), root, strings.TrimPrefix(p, "/workspace"), 1<<20, func([]string) io.Writer { return &buf }); err != nil {
			t.Fatal(err)
		}
		dst := t.TempDir()
		skipped, err := extractTarFrom(dst, &buf, archiveBase(p))
		if err != nil || len(skipped) > 0 {
			t.Fatalf("%s: %v %v", p, err, skipped)
		}
		want := "b/c/f"
		if strings.HasSuffix(p, "/f") {
			want = "f"
		}
		if b, err := os.ReadFile(filepath.Join(dst, want)); err != nil || string(b) != "x" {
			t.Errorf("%s: %s: %q %v", p, want, b, err)
		}
	}
	for p, want := range map[string]string{"/workspace": "", "/workspace/out": "", "/workspace/a/b": "a", "/workspace/a/b/c/": "a/b", "/workspace/../x/y": "x"} {
		if got := archiveBase(p); got != want {
			t.Errorf("archiveBase(%q) = %q, want %q", p, got, want)
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
	if _, err := extractTar(dst, &b); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"open": os.ModeDir | 0o755, "open/f": 0o644, "open/run": 0o755, "open/private": 0o600} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, want %v (%v)", p, fi.Mode(), want, err)
		}
	}
}
