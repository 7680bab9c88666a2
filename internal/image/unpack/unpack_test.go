package unpack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/testutil/tartest"
)

// layer is a layer of es.
func layer(t testing.TB, es ...tartest.Entry) *bytes.Buffer {
	return bytes.NewBuffer(tartest.Tar(t, es...))
}

// newUnpacker is an Unpacker into a fresh root directory (closed when the
// test ends).
func newUnpacker(t *testing.T) (*Unpacker, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("unpacking with image ownership needs root (chown)")
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	u, err := New(root, 1<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u, root
}

func unpackInto(t *testing.T, layers ...*bytes.Buffer) (string, error) {
	t.Helper()
	u, root := newUnpacker(t)
	for _, l := range layers {
		if err := u.ApplyLayer(context.Background(), l); err != nil {
			return root, err
		}
	}
	return root, nil
}

func TestUnpackLayersAndWhiteouts(t *testing.T) {
	root, err := unpackInto(t,
		layer(t,
			tartest.Entry{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
			tartest.Entry{Name: "etc/passwd", Type: tar.TypeReg, Body: "root:x:0:0::/root:/bin/sh\n"},
			tartest.Entry{Name: "usr/bin/tool", Type: tar.TypeReg, Body: "#!/bin/sh\n", Mode: 0o4755},
			tartest.Entry{Name: "home/app/file", Type: tar.TypeReg, Body: "x", UID: 1234},
			tartest.Entry{Name: "old/a", Type: tar.TypeReg, Body: "a"},
			tartest.Entry{Name: "opq/lower", Type: tar.TypeReg, Body: "l"},
			tartest.Entry{Name: "bin", Type: tar.TypeSymlink, Link: "usr/bin"},
			tartest.Entry{Name: "etc/localtime", Type: tar.TypeSymlink, Link: "/usr/share/zoneinfo/UTC"},
			tartest.Entry{Name: "usr/bin/tool2", Type: tar.TypeLink, Link: "usr/bin/tool"},
		),
		layer(t,
			tartest.Entry{Name: "old/.wh.a", Type: tar.TypeReg},
			tartest.Entry{Name: "opq/.wh..wh..opq", Type: tar.TypeReg},
			tartest.Entry{Name: "opq/upper", Type: tar.TypeReg, Body: "u"},
			tartest.Entry{Name: "./etc/passwd", Type: tar.TypeReg, Body: "root:x:0:0::/root:/bin/sh\napp:x:1234:1234::/home/app:/bin/sh\n"},
		),
	)
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, "home/app/file"), &st); err != nil || st.Uid != 1234 || st.Gid != 1234 {
		t.Errorf("ownership not kept: %+v %v", st.Uid, err)
	}
	if err := syscall.Stat(filepath.Join(root, "usr/bin/tool"), &st); err != nil || st.Mode&syscall.S_ISUID == 0 || st.Nlink != 2 {
		t.Errorf("mode/hard link not kept: mode %o nlink %d %v", st.Mode, st.Nlink, err)
	}
	for _, gone := range []string{"old/a", "opq/lower"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); err == nil {
			t.Errorf("%s survived its whiteout", gone)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "opq/upper")); string(b) != "u" {
		t.Errorf("opaque directory lost this layer's file")
	}
	if l, _ := os.Readlink(filepath.Join(root, "etc/localtime")); l != "/usr/share/zoneinfo/UTC" {
		t.Errorf("absolute symlink not kept as a link: %q", l)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/passwd")); !bytes.Contains(b, []byte("app:x:1234")) {
		t.Errorf("later layer did not replace the file")
	}
}

func TestUnpackRefusesHostileArchives(t *testing.T) {
	outside := t.TempDir()
	cases := map[string][]*bytes.Buffer{
		"path traversal":          {layer(t, tartest.Entry{Name: "../../escape", Type: tar.TypeReg, Body: "x"})},
		"traversal inside a path": {layer(t, tartest.Entry{Name: "a/../../escape", Type: tar.TypeReg, Body: "x"})},
		"write through absolute symlink": {layer(t,
			tartest.Entry{Name: "evil", Type: tar.TypeSymlink, Link: outside},
			tartest.Entry{Name: "evil/pwned", Type: tar.TypeReg, Body: "x"})},
		"write through relative symlink": {layer(t,
			tartest.Entry{Name: "evil", Type: tar.TypeSymlink, Link: "../../../../../../" + outside},
			tartest.Entry{Name: "evil/pwned", Type: tar.TypeReg, Body: "x"})},
		"symlink planted in an earlier layer": {
			layer(t, tartest.Entry{Name: "etc", Type: tar.TypeSymlink, Link: outside}),
			layer(t, tartest.Entry{Name: "etc/pwned", Type: tar.TypeReg, Body: "x"})},
		"hard link out":              {layer(t, tartest.Entry{Name: "shadow", Type: tar.TypeLink, Link: "../../../../etc/shadow"})},
		"hard link to absolute path": {layer(t, tartest.Entry{Name: "shadow", Type: tar.TypeLink, Link: "/etc/shadow"})},
		"hard link through symlink": {layer(t,
			tartest.Entry{Name: "etc", Type: tar.TypeSymlink, Link: "/etc"},
			tartest.Entry{Name: "shadow", Type: tar.TypeLink, Link: "etc/shadow"})},
		"char device":  {layer(t, tartest.Entry{Name: "dev/mem", Type: tar.TypeChar})},
		"block device": {layer(t, tartest.Entry{Name: "dev/sda", Type: tar.TypeBlock})},
		"corrupt":      {bytes.NewBufferString("this is not a tar archive, but long enough to look like a header block....................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................")},
	}
	for name, layers := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := unpackInto(t, layers...)
			if !errors.Is(err, ErrHostile) {
				t.Fatalf("err = %v, want ErrHostile", err)
			}
			if _, err := os.Lstat(filepath.Join(outside, "pwned")); err == nil {
				t.Fatal("wrote outside the root")
			}
		})
	}
}

func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "/abs", "./a/./b", "a/../b", "", ".", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := cleanName(s)
		if err != nil {
			return
		}
		if filepath.IsAbs(n) || n == ".." || len(n) >= 3 && n[:3] == "../" {
			t.Fatalf("cleanName(%q) = %q escapes", s, n)
		}
	})
}

// Empty files cost no bytes of the cache cap: a layer of millions of them
// (a few MB compressed) filled the data directory's inodes. Entries are
// counted across layers.
func TestUnpackCapsEntries(t *testing.T) {
	u, _ := newUnpacker(t)
	if u.maxEntries != MaxImageEntries {
		t.Fatalf("maxEntries %d, want %d", u.maxEntries, MaxImageEntries)
	}
	u.maxEntries = 10
	var es []tartest.Entry
	for i := 0; i < 6; i++ {
		es = append(es, tartest.Entry{Name: string(rune('a' + i)), Type: tar.TypeReg})
	}
	if err := u.ApplyLayer(context.Background(), layer(t, es...)); err != nil {
		t.Fatalf("six entries: %v", err)
	}
	if err := u.ApplyLayer(context.Background(), layer(t, es...)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("twelve entries over two layers, cap ten: %v", err)
	}
}
