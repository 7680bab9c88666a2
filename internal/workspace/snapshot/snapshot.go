// Package snapshot writes a sandbox's filesystem state (its root's
// writable layer over a hard-link farm of its image, and its /workspace)
// into directories an image can be made of (Writer, LinkTree), counting
// the bytes it writes and stopping where its context ends.
//
// It imports internal/workspace/safefs and x/sys.
package snapshot

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
)

// A snapshot materializes a sandbox's filesystem state as directories an
// image can be made of. What the sandbox wrote is read from the host by the
// safe-access rules (openat2 confined to the layer, no symlink or
// magic-link followed, regular files, directories and symlinks only), and
// every write into the destination resolves inside it without following
// any symlink, so no name or link the sandbox made can reach elsewhere.
// Nothing a snapshot writes is setuid or setgid (safefs.HostMode): the files
// belong to host uids (uid 0 inside is root on the host).

// Writer writes a tree under a destination directory the caller made.
type Writer struct {
	root  *os.File
	hash  hash.Hash // content digest of what was written, in walk order
	max   int64     // bytes of file content at most
	total int64
	count func(int64)       // told of each piece of file content written (nil: nobody)
	links safefs.Links      // a source file's first path, when it has several links
	inode map[string]uint64 // the inode written for such a first path
}

// NewWriter writes under the directory dst (which must exist), digesting
// what it writes into h; count, when not nil, is told of the bytes of file
// content as they are written (the copy's progress).
func NewWriter(dst string, h hash.Hash, maxBytes int64, count func(int64)) (*Writer, error) {
	f, err := os.Open(dst)
	if err != nil {
		return nil, err
	}
	return &Writer{root: f, hash: h, max: maxBytes, count: count, links: safefs.Links{}, inode: map[string]uint64{}}, nil
}

// Written is the bytes of file content written so far.
func (w *Writer) Written() int64 { return w.total }

// Close releases the destination.
func (w *Writer) Close() error { return w.root.Close() }

const inDst = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// parent opens rel's parent directory inside the destination.
func (w *Writer) parent(rel string) (int, string, error) {
	dir, name := path.Split(rel)
	if dir == "" {
		dir = "."
	}
	fd, err := unix.Openat2(int(w.root.Fd()), dir, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: inDst})
	return fd, name, err
}

func (w *Writer) record(kind byte, rel string, mode, uid, gid uint32, extra string) {
	var b [13]byte
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:], mode)
	binary.BigEndian.PutUint32(b[5:], uid)
	binary.BigEndian.PutUint32(b[9:], gid)
	w.hash.Write(b[:])
	fmt.Fprintf(w.hash, "%s\x00%s\x00", rel, extra)
}

// remove deletes rel (a file, link or whole tree) inside the destination.
func (w *Writer) remove(rel string) error {
	pfd, name, err := w.parent(rel)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return removeAt(pfd, name)
}

func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			d.Close()
			return err
		}
	}
	d.Close()
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// dir makes (or keeps) directory rel with mode and owner.
func (w *Writer) dir(rel string, mode, uid, gid uint32) error {
	w.record('d', rel, mode, uid, gid, "")
	if rel == "." {
		return w.own(".", mode, uid, gid, false)
	}
	pfd, name, err := w.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := removeAt(pfd, name); err != nil {
			return err
		}
	}
	if err := unix.Mkdirat(pfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return w.ownAt(pfd, name, mode, uid, gid, false)
}

func (w *Writer) own(rel string, mode, uid, gid uint32, link bool) error {
	pfd, name, err := w.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if rel == "." {
		name = "."
	}
	return w.ownAt(pfd, name, mode, uid, gid, link)
}

func (w *Writer) ownAt(pfd int, name string, mode, uid, gid uint32, link bool) error {
	if err := unix.Fchownat(pfd, name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if link {
		return nil
	}
	return unix.Fchmodat(pfd, name, mode&0o7777, 0)
}

// file writes regular file rel from src (size bytes), stopping where ctx
// ends.
func (w *Writer) file(ctx context.Context, rel string, src *os.File, size int64, mode, uid, gid uint32) error {
	if w.total += size; w.total > w.max {
		return fmt.Errorf("%w: more than %d bytes", safefs.ErrTooLarge, w.max)
	}
	pfd, name, err := w.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, name); err != nil { // a hardlink to the base, or anything else
		return err
	}
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(fd), rel)
	defer out.Close()
	w.record('f', rel, mode, uid, gid, fmt.Sprint(size))
	dst := &counted{ctx: ctx, w: io.MultiWriter(out, w.hash), count: w.count}
	if _, err := io.Copy(dst, io.LimitReader(src, size)); err != nil {
		return err
	}
	return w.ownAt(pfd, name, mode, uid, gid, false)
}

// counted is where a file's content goes: it counts each piece written,
// and takes none once ctx has ended.
type counted struct {
	ctx   context.Context
	w     io.Writer
	count func(int64)
}

func (c *counted) Write(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.w.Write(b)
	if c.count != nil && n > 0 {
		c.count(int64(n))
	}
	return n, err
}

// link makes rel a further hard link of first, a file this writer wrote
// (a source file with several links is written once). It reports false,
// having written nothing, when first is no longer that file.
func (w *Writer) link(rel, first string) (bool, error) {
	ino, ok := w.inode[first]
	if !ok {
		return false, nil
	}
	tfd, tname, err := w.parent(first)
	if err != nil {
		return false, nil
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if unix.Fstatat(tfd, tname, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Ino != ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, nil
	}
	pfd, name, err := w.parent(rel)
	if err != nil {
		return false, err
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, name); err != nil {
		return false, err
	}
	w.record('h', rel, 0, 0, 0, first)
	return true, unix.Linkat(tfd, tname, pfd, name, 0)
}

// remember notes the inode written at rel, the first path of a source
// file with several links.
func (w *Writer) remember(rel string) {
	pfd, name, err := w.parent(rel)
	if err != nil {
		return
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		w.inode[rel] = st.Ino
	}
}

// symlink makes rel a symlink to target (never followed here).
func (w *Writer) symlink(rel, target string, uid, gid uint32) error {
	w.record('l', rel, 0, uid, gid, target)
	pfd, name, err := w.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, name); err != nil {
		return err
	}
	if err := unix.Symlinkat(target, pfd, name); err != nil {
		return err
	}
	return w.ownAt(pfd, name, 0, uid, gid, true)
}

// Owner maps a file's owner as read from the sandbox to the owner it gets
// in the destination.
type Owner func(uid, gid uint32) (uint32, uint32)

// ApplyUpper applies an overlay upper layer (a sandbox's writable layer,
// read through the descriptor upper) onto the destination: new and changed
// entries are written, whiteouts delete, an opaque directory replaces what
// was there. Devices, sockets and fifos are skipped and named, and so is
// what the walk could not read (safefs.Walker). It stops, with ctx's
// error, where ctx ends: what it wrote is then the caller's to remove.
func (w *Writer) ApplyUpper(ctx context.Context, upper *os.File, owner Owner) (skipped []string, err error) {
	return w.copyFrom(ctx, upper, owner, true)
}

// CopyTree writes the whole tree read through root (a merged view) into
// the destination; it stops where ctx ends, as ApplyUpper does.
func (w *Writer) CopyTree(ctx context.Context, root *os.File, owner Owner) (skipped []string, err error) {
	return w.copyFrom(ctx, root, owner, false)
}

func (w *Writer) copyFrom(ctx context.Context, root *os.File, owner Owner, overlay bool) (skipped []string, err error) {
	r, err := safefs.Reopen(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// The walk itself is not given ctx: its end would be a partial tree
	// (names skipped), where a cancelled copy must fail.
	c := &copier{ctx: ctx, w: w, walk: safefs.NewWalker(context.Background()), owner: owner, overlay: overlay}
	err = c.tree(r, ".", 0)
	for _, u := range c.walk.Unread() {
		skipped = append(skipped, u.String())
	}
	return skipped, err
}

// copier is one walk of a source tree into a Writer.
type copier struct {
	ctx     context.Context
	w       *Writer
	walk    *safefs.Walker
	owner   Owner
	overlay bool // the source is an overlay upper layer
}

// tree copies the entries of source directory src (at rel).
func (c *copier) tree(src *os.File, rel string, depth int) error {
	w := c.w
	names := c.walk.List(src, rel)
	if c.overlay && rel != "." && safefs.IsOpaque(src) {
		// Everything the base had here is gone: start the directory empty.
		pfd, name, err := w.parent(rel)
		if err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(pfd)
		if err == nil {
			df := os.NewFile(uintptr(fd), rel)
			old, _ := df.Readdirnames(-1)
			for _, n := range old {
				if err := removeAt(fd, n); err != nil {
					df.Close()
					return err
				}
			}
			df.Close()
		}
		w.record('o', rel, 0, 0, 0, "")
	}
	for _, name := range names {
		if c.walk.Stopped(rel) {
			return nil
		}
		if err := c.ctx.Err(); err != nil {
			return err
		}
		p := safefs.Join(rel, name)
		st, err := safefs.LstatAt(src, name)
		if err != nil {
			continue
		}
		uid, gid := c.owner(st.Uid, st.Gid)
		mode := safefs.HostMode(st.Mode)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := w.dir(p, mode, uid, gid); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			sub := c.walk.Enter(src, name, p, depth+1)
			if sub == nil {
				continue
			}
			err := c.tree(sub, p, depth+1)
			sub.Close()
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			first := w.links.First(&st, p)
			if first != "" {
				done, err := w.link(p, first)
				if err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
				if done {
					continue
				}
			}
			f, fi, err := safefs.OpenRegular(src, name)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			err = w.file(c.ctx, p, f, fi.Size(), mode, uid, gid)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if first == "" && st.Nlink > 1 {
				w.remember(p)
			}
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(int(src.Fd()), name, buf)
			if err != nil {
				return err
			}
			if err := w.symlink(p, string(buf[:n]), uid, gid); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		case unix.S_IFCHR:
			if c.overlay && st.Rdev == 0 { // a whiteout: deleted in this layer
				w.record('w', p, 0, 0, 0, "")
				if err := w.remove(p); err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
				continue
			}
			c.walk.Skip(p, safefs.TypeOf(st.Mode)+": not saved")
		default:
			c.walk.Skip(p, safefs.TypeOf(st.Mode)+": not saved")
		}
	}
	return nil
}

// LinkTree fills the empty directory dst with src's tree: directories
// made anew, regular files hard-linked (copied across filesystems),
// symlinks copied, ownership and modes kept but setuid and setgid (a
// set-id file is copied without them, not linked). src is a trusted image
// directory of the host (an image or an earlier snapshot), read-only to
// every sandbox; a snapshot's own changes are applied over it after. It
// stops, with ctx's error, where ctx ends.
func LinkTree(ctx context.Context, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		switch {
		case d.IsDir():
			if rel != "." {
				if err := os.Mkdir(target, 0o700); err != nil {
					return err
				}
			}
			if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
			return unix.Chmod(target, safefs.HostMode(st.Mode))
		case fi.Mode()&os.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
			return os.Lchown(target, int(st.Uid), int(st.Gid))
		case fi.Mode().IsRegular():
			// A set-id file of the image is copied without its bits
			// rather than linked: a link would share its mode.
			if safefs.HostMode(st.Mode) == st.Mode&0o7777 {
				if err := os.Link(p, target); err == nil {
					return nil
				} else if !errors.Is(err, unix.EXDEV) {
					return err
				}
			}
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			defer out.Close()
			if err := safefs.CopySparse(out, in, fi.Size()); err != nil {
				return err
			}
			if err := out.Chown(int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
			return unix.Fchmod(int(out.Fd()), safefs.HostMode(st.Mode))
		}
		return nil // images hold no devices (the unpacker refuses them)
	})
}
