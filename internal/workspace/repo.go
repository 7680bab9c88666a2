package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/go-git/go-billy/v5"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/objfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// FromRepo builds a workspace directory holding the tree of one commit of
// the host repository repo, and a fresh .git with only that commit's
// objects (a shallow clone of depth one, HEAD detached at it). It reads the
// repository's objects in Go (go-git): no git process runs, so no hook,
// filter, fsmonitor or other command named in the repository's config can
// execute, and nothing of that config (remotes, credential helpers, URLs
// with tokens) is copied. The directory is dir/<id>; cleanup removes it.
// The checkout stops when ctx ends, removes what it wrote and returns
// ctx's error.
func FromRepo(ctx context.Context, repo, rev, dir, id string) (string, func(), error) {
	src, err := git.PlainOpenWithOptions(repo, &git.PlainOpenOptions{DetectDotGit: false, EnableDotGitCommonDir: false})
	if err != nil {
		return "", nil, errdefs.Invalid(fmt.Sprintf("--repo %s: not a git repository: %v", repo, err))
	}
	return fromRepo(ctx, src, repo, rev, dir, id)
}

// FromRepoBeneath is FromRepo for a repository a tenant chose, open as
// root: its files are read beneath that descriptor only (beneathFS), and
// errors name no host file. A repository that borrows objects from
// another store (objects/info/alternates) is refused: the loose objects
// of an alternate store would be go-git's to read, whole, past
// boundedStorage; beneathFS never opens an alternates file, so one
// written after this check is not read either.
func FromRepoBeneath(ctx context.Context, root *os.File, name, rev, dir, id string) (string, func(), error) {
	dot, err := (&beneathFS{root: root}).Chroot(".git")
	if err != nil {
		return "", nil, err
	}
	if _, err := dot.Lstat(alternatesFile); err == nil {
		return "", nil, errdefs.Invalid(fmt.Sprintf("--repo %s: the repository borrows objects from another store (.git/%s), which airlock does not read for a tenant: run `git repack -a -d` in it and remove that file", name, alternatesFile))
	}
	st := filesystem.NewStorageWithOptions(dot, cache.NewObjectLRUDefault(), filesystem.Options{AlternatesFS: dot})
	src, err := git.Open(&boundedStorage{Storage: st, dot: dot}, nil)
	if err != nil {
		return "", nil, errdefs.Invalid(fmt.Sprintf("--repo %s: not a git repository with a .git directory", name))
	}
	return fromRepo(ctx, src, name, rev, dir, id)
}

func fromRepo(ctx context.Context, src *git.Repository, repo, rev, dir, id string) (string, func(), error) {
	h, err := src.ResolveRevision(plumbing.Revision(rev))
	if err != nil {
		return "", nil, errdefs.Invalid(fmt.Sprintf("--commit %s: %v", rev, err))
	}
	commit, err := src.CommitObject(*h)
	if err != nil {
		return "", nil, errdefs.Invalid(fmt.Sprintf("--commit %s: %v", rev, err))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	ws := filepath.Join(dir, id)
	if err := os.Mkdir(ws, 0o755); err != nil {
		return "", nil, err
	}
	cleanup := func() { _ = os.RemoveAll(ws) }
	if err := checkout(ctx, src, commit, ws); err != nil {
		cleanup()
		if cerr := ctx.Err(); cerr != nil {
			return "", nil, fmt.Errorf("--repo %s --commit %s: checkout stopped: %w", repo, rev, cerr)
		}
		return "", nil, fmt.Errorf("--repo %s --commit %s: %w", repo, rev, err)
	}
	return ws, cleanup, nil
}

// MaxRepoEntries and MaxRepoBytes cap what one checkout writes on the host:
// paths (each tree entry counts every time a tree is reached, as checkout
// writes it every time: a "git bomb" of ten trees naming one tree ten times
// is a few hundred bytes and 10^9 files) and bytes of file content (as the
// objects declare them).
const (
	MaxRepoEntries = 1 << 20
	MaxRepoBytes   = 8 << 30
	// MaxRepoObject caps one object: go-git holds each in memory whole.
	MaxRepoObject = 512 << 20
)

// boundedStorage reads a tenant's loose objects itself: go-git inflates a
// loose object into memory until its zlib stream ends, whatever size its
// header declares, so "blob 1" over 200 MB of zeros (200 KB on disk) cost
// the daemon over a gigabyte. Here an object is read up to its declared
// size (at most MaxRepoObject) and refused when its content is longer or
// shorter. Packed objects are go-git's.
type boundedStorage struct {
	*filesystem.Storage
	dot billy.Filesystem
}

func (b *boundedStorage) EncodedObject(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	hex := h.String()
	f, err := b.dot.Open(path.Join("objects", hex[:2], hex[2:]))
	if err != nil {
		return b.Storage.EncodedObject(t, h)
	}
	defer f.Close()
	r, err := objfile.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", hex, err)
	}
	defer r.Close()
	typ, size, err := r.Header()
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", hex, err)
	}
	if size < 0 || size > MaxRepoObject {
		return nil, fmt.Errorf("%w: object %s declares %d bytes (at most %d)", errdefs.ErrTooLarge, hex, size, MaxRepoObject)
	}
	if t != plumbing.AnyObject && t != typ {
		return nil, plumbing.ErrObjectNotFound
	}
	o := &plumbing.MemoryObject{}
	o.SetType(typ)
	o.SetSize(size)
	w, err := o.Writer()
	if err != nil {
		return nil, err
	}
	n, err := io.Copy(w, io.LimitReader(r, size+1))
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", hex, err)
	}
	if n != size {
		return nil, fmt.Errorf("%w: object %s is not the size its header declares", errdefs.ErrInvalidArgument, hex)
	}
	if r.Hash() != h {
		return nil, fmt.Errorf("%w: object %s is not the object its name says", errdefs.ErrInvalidArgument, hex)
	}
	return o, nil
}

func (b *boundedStorage) EncodedObjectSize(h plumbing.Hash) (int64, error) {
	hex := h.String()
	f, err := b.dot.Open(path.Join("objects", hex[:2], hex[2:]))
	if err != nil {
		return b.Storage.EncodedObjectSize(h)
	}
	defer f.Close()
	r, err := objfile.NewReader(f)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	_, size, err := r.Header()
	return size, err
}

// measure walks tree and refuses it before anything is written when its
// checkout would pass MaxRepoEntries or MaxRepoBytes, or stops when ctx
// ends.
func measure(ctx context.Context, src *git.Repository, tree *object.Tree) error {
	var entries, bytes int64
	sizes := map[plumbing.Hash]int64{}
	w := object.NewTreeWalker(tree, true, nil)
	defer w.Close()
	for {
		_, e, err := w.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if entries++; entries > MaxRepoEntries {
			return fmt.Errorf("%w: the commit's tree has more than %d entries (a checkout is capped)", errdefs.ErrTooLarge, MaxRepoEntries)
		}
		if !e.Mode.IsFile() {
			continue
		}
		n, ok := sizes[e.Hash]
		if !ok {
			if n, err = src.Storer.EncodedObjectSize(e.Hash); err != nil {
				return err
			}
			sizes[e.Hash] = n
		}
		if n > MaxRepoObject {
			return fmt.Errorf("%w: a file of the commit declares %d bytes (at most %d)", errdefs.ErrTooLarge, n, MaxRepoObject)
		}
		if bytes += n; n < 0 || bytes > MaxRepoBytes {
			return fmt.Errorf("%w: the commit's files hold more than %d bytes (a checkout is capped)", errdefs.ErrTooLarge, MaxRepoBytes)
		}
	}
}

// checkout writes commit's tree and objects into ws, checking ctx before
// each object it copies and each file, directory or link it writes.
func checkout(ctx context.Context, src *git.Repository, commit *object.Commit, ws string) error {
	tree, err := commit.Tree()
	if err != nil {
		return err
	}
	if err := measure(ctx, src, tree); err != nil {
		return err
	}
	dst, err := git.PlainInit(ws, false)
	if err != nil {
		return err
	}
	// Copy exactly the objects of this commit: itself, its trees, its
	// blobs, each once.
	copied := map[plumbing.Hash]bool{}
	copyObj := func(h plumbing.Hash) error {
		if err := ctx.Err(); err != nil || copied[h] {
			return err
		}
		copied[h] = true
		o, err := src.Storer.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return err
		}
		_, err = dst.Storer.SetEncodedObject(o)
		return err
	}
	if err := copyObj(commit.Hash); err != nil {
		return err
	}
	if err := copyObj(tree.Hash); err != nil {
		return err
	}
	walker := object.NewTreeWalker(tree, true, nil)
	defer walker.Close()
	for {
		_, entry, err := walker.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if entry.Mode.IsFile() || entry.Mode == filemode.Dir {
			if err := copyObj(entry.Hash); err != nil {
				return err
			}
		}
	}
	if err := dst.Storer.SetShallow([]plumbing.Hash{commit.Hash}); err != nil {
		return err
	}
	if err := dst.Storer.SetReference(plumbing.NewHashReference(plumbing.HEAD, commit.Hash)); err != nil {
		return err
	}
	wt, err := dst.Worktree()
	if err != nil {
		return err
	}
	// go-git's checkout takes no context: its worktree refuses to write
	// once ctx ends (outside go-git's own path checks).
	wt.Filesystem = ctxFS{wt.Filesystem, ctx}
	if err := wt.Checkout(&git.CheckoutOptions{Hash: commit.Hash, Force: true}); err != nil {
		return err
	}
	// Leave the sandbox a repository it can work in: a plain detached HEAD,
	// no remotes, no config beyond go-git's defaults.
	return os.WriteFile(filepath.Join(ws, ".git", "description"), []byte("airlock workspace at "+commit.Hash.String()+"\n"), 0o644)
}

// ctxFS is a worktree filesystem whose writes fail once ctx ends.
type ctxFS struct {
	billy.Filesystem
	ctx context.Context
}

func (fs ctxFS) OpenFile(name string, flag int, perm os.FileMode) (billy.File, error) {
	if err := fs.ctx.Err(); err != nil {
		return nil, err
	}
	f, err := fs.Filesystem.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return ctxFile{f, fs.ctx}, nil
}

func (fs ctxFS) Create(name string) (billy.File, error) {
	return fs.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

func (fs ctxFS) MkdirAll(name string, perm os.FileMode) error {
	if err := fs.ctx.Err(); err != nil {
		return err
	}
	return fs.Filesystem.MkdirAll(name, perm)
}

func (fs ctxFS) Symlink(target, link string) error {
	if err := fs.ctx.Err(); err != nil {
		return err
	}
	return fs.Filesystem.Symlink(target, link)
}

// ctxFile is a file whose writes fail once ctx ends (a file is at most
// MaxRepoObject bytes).
type ctxFile struct {
	billy.File
	ctx context.Context
}

func (f ctxFile) Write(p []byte) (int, error) {
	if err := f.ctx.Err(); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

// GCRepos removes workspace checkouts under dir whose sandbox is no longer
// alive (live reports whether a sandbox id holds its lock).
func GCRepos(dir string, live func(id string) bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || strings.ContainsAny(e.Name(), "./") || live(e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
