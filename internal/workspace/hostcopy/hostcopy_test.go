package hostcopy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/workspace/internal/wstest"
	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (owners, devices)")
	}
}

// copyOf copies src into a fresh directory and returns it.
func copyOf(t *testing.T, src string, o Options) (string, Result, error) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "ws")
	res, err := Copy(context.Background(), wstest.OpenPath(t, src), dst, o)
	return dst, res, err
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestCopyIsTheTreeAsItWas(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	wstest.Mkfiles(t, src, map[string]string{"a.txt": "one\n", "d/b.txt": "two\n", "d/e/c.txt": "three\n"})
	if err := os.Chown(filepath.Join(src, "d/b.txt"), 4321, 4322); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, p := range []string{"a.txt", "d/e", "d"} {
		if err := os.Chtimes(filepath.Join(src, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Chmod(filepath.Join(src, "d/e"), 0o1750); err != nil {
		t.Fatal(err)
	}
	dst, res, err := copyOf(t, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != 5 || res.Bytes == 0 || len(res.Skipped) != 0 {
		t.Errorf("result %+v", res)
	}
	// The host changes its tree: the copy does not move.
	wstest.Mkfiles(t, src, map[string]string{"a.txt": "changed\n", "new.txt": "new\n"})
	if err := os.RemoveAll(filepath.Join(src, "d")); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"a.txt": "one\n", "d/b.txt": "two\n", "d/e/c.txt": "three\n"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "new.txt")); err == nil {
		t.Error("a file added after the copy is in it")
	}
	if st := lstat(t, filepath.Join(dst, "d/b.txt")); st.Uid != 4321 || st.Gid != 4322 {
		t.Errorf("owner %d:%d, want 4321:4322", st.Uid, st.Gid)
	}
	for _, p := range []string{"a.txt", "d", "d/e"} {
		if st := lstat(t, filepath.Join(dst, p)); time.Unix(st.Mtim.Unix()).UTC() != old {
			t.Errorf("%s: mtime %v, want %v", p, time.Unix(st.Mtim.Unix()).UTC(), old)
		}
	}
	if st := lstat(t, filepath.Join(dst, "d/e")); st.Mode&0o7777 != 0o1750 {
		t.Errorf("d/e mode %o, want 1750", st.Mode&0o7777)
	}
}

func TestCopyFollowsNoLinkOut(t *testing.T) {
	src, outside := t.TempDir(), t.TempDir()
	wstest.Mkfiles(t, outside, map[string]string{"secret": "host secret\n"})
	for name, target := range map[string]string{"abs": filepath.Join(outside, "secret"), "dir": outside, "up": "../../../../../../" + outside, "dangling": "/nonexistent"} {
		if err := os.Symlink(target, filepath.Join(src, name)); err != nil {
			t.Fatal(err)
		}
	}
	dst, _, err := copyOf(t, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"abs", "dir", "up", "dangling"} {
		if st := lstat(t, filepath.Join(dst, name)); st.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("%s is no longer a symlink (mode %o)", name, st.Mode)
		}
	}
	if ents, _ := os.ReadDir(dst); len(ents) != 4 {
		t.Errorf("copy holds %v", ents)
	}
}

// The root is reached through the caller's descriptor: a workspace
// swapped for a link after it was opened changes nothing.
func TestCopyReadsThroughTheDescriptor(t *testing.T) {
	parent, outside := t.TempDir(), t.TempDir()
	src := filepath.Join(parent, "ws")
	wstest.Mkfiles(t, src, map[string]string{"mine": "mine\n"})
	wstest.Mkfiles(t, outside, map[string]string{"secret": "host secret\n"})
	f := wstest.OpenPath(t, src)
	if err := os.Rename(src, filepath.Join(parent, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, src); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if _, err := Copy(context.Background(), f, dst, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "mine")); err != nil {
		t.Error("the copy is not of the opened directory")
	}
	if _, err := os.Lstat(filepath.Join(dst, "secret")); err == nil {
		t.Error("the copy followed the name to the link")
	}
}

func TestCopyHardLinksOnce(t *testing.T) {
	src, outside := t.TempDir(), t.TempDir()
	wstest.Mkfiles(t, src, map[string]string{"a": "shared\n", "sub/x": "x\n"})
	wstest.Mkfiles(t, outside, map[string]string{"out": "outside\n"})
	for old, new := range map[string]string{filepath.Join(src, "a"): filepath.Join(src, "sub/b"), filepath.Join(outside, "out"): filepath.Join(src, "in")} {
		if err := os.Link(old, new); err != nil {
			t.Fatal(err)
		}
	}
	dst, res, err := copyOf(t, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := lstat(t, filepath.Join(dst, "a")), lstat(t, filepath.Join(dst, "sub/b"))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("a and sub/b: inodes %d, %d, %d links; want one inode, 2 links", a.Ino, b.Ino, a.Nlink)
	}
	// A link to a file outside the tree is a file of the copy's own: the
	// host's file is never linked into it.
	in := lstat(t, filepath.Join(dst, "in"))
	if out := lstat(t, filepath.Join(outside, "out")); in.Ino == out.Ino || in.Nlink != 1 {
		t.Errorf("in shares the outside file (inode %d, %d links)", in.Ino, in.Nlink)
	}
	if res.Bytes > int64(len("shared\n")+len("x\n")+len("outside\n"))+3*4096 {
		t.Errorf("counted %d bytes: the shared file twice?", res.Bytes)
	}
}

func TestCopySkipsSpecialFilesAndSetID(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(src, "whiteout"), unix.S_IFCHR|0o666, 0); err != nil {
		t.Fatal(err)
	}
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sock)
	if err := unix.Bind(sock, &unix.SockaddrUnix{Name: filepath.Join(src, "sock")}); err != nil {
		t.Fatal(err)
	}
	wstest.Mkfiles(t, src, map[string]string{"suid": "#!/bin/sh\n", "sgid/f": "f\n"})
	if err := unix.Chmod(filepath.Join(src, "suid"), 0o6755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(src, "sgid"), 0o2775); err != nil {
		t.Fatal(err)
	}
	dst, res, err := copyOf(t, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"fifo", "null", "whiteout", "sock"} {
		if _, err := os.Lstat(filepath.Join(dst, name)); err == nil {
			t.Errorf("%s was copied", name)
		}
		if !strings.Contains(strings.Join(res.Skipped, "\n"), name+" (") {
			t.Errorf("%s not named as skipped: %q", name, res.Skipped)
		}
	}
	if st := lstat(t, filepath.Join(dst, "suid")); st.Mode&0o7777 != 0o755 {
		t.Errorf("suid copied with mode %o, want 755", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(dst, "sgid")); st.Mode&0o7777 != 0o775 {
		t.Errorf("sgid copied with mode %o, want 775", st.Mode&0o7777)
	}
}

func TestCopyKeepsHoles(t *testing.T) {
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("middle"), 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dst, res, err := copyOf(t, src, Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st := lstat(t, filepath.Join(dst, "sparse"))
	if st.Size != 1<<40 || st.Blocks > 1024 || res.Bytes > 1<<20 {
		t.Errorf("size %d, %d blocks, counted %d bytes", st.Size, st.Blocks, res.Bytes)
	}
	b := make([]byte, 6)
	g, err := os.Open(filepath.Join(dst, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.ReadAt(b, 1<<30); err != nil || string(b) != "middle" {
		t.Errorf("data at 1 GiB: %q %v", b, err)
	}
}

func TestCopyCapsFailAndLeaveNothing(t *testing.T) {
	src := t.TempDir()
	wstest.Mkfiles(t, src, map[string]string{"a": strings.Repeat("x", 100000), "b": "b", "c": "c", "d/e": "e"})
	for _, o := range []Options{{MaxEntries: 3}, {MaxBytes: 50000}} {
		dst, _, err := copyOf(t, src, o)
		if !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("%+v: err %v, want ErrTooLarge", o, err)
		}
		if _, serr := os.Lstat(dst); serr == nil {
			t.Errorf("%+v: the partial copy is left", o)
		}
	}
}

func TestCopyOfATreeTooDeepFails(t *testing.T) {
	src := t.TempDir()
	p := src
	for range safefs.MaxDepth + 2 {
		p = filepath.Join(p, "d")
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	dst, _, err := copyOf(t, src, Options{})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "deeper than") {
		t.Fatalf("err %v, want the depth named", err)
	}
	if _, serr := os.Lstat(dst); serr == nil {
		t.Error("the partial copy is left")
	}
}

func TestCopyStopsWhenCancelled(t *testing.T) {
	src := t.TempDir()
	wstest.Mkfiles(t, src, map[string]string{"a": "a", "b/c": "c"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dst := filepath.Join(t.TempDir(), "ws")
	if _, err := Copy(ctx, wstest.OpenPath(t, src), dst, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if _, err := os.Lstat(dst); err == nil {
		t.Error("the partial copy is left")
	}
}

func TestCopyReportsProgress(t *testing.T) {
	src := t.TempDir()
	files := map[string]string{}
	for i := range 12000 {
		files[fmt.Sprintf("d/%d/%d", i/1000, i)] = ""
	}
	wstest.Mkfiles(t, src, files)
	var calls []Result
	_, res, err := copyOf(t, src, Options{Progress: func(r Result) { calls = append(calls, r) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) < 2 || calls[len(calls)-1].Entries > res.Entries || calls[0].Entries >= calls[1].Entries {
		t.Errorf("progress %+v for %d entries", calls, res.Entries)
	}
}

// A tenant's file that is sparse when the copy counts it and filled as it
// is copied (the tenant writes into its holes meanwhile) must not write
// more than the copy's byte cap into the data directory: what is copied
// is what is counted.
func TestCopyOfAFileFilledWhileCopiedKeepsTheCap(t *testing.T) {
	src := t.TempDir()
	files := map[string]string{}
	for i := range 4999 { // the sparse file is the 5000th entry: progress is told just before its data is copied
		files[fmt.Sprintf("a%05d", i)] = ""
	}
	wstest.Mkfiles(t, src, files)
	const size = 16 << 20
	f, err := os.Create(filepath.Join(src, "z"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	fill := func(Result) {
		if _, err := f.WriteAt([]byte(strings.Repeat("x", size)), 0); err != nil {
			t.Error(err)
		}
	}
	dst, res, err := copyOf(t, src, Options{MaxBytes: 1 << 20, Progress: fill})
	if err == nil {
		st := lstat(t, filepath.Join(dst, "z"))
		t.Fatalf("the copy wrote %d bytes of a file counted as %d, past its cap of %d bytes", st.Blocks*512, res.Bytes, 1<<20)
	}
	if !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("err %v, want ErrTooLarge", err)
	}
	if _, serr := os.Lstat(dst); serr == nil {
		t.Error("the partial copy is left")
	}
}

// Directories and symlinks take blocks of the data directory's file
// system too (a block each, more for a big directory or a long target):
// a tree of nothing but empty directories is counted against the cap, not
// copied for free.
func TestCopyCountsTheBlocksOfDirectoriesAndLinks(t *testing.T) {
	src := t.TempDir()
	for i := range 400 {
		if err := os.Mkdir(filepath.Join(src, fmt.Sprintf("d%03d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(strings.Repeat("t", 200), filepath.Join(src, fmt.Sprintf("l%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	dst, res, err := copyOf(t, src, Options{MaxBytes: 1 << 20})
	if err == nil {
		t.Fatalf("400 directories and 400 long symlinks copied as %d bytes, within a cap of %d", res.Bytes, 1<<20)
	}
	if !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("err %v, want ErrTooLarge", err)
	}
	if _, serr := os.Lstat(dst); serr == nil {
		t.Error("the partial copy is left")
	}
}

// The data directory's reserve holds against other writers too: copies
// running side by side (several creates of one tenant's workspace at
// once) each measured the free space once, at their start, and together
// filled the file system past the reserve. Here another writer takes the
// space while the copy runs (when its progress is told).
func TestCopyKeepsTheReserveWhileOthersWrite(t *testing.T) {
	needRoot(t)
	data := t.TempDir()
	if err := unix.Mount("tmpfs", data, "tmpfs", 0, "size=64m"); err != nil {
		t.Skip("tmpfs:", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(data, unix.MNT_DETACH) })
	src := t.TempDir()
	files := map[string]string{}
	for i := range 4999 { // progress is told at the 5000th entry, before the data
		files[fmt.Sprintf("a%05d", i)] = ""
	}
	for i := range 8 {
		files[fmt.Sprintf("z%d", i)] = strings.Repeat("z", 1<<20)
	}
	wstest.Mkfiles(t, src, files)
	var fs unix.Statfs_t
	if err := unix.Statfs(data, &fs); err != nil {
		t.Fatal(err)
	}
	reserve := int64(fs.Blocks) * int64(fs.Bsize) / ReserveShare
	other := func(Result) { // another copy takes all but the reserve and 2 MiB
		var now unix.Statfs_t
		if err := unix.Statfs(data, &now); err != nil {
			t.Error(err)
			return
		}
		take := int64(now.Bavail)*int64(now.Bsize) - reserve - 2<<20
		if err := os.WriteFile(filepath.Join(data, "other"), []byte(strings.Repeat("o", int(take))), 0o600); err != nil {
			t.Error(err)
		}
	}
	dst := filepath.Join(data, "ws")
	_, err := Copy(context.Background(), wstest.OpenPath(t, src), dst, Options{Progress: other})
	if err := unix.Statfs(data, &fs); err != nil {
		t.Fatal(err)
	}
	if free := int64(fs.Bavail) * int64(fs.Bsize); free < reserve {
		t.Errorf("the copy (err %v) left %d bytes free, less than the reserve of %d", err, free, reserve)
	}
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("err %v, want ErrResourceExhausted", err)
	}
	if _, serr := os.Lstat(dst); serr == nil {
		t.Error("the partial copy is left")
	}
}
