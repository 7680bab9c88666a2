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
)

type entry struct {
	name, link string
	typ        byte
	body       string
	uid        int
	mode       int64
}

func layer(t testing.TB, entries ...entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Uid: e.uid, Gid: e.uid, Size: int64(len(e.body))}
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
	return &buf
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
			entry{name: "etc/", typ: tar.TypeDir, mode: 0o755},
			entry{name: "etc/passwd", typ: tar.TypeReg, body: "root:x:0:0::/root:/bin/sh\n"},
			entry{name: "usr/bin/tool", typ: tar.TypeReg, body: "#!/bin/sh\n", mode: 0o4755},
			entry{name: "home/app/file", typ: tar.TypeReg, body: "x", uid: 1234},
			entry{name: "old/a", typ: tar.TypeReg, body: "a"},
			entry{name: "opq/lower", typ: tar.TypeReg, body: "l"},
			entry{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
			entry{name: "etc/localtime", typ: tar.TypeSymlink, link: "/usr/share/zoneinfo/UTC"},
			entry{name: "usr/bin/tool2", typ: tar.TypeLink, link: "usr/bin/tool"},
		),
		layer(t,
			entry{name: "old/.wh.a", typ: tar.TypeReg},
			entry{name: "opq/.wh..wh..opq", typ: tar.TypeReg},
			entry{name: "opq/upper", typ: tar.TypeReg, body: "u"},
			entry{name: "./etc/passwd", typ: tar.TypeReg, body: "root:x:0:0::/root:/bin/sh\napp:x:1234:1234::/home/app:/bin/sh\n"},
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
		"path traversal":          {layer(t, entry{name: "../../escape", typ: tar.TypeReg, body: "x"})},
		"traversal inside a path": {layer(t, entry{name: "a/../../escape", typ: tar.TypeReg, body: "x"})},
		"write through absolute symlink": {layer(t,
			entry{name: "evil", typ: tar.TypeSymlink, link: outside},
			entry{name: "evil/pwned", typ: tar.TypeReg, body: "x"})},
		"write through relative symlink": {layer(t,
			entry{name: "evil", typ: tar.TypeSymlink, link: "../../../../../../" + outside},
			entry{name: "evil/pwned", typ: tar.TypeReg, body: "x"})},
		"symlink planted in an earlier layer": {
			layer(t, entry{name: "etc", typ: tar.TypeSymlink, link: outside}),
			layer(t, entry{name: "etc/pwned", typ: tar.TypeReg, body: "x"})},
		"hard link out":              {layer(t, entry{name: "shadow", typ: tar.TypeLink, link: "../../../../etc/shadow"})},
		"hard link to absolute path": {layer(t, entry{name: "shadow", typ: tar.TypeLink, link: "/etc/shadow"})},
		"hard link through symlink": {layer(t,
			entry{name: "etc", typ: tar.TypeSymlink, link: "/etc"},
			entry{name: "shadow", typ: tar.TypeLink, link: "etc/shadow"})},
		"char device":  {layer(t, entry{name: "dev/mem", typ: tar.TypeChar})},
		"block device": {layer(t, entry{name: "dev/sda", typ: tar.TypeBlock})},
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
	var es []entry
	for i := 0; i < 6; i++ {
		es = append(es, entry{name: string(rune('a' + i)), typ: tar.TypeReg})
	}
	if err := u.ApplyLayer(context.Background(), layer(t, es...)); err != nil {
		t.Fatalf("six entries: %v", err)
	}
	if err := u.ApplyLayer(context.Background(), layer(t, es...)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("twelve entries over two layers, cap ten: %v", err)
	}
}
