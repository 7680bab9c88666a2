package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/workspace/internal/wstest"
)

// buildTree makes a tree from ops, two bytes each: an op and an argument.
// Directories, files of up to 255 bytes, hard links to a file made earlier,
// symlinks, moving down into a directory made earlier or back up. It
// writes nothing outside root: a name taken (by a symlink out of the tree,
// say) is left alone.
func buildTree(t *testing.T, root string, ops []byte) {
	cwd := root
	var files, dirs []string
	for i := 0; i+1 < len(ops) && i < 400; i += 2 {
		op, arg := ops[i]%6, int(ops[i+1])
		name := filepath.Join(cwd, string(rune('a'+arg%26))+strings.Repeat("n", arg%7))
		switch op {
		case 0:
			if os.Mkdir(name, 0o755) == nil {
				dirs = append(dirs, name)
			}
		case 1:
			// A new file only: the tree's own symlinks point out of it
			// (../x), and a write through one landed on the host.
			if f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
				_, werr := f.Write(bytes.Repeat([]byte{byte(arg)}, arg))
				if f.Close() == nil && werr == nil {
					files = append(files, name)
				}
			}
		case 2:
			if len(files) > 0 && os.Link(files[arg%len(files)], name) == nil {
				files = append(files, name)
			}
		case 3:
			_ = os.Symlink(strings.Repeat("../", arg%4)+"x", name)
		case 4:
			if len(dirs) > 0 {
				cwd = dirs[arg%len(dirs)]
			}
		case 5:
			cwd = root
		}
	}
}

// The walk against a plain reading of the same tree: every entry is in
// the change set (nothing hidden), each file's content is counted once
// however many links it has, and the archive carries each inode's bytes
// once and unpacks to the same tree.
func FuzzWalkReadsEachFileOnce(f *testing.F) {
	f.Add([]byte{1, 40, 2, 0, 2, 0, 0, 3, 4, 0, 1, 200, 2, 1, 5, 0, 3, 2})
	f.Add([]byte{0, 1, 4, 0, 0, 2, 4, 1, 1, 9, 2, 0, 5, 0, 2, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		root := t.TempDir()
		buildTree(t, root, ops)
		want := map[string]bool{}
		inodes := map[uint64]int64{}
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || p == root {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			want[rel] = true
			if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
				inodes[fi.Sys().(*syscall.Stat_t).Ino] = fi.Size()
			}
			return nil
		})
		var unique int64
		for _, n := range inodes {
			unique += n
		}
		set, err := Changes(context.Background(), "", wstest.OpenPath(t, root), wstest.OpenPath(t, root))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range set.Changes {
			delete(want, c.Path)
			set.Digest(c)
		}
		if len(want) != 0 || len(set.Unread) != 0 {
			t.Fatalf("not in the change set: %v (unread %v)", want, set.Unread)
		}
		if set.hashed != unique {
			t.Fatalf("digests read %d bytes, the files hold %d", set.hashed, unique)
		}
		var tb bytes.Buffer
		if err := Tar(context.Background(), wstest.OpenPath(t, root), "", 1<<20, func([]string) io.Writer { return &tb }); err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(&tb)
		var content int64
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			content += h.Size
		}
		if content != unique {
			t.Fatalf("the archive carries %d bytes of content, the files hold %d", content, unique)
		}
	})
}
