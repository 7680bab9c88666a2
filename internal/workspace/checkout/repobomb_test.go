package checkout

import (
	"bytes"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func putBlob(t *testing.T, r *git.Repository, b string) plumbing.Hash {
	o := r.Storer.NewEncodedObject()
	o.SetType(plumbing.BlobObject)
	w, _ := o.Writer()
	w.Write([]byte(b))
	w.Close()
	h, err := r.Storer.SetEncodedObject(o)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func putTree(t *testing.T, r *git.Repository, es []object.TreeEntry) plumbing.Hash {
	return putObject(t, r, &object.Tree{Entries: es})
}

func putCommit(t *testing.T, r *git.Repository, tree plumbing.Hash) plumbing.Hash {
	sig := object.Signature{Name: "t", Email: "t@t", When: time.Unix(0, 0)}
	return putObject(t, r, &object.Commit{Author: sig, Committer: sig, TreeHash: tree, Message: "x"})
}

// putObject stores a tree or commit in r.
func putObject(t *testing.T, r *git.Repository, obj interface {
	Encode(plumbing.EncodedObject) error
}) plumbing.Hash {
	t.Helper()
	o := r.Storer.NewEncodedObject()
	if err := obj.Encode(o); err != nil {
		t.Fatal(err)
	}
	h, err := r.Storer.SetEncodedObject(o)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A tree naming "a" twice, first a link out and then a directory, writes
// nothing through the link.
func TestRepoDuplicateNamesWriteNothingOutside(t *testing.T) {
	target := t.TempDir()
	dir := filepath.Join(t.TempDir(), "repo")
	r, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	link := putBlob(t, r, target)
	pw := putBlob(t, r, "pwned\n")
	sub := putTree(t, r, []object.TreeEntry{{Name: "pwned", Mode: filemode.Regular, Hash: pw}})
	top := putTree(t, r, []object.TreeEntry{{Name: "a", Mode: filemode.Symlink, Hash: link}, {Name: "a", Mode: filemode.Dir, Hash: sub}})
	c := putCommit(t, r, top)
	f, _ := os.Open(dir)
	defer f.Close()
	_, cl, err := FromRepoBeneath(context.Background(), f, dir, c.String(), t.TempDir(), "x")
	if cl != nil {
		defer cl()
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a tree naming \"a\" twice: %v, want invalid", err)
	}
	ents, _ := os.ReadDir(target)
	for _, e := range ents {
		t.Errorf("written outside: %s", e.Name())
	}
}

// A "git bomb" (nine trees, each naming the next ten times: a few hundred
// bytes, 10^9 files) is refused before a file is written, in seconds; it
// used to walk and write on the host with no end, holding the create.
func TestRepoCheckoutBombCapped(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "repo")
	r, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	h := putBlob(t, r, "x")
	mode := filemode.Regular
	for lvl := 0; lvl < 9; lvl++ {
		var es []object.TreeEntry
		for i := 0; i < 10; i++ {
			es = append(es, object.TreeEntry{Name: string(rune('a' + i)), Mode: mode, Hash: h})
		}
		h = putTree(t, r, es)
		mode = filemode.Dir
	}
	c := putCommit(t, r, h)
	f, _ := os.Open(dir)
	defer f.Close()
	done := make(chan error, 1)
	tmp := t.TempDir()
	go func() {
		_, _, err := FromRepoBeneath(context.Background(), f, dir, c.String(), tmp, "x")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("a git bomb: %v, want too large", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a git bomb: still checking out after 30 s")
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("a refused checkout left %d entries", len(ents))
	}
}

// repoWithLooseBlob makes a repository whose one commit holds "big": the
// loose object hash, written as raw (zlib-compressed, as git stores it).
func repoWithLooseBlob(t *testing.T, hash string, raw []byte) (string, plumbing.Hash) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	r, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	big := plumbing.NewHash(hash)
	writeLoose(t, filepath.Join(dir, ".git", "objects"), big, raw)
	top := putTree(t, r, []object.TreeEntry{{Name: "big", Mode: filemode.Regular, Hash: big}})
	return dir, putCommit(t, r, top)
}

// A blob whose header declares more than MaxRepoBytes is refused by its
// declared size, before it is read.
func TestRepoCheckoutBytesCapped(t *testing.T) {
	var raw bytes.Buffer
	zw := zlib.NewWriter(&raw)
	fmt.Fprintf(zw, "blob %d\x00x", int64(MaxRepoBytes)+1)
	zw.Close()
	dir, c := repoWithLooseBlob(t, "00000000000000000000000000000000000000aa", raw.Bytes())
	f, _ := os.Open(dir)
	defer f.Close()
	tmp := t.TempDir()
	if _, cl, err := FromRepoBeneath(context.Background(), f, dir, c.String(), tmp, "x"); !errors.Is(err, errdefs.ErrTooLarge) {
		if cl != nil {
			cl()
		}
		t.Errorf("a blob declaring %d bytes: %v, want too large", int64(MaxRepoBytes)+1, err)
	}
}

// A loose object whose header declares 1 byte over 64 MiB of zeros (64 KB
// on disk): go-git inflated it whole into memory (over a gigabyte for
// 200 KB on disk). It is read up to its declared size and refused.
func TestRepoLyingObjectHeaderIsBounded(t *testing.T) {
	raw := lyingObject(t, "blob")
	dir, c := repoWithLooseBlob(t, "00000000000000000000000000000000000000bb", raw)
	allocs, err := checkoutAllocs(t, dir, c)
	if err == nil {
		t.Error("a lying object was checked out")
	}
	if allocs > 16<<20 {
		t.Errorf("a lying object of %d bytes on disk cost %d MiB", len(raw), allocs>>20)
	}
}

// checkoutAllocs checks out commit c of the repository at dir beneath it,
// and says how many bytes that allocated.
func checkoutAllocs(t *testing.T, dir string, c plumbing.Hash) (uint64, error) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, cl, err := FromRepoBeneath(context.Background(), f, dir, c.String(), t.TempDir(), "x")
	runtime.ReadMemStats(&after)
	if cl != nil {
		cl()
	}
	return after.TotalAlloc - before.TotalAlloc, err
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Packed repositories still check out (their objects are go-git's to read).
func TestRepoBeneathPacked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "repo")
	hash := commitRepo(t, dir)
	out, err := exec.Command("git", "-C", dir, "gc", "-q").CombinedOutput()
	if err != nil {
		t.Skipf("git gc: %v %s", err, out)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".git", "objects", "pack", "*.pack")); len(m) == 0 {
		t.Fatal("git gc made no pack")
	}
	f, _ := os.Open(dir)
	defer f.Close()
	ws, cl, err := FromRepoBeneath(context.Background(), f, dir, hash, t.TempDir(), "p")
	if err != nil {
		t.Fatal(err)
	}
	defer cl()
	if b, err := os.ReadFile(filepath.Join(ws, "README")); err != nil || string(b) != "hello\n" {
		t.Errorf("checkout: %q %v", b, err)
	}
}

// lyingObject is a loose object whose header declares a kind ("blob",
// "commit") of 1 byte over 64 MiB of zeros (64 KB on disk).
func lyingObject(t *testing.T, kind string) []byte {
	t.Helper()
	var raw bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&raw, zlib.BestSpeed)
	fmt.Fprintf(zw, "%s 1\x00", kind)
	if _, err := io.Copy(zw, io.LimitReader(zeroReader{}, 64<<20)); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	return raw.Bytes()
}

// writeLoose writes raw as the loose object h under objects.
func writeLoose(t *testing.T, objects string, h plumbing.Hash, raw []byte) {
	t.Helper()
	obj := filepath.Join(objects, h.String()[:2], h.String()[2:])
	if err := os.MkdirAll(filepath.Dir(obj), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(obj, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The same lying object in an object store the repository names in its
// alternates file (inside the repository): go-git read an alternate's
// loose objects whole, past airlock's bounded reader. A tenant's
// repository with alternates is refused, before any object is read.
func TestRepoLyingObjectInAlternatesIsBounded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "repo")
	if _, err := git.PlainInit(dir, false); err != nil {
		t.Fatal(err)
	}
	c := plumbing.NewHash("00000000000000000000000000000000000000cc")
	raw := lyingObject(t, "commit")
	writeLoose(t, filepath.Join(dir, ".git", "alt", "objects"), c, raw)
	if err := os.MkdirAll(filepath.Join(dir, ".git", "objects", "info"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".git", "objects", "info", "alternates"), []byte("alt/objects\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	allocs, err := checkoutAllocs(t, dir, c)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a repository with alternates: %v, want invalid", err)
	}
	if allocs > 16<<20 {
		t.Errorf("a lying object of %d bytes on disk in an alternate store cost %d MiB", len(raw), allocs>>20)
	}
	// An alternates file that appears after the check is never read.
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dot, err := (&beneathFS{root: f}).Chroot(".git")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"objects/info/alternates", "objects//info/../info/alternates", "/objects/info/alternates"} {
		if g, err := dot.Open(name); err == nil {
			g.Close()
			t.Errorf("%s was opened", name)
		}
	}
}

// A checkout of 100,000 files (one blob, named 1,000 times in each of 100
// directories) stops within a second of its create being cancelled (the
// kill switch, a tenant's deletion), says so, and leaves nothing: it used
// to write every file first (go-git's checkout, which took 10 s to write
// the first of 10,000 such files).
func TestRepoCheckoutStopsWhenCancelled(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "repo")
	r, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	blob := putBlob(t, r, "x\n")
	var files, dirs []object.TreeEntry
	for i := range 1000 {
		files = append(files, object.TreeEntry{Name: fmt.Sprintf("f%04d", i), Mode: filemode.Regular, Hash: blob})
	}
	sub := putTree(t, r, files)
	for i := range 100 {
		dirs = append(dirs, object.TreeEntry{Name: fmt.Sprintf("d%03d", i), Mode: filemode.Dir, Hash: sub})
	}
	c := putCommit(t, r, putTree(t, r, dirs))
	f, _ := os.Open(dir)
	defer f.Close()
	tmp := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, cl, err := FromRepoBeneath(ctx, f, dir, c.String(), tmp, "x")
		if cl != nil {
			cl()
		}
		done <- err
	}()
	// Cancel once the checkout is writing files.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(tmp, "x", "d000", "f0000")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the checkout wrote nothing in 30 s")
		}
	}
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("a cancelled checkout: %v, want context.Canceled", err)
		}
		t.Logf("stopped %v after its cancellation", time.Since(cancelled))
	case <-time.After(time.Second):
		t.Fatal("a cancelled checkout still runs a second later")
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("a cancelled checkout left %d entries", len(ents))
	}
}

// The checkout is a repository git sees as clean: files, an executable,
// a link and a subdirectory, in the index as written.
func TestRepoCheckoutIsClean(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := filepath.Join(t.TempDir(), "repo")
	r, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	sub := putTree(t, r, []object.TreeEntry{{Name: "run.sh", Mode: filemode.Executable, Hash: putBlob(t, r, "#!/bin/sh\n")}})
	top := putTree(t, r, []object.TreeEntry{
		{Name: "README", Mode: filemode.Regular, Hash: putBlob(t, r, "hello\n")},
		{Name: "bin", Mode: filemode.Dir, Hash: sub},
		{Name: "link", Mode: filemode.Symlink, Hash: putBlob(t, r, "README")},
	})
	c := putCommit(t, r, top)
	f, _ := os.Open(dir)
	defer f.Close()
	ws, cl, err := FromRepoBeneath(context.Background(), f, dir, c.String(), t.TempDir(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer cl()
	if fi, err := os.Stat(filepath.Join(ws, "bin", "run.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("bin/run.sh: %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(ws, "link")); err != nil || l != "README" {
		t.Errorf("link: %q %v", l, err)
	}
	out, err := exec.Command("git", "-C", ws, "status", "--porcelain").CombinedOutput()
	if err != nil || len(out) != 0 {
		t.Errorf("git status: %s %v", out, err)
	}
}

// Tree entries a checkout must not write are refused, and nothing is
// left.
func TestRepoCheckoutRefusesBadNames(t *testing.T) {
	for _, name := range []string{"..", ".", ".git", ".GIT", ".git. ", "git~1", "a/b"} {
		dir := filepath.Join(t.TempDir(), "repo")
		r, err := git.PlainInit(dir, false)
		if err != nil {
			t.Fatal(err)
		}
		c := putCommit(t, r, putTree(t, r, []object.TreeEntry{{Name: name, Mode: filemode.Regular, Hash: putBlob(t, r, "x")}}))
		f, _ := os.Open(dir)
		tmp := t.TempDir()
		_, cl, err := FromRepoBeneath(context.Background(), f, dir, c.String(), tmp, "x")
		f.Close()
		if cl != nil {
			cl()
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("an entry named %q: %v, want invalid", name, err)
		}
		if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
			t.Errorf("an entry named %q: left %d entries", name, len(ents))
		}
	}
}

// A name checkoutName accepts is one path component that no file system
// reads as ".git".
func FuzzCheckoutName(f *testing.F) {
	for _, s := range []string{"a", "a\\b", "..", ".git", ".Git.", "git~1", "a/b", "x\x00", "x\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, n string) {
		if !checkoutName(n) {
			return
		}
		if n == "." || n == ".." || strings.ContainsAny(n, "/\x00\n\x7f") || filepath.Base(n) != n {
			t.Fatalf("%q accepted", n)
		}
		if l := strings.ToLower(strings.TrimRight(n, ". ")); l == ".git" || l == "git~1" {
			t.Fatalf("%q accepted", n)
		}
	})
}
