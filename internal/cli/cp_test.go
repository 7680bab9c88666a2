package cli

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

type entry struct {
	name, link string
	typ        byte
	body       string
}

func tarOf(t testing.TB, es ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			_, _ = tw.Write([]byte(e.body))
		}
	}
	_ = tw.Close()
	return b.Bytes()
}

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
	_, err := extractTar(dst, bytes.NewReader(tarOf(t,
		entry{name: "d/", typ: tar.TypeDir},
		entry{name: "d/a", typ: tar.TypeReg, body: "content"},
		entry{name: "b", typ: tar.TypeLink, link: "d/a"},
	)))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(dst, "d/a"))
	b, err := os.Stat(filepath.Join(dst, "b"))
	if err != nil || !os.SameFile(a, b) {
		t.Errorf("the link was not made: %v", err)
	}
	for _, hostile := range [][]entry{
		{{name: "x", typ: tar.TypeLink, link: secret}},
		{{name: "x", typ: tar.TypeLink, link: "../../../../../../../../" + secret}},
		{{name: "l", typ: tar.TypeSymlink, link: secret}, {name: "x", typ: tar.TypeLink, link: "l"}},
		{{name: "x", typ: tar.TypeLink, link: "never-written"}},
	} {
		dst := t.TempDir()
		if _, err := extractTar(dst, bytes.NewReader(tarOf(t, hostile...))); err == nil {
			t.Errorf("%+v: no error", hostile)
		}
		if _, err := os.Lstat(filepath.Join(dst, "x")); err == nil {
			t.Errorf("%+v: x was made", hostile)
		}
	}
}

// Whatever archive cp is given, nothing appears outside its destination.
func FuzzExtractTarStaysInside(f *testing.F) {
	f.Add(tarOf(f, entry{name: "a", typ: tar.TypeReg, body: "x"}, entry{name: "b", typ: tar.TypeLink, link: "a"}))
	f.Add(tarOf(f, entry{name: "l", typ: tar.TypeSymlink, link: ".."}, entry{name: "l/x", typ: tar.TypeReg, body: "x"}))
	f.Add(tarOf(f, entry{name: "l", typ: tar.TypeSymlink, link: "/"}, entry{name: "b", typ: tar.TypeLink, link: "l"}))
	f.Add(tarOf(f, entry{name: "../x", typ: tar.TypeReg, body: "x"}, entry{name: "y", typ: tar.TypeLink, link: "../x"}))
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
