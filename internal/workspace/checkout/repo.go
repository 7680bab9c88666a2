// Package checkout builds a sandbox's /workspace from a git commit of a
// host repository: objects only, read in Go (go-git), so no hook, filter
// or config of the repository runs or is copied; the checkout is capped in
// entries, bytes and object size, refuses names git would refuse, and a
// tenant's repository is read beneath the tenant's root (beneathFS).
//
// It imports go-git, internal/workspace/safefs, internal/errdefs and x/sys.
package checkout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-billy/v5"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"github.com/go-git/go-git/v5/plumbing/format/objfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
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
		if errors.Is(err, errdefs.ErrTooLarge) {
			return err
		}
		if err != nil { // a malformed tree, a missing object, a name no checkout writes
			return fmt.Errorf("%w: the commit's tree: %v", errdefs.ErrInvalidArgument, err)
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
	// go-git's worktree checkout takes no context, and looks every path
	// up from the top tree again, decoding each tree on the way (a
	// directory of n files cost n decodes of n entries before the first
	// file was written): the tree is written here in one pass.
	idx := &index.Index{Version: 2}
	top, err := os.OpenFile(ws, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = writeTree(ctx, dst.Storer, top, "", tree, idx)
	top.Close()
	if err != nil {
		return err
	}
	sort.Slice(idx.Entries, func(i, j int) bool { return idx.Entries[i].Name < idx.Entries[j].Name })
	if err := dst.Storer.SetIndex(idx); err != nil {
		return err
	}
	// Leave the sandbox a repository it can work in: a plain detached HEAD,
	// no remotes, no config beyond go-git's defaults.
	return os.WriteFile(filepath.Join(ws, ".git", "description"), []byte("airlock workspace at "+commit.Hash.String()+"\n"), 0o644)
}

// checkoutName reports whether a checkout writes a tree entry of this
// name: one path component without control characters, not "." or "..",
// and not a name that is, or that another file system reads as, ".git"
// (any case, trailing dots or spaces, the 8.3 short name). go-git's tree
// walker (measure) refuses these in whole paths too.
func checkoutName(n string) bool {
	if n == "" || n == "." || n == ".." || strings.ContainsRune(n, '/') || strings.ContainsFunc(n, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return false
	}
	l := strings.ToLower(strings.TrimRight(n, ". "))
	return l != ".git" && l != "git~1"
}

// writeTree writes tree t into directory d (at prefix: "" at the top, else
// a path ending in "/"), checking ctx before each entry and each write,
// and adds each file, link and submodule to idx. Each entry is created
// anew beside its parent's descriptor, following no link: a tree naming
// one name twice (a link, then a directory through it) is refused.
func writeTree(ctx context.Context, s storer.EncodedObjectStorer, d *os.File, prefix string, t *object.Tree, idx *index.Index) error {
	for _, e := range t.Entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := prefix + e.Name
		if !checkoutName(e.Name) {
			return fmt.Errorf("%w: the commit names %q, which a checkout does not write", errdefs.ErrInvalidArgument, p)
		}
		var err error
		switch e.Mode {
		case filemode.Dir:
			err = writeDir(ctx, s, d, p, e, idx)
		case filemode.Regular, filemode.Deprecated, filemode.Executable:
			err = writeFile(ctx, s, d, p, e, idx)
		case filemode.Symlink:
			err = writeLink(s, d, p, e, idx)
		case filemode.Submodule: // git leaves an empty directory
			if err = unix.Mkdirat(int(d.Fd()), e.Name, 0o755); err != nil {
				err = created("mkdirat", p, err)
			} else {
				err = addEntry(idx, d, p, e)
			}
		default:
			err = fmt.Errorf("%w: %q has mode %o", errdefs.ErrInvalidArgument, p, uint32(e.Mode))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func writeDir(ctx context.Context, s storer.EncodedObjectStorer, d *os.File, p string, e object.TreeEntry, idx *index.Index) error {
	if err := unix.Mkdirat(int(d.Fd()), e.Name, 0o755); err != nil {
		return created("mkdirat", p, err)
	}
	sub, err := safefs.OpenIn(d, e.Name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer sub.Close()
	t, err := object.GetTree(s, e.Hash)
	if err != nil {
		return err
	}
	return writeTree(ctx, s, sub, p+"/", t, idx)
}

func writeFile(ctx context.Context, s storer.EncodedObjectStorer, d *os.File, p string, e object.TreeEntry, idx *index.Index) error {
	perm := uint32(0o644)
	if e.Mode == filemode.Executable {
		perm = 0o755
	}
	fd, err := unix.Openat(int(d.Fd()), e.Name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return created("openat", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	b, err := object.GetBlob(s, e.Hash)
	if err != nil {
		return err
	}
	r, err := b.Reader()
	if err != nil {
		return err
	}
	defer r.Close()
	if _, err := io.Copy(ctxWriter{f, ctx}, r); err != nil {
		return err
	}
	return addEntry(idx, d, p, e)
}

func writeLink(s storer.EncodedObjectStorer, d *os.File, p string, e object.TreeEntry, idx *index.Index) error {
	b, err := object.GetBlob(s, e.Hash)
	if err != nil {
		return err
	}
	if b.Size >= unix.PathMax {
		return fmt.Errorf("%w: the link %q is %d bytes long", errdefs.ErrInvalidArgument, p, b.Size)
	}
	r, err := b.Reader()
	if err != nil {
		return err
	}
	defer r.Close()
	target, err := io.ReadAll(io.LimitReader(r, unix.PathMax))
	if err != nil {
		return err
	}
	if err := unix.Symlinkat(string(target), int(d.Fd()), e.Name); err != nil {
		return created("symlinkat", p, err)
	}
	return addEntry(idx, d, p, e)
}

// created is the error of creating p with syscall op: a name the tree
// holds twice is the tree's fault.
func created(op, p string, err error) error {
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%w: the commit names %q twice", errdefs.ErrInvalidArgument, p)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// addEntry adds entry e, written at p in d, to idx with what it was
// written as.
func addEntry(idx *index.Index, d *os.File, p string, e object.TreeEntry) error {
	var st unix.Stat_t
	if err := unix.Fstatat(int(d.Fd()), e.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("fstatat %s: %w", p, err)
	}
	idx.Entries = append(idx.Entries, &index.Entry{
		Name: p, Hash: e.Hash, Mode: e.Mode,
		CreatedAt:  time.Unix(st.Ctim.Unix()),
		ModifiedAt: time.Unix(st.Mtim.Unix()),
		Dev:        uint32(st.Dev), Inode: uint32(st.Ino),
		UID: st.Uid, GID: st.Gid, Size: uint32(st.Size),
	})
	return nil
}

// ctxWriter is a writer that fails once ctx ends (a file is at most
// MaxRepoObject bytes).
type ctxWriter struct {
	w   io.Writer
	ctx context.Context
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// GCRepos removes the private workspace trees under dir (checkouts, and
// the lifecycle's copies of --workspace directories) whose sandbox is no
// longer alive (live reports whether a sandbox id holds its lock).
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
