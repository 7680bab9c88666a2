// Package hostcopy freezes a host directory for a sandbox: it copies the
// tree a caller opened (a user's or a tenant's --workspace) into a private
// directory that only airlock writes, which becomes the lower layer of the
// sandbox's /workspace. The sandbox then sees the directory as it was at
// creation whatever the host does to it later, and the change set read
// against that lower layer is exactly what the sandbox changed.
//
// The tree is read as hostile, through internal/workspace/safefs: one
// directory descriptor at a time below the opened root, never following a
// link or crossing a mount, within the walk's depth, entry and name
// budgets, and within this package's caps on entries and bytes. Data is
// cloned (FICLONE: free on btrfs and xfs) or copied in the kernel
// (copy_file_range), holes kept.
//
// It imports internal/workspace/safefs, internal/untrusted, internal/errdefs
// and x/sys.
package hostcopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
)

// What one copy may hold: the caps of a --repo checkout (entries, and
// bytes as allocated on the host: file data, directories, symlinks), and
// never so much that the
// destination's file system would keep less than a twentieth of its size
// free.
const (
	MaxEntries   = 1 << 20
	MaxBytes     = 8 << 30
	ReserveShare = 20 // the destination keeps at least 1/ReserveShare of its file system free
	maxSkipped   = 100
)

// Options of one copy.
type Options struct {
	MaxEntries int64 // 0: MaxEntries
	MaxBytes   int64 // 0: MaxBytes
	// Progress, when set, is called every few thousand entries or few
	// hundred MiB with what was copied so far.
	Progress func(Result)
}

// Result is what a copy wrote.
type Result struct {
	Entries int64 // directories, files and links
	// Bytes are what the entries take in the source: file data as
	// allocated, and the blocks of directories and symlinks.
	Bytes int64
	// Skipped names the special files (fifos, sockets, devices) left out:
	// they hold no data and /workspace is mounted nodev.
	Skipped []string
}

// Copy copies the directory src (a descriptor, O_PATH or not) into dst,
// which must not exist; its parent must. Owners, permissions (without
// setuid and setgid) and times are kept, a file with several links in the
// tree is copied once and linked, symlinks are copied as they are, never
// followed. Whatever the walk cannot read (too deep, too many entries in a
// directory, a mount point, an open that fails) fails the copy, as does
// passing the caps or the context's end; dst is removed then.
func Copy(ctx context.Context, src *os.File, dst string, o Options) (res Result, err error) {
	if o.MaxEntries == 0 {
		o.MaxEntries = MaxEntries
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = MaxBytes
	}
	in, err := safefs.Reopen(src)
	if err != nil {
		return res, err
	}
	defer in.Close()
	var rootSt unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &rootSt); err != nil {
		return res, fmt.Errorf("fstat: %w", err)
	}
	// Errors name paths below the tree, never the host's: a tenant reads them.
	if err := os.Mkdir(dst, 0o700); err != nil {
		return res, fmt.Errorf("workspace copy: mkdir: %w", errors.Unwrap(err))
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dst)
		}
	}()
	out, err := os.OpenFile(dst, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("workspace copy: open: %w", errors.Unwrap(err))
	}
	defer out.Close()
	c := &copier{ctx: ctx, o: o, root: out, w: safefs.NewWalker(ctx), links: safefs.Links{}, budget: o.MaxBytes}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(out.Fd()), &fs); err != nil {
		return res, fmt.Errorf("statfs: %w", err)
	}
	bs := int64(fs.Bsize)
	c.reserve = int64(fs.Blocks) * bs / ReserveShare
	if free := int64(fs.Bavail)*bs - c.reserve; free < c.budget {
		c.budget, c.hostFree = max(free, 0), true
	}
	err = c.dir(in, out, "", 0)
	if ctx.Err() != nil {
		return c.res, fmt.Errorf("workspace copy stopped: %w", context.Cause(ctx))
	}
	if err == nil {
		err = c.failed()
	}
	if err != nil {
		return c.res, err
	}
	if err := own(int(out.Fd()), "", &rootSt); err != nil {
		return c.res, err
	}
	if c.moreSkipped > 0 {
		c.res.Skipped = append(c.res.Skipped, fmt.Sprintf("%d more special files", c.moreSkipped))
	}
	return c.res, nil
}

// failed says what of the tree the walk could not read, if anything.
func (c *copier) failed() error {
	u := c.w.Unread()
	if len(u) == 0 {
		return nil
	}
	names := make([]string, 0, min(len(u), 5))
	for _, x := range u[:min(len(u), 5)] {
		names = append(names, x.String())
	}
	more := ""
	if len(u) > 5 {
		more = fmt.Sprintf(" and %d more", len(u)-5)
	}
	return errdefs.Invalid(fmt.Sprintf("the workspace cannot be copied whole: %s%s", strings.Join(names, "; "), more))
}

// copier is one copy's walk: where it writes, what it has written.
type copier struct {
	ctx      context.Context
	o        Options
	root     *os.File // the copy's top directory
	w        *safefs.Walker
	links    safefs.Links
	budget   int64 // bytes of file data at most
	hostFree bool  // the budget is the destination's free space, not o.MaxBytes
	// reserve is what the destination's file system keeps free, measured
	// again (room) every checkEvery bytes: other writers (copies side by
	// side) take its space too.
	reserve   int64
	unchecked int64 // bytes counted since room last measured
	res       Result
	reported  Result // at the last progress call
	// moreSkipped counts the special files past the first maxSkipped.
	moreSkipped int
}

// count adds one entry of cost bytes, or says which cap it passes.
func (c *copier) count(cost int64) error {
	if c.res.Entries++; c.res.Entries > c.o.MaxEntries {
		return fmt.Errorf("%w: the workspace holds more than %d entries (a copy is capped)", errdefs.ErrTooLarge, c.o.MaxEntries)
	}
	if c.res.Bytes += cost; c.res.Bytes > c.budget {
		return c.over()
	}
	if c.unchecked += cost; c.unchecked >= checkEvery {
		c.unchecked = 0
		if err := c.room(cost); err != nil {
			return err
		}
	}
	if p := c.o.Progress; p != nil && (c.res.Entries-c.reported.Entries >= 5000 || c.res.Bytes-c.reported.Bytes >= 256<<20) {
		c.reported = c.res
		p(c.res)
	}
	return nil
}

// checkEvery is how many bytes a copy writes between two measures of the
// destination's free space.
const checkEvery = 1 << 20

// room says whether the destination's file system has need bytes more
// than its reserve free now.
func (c *copier) room(need int64) error {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(c.root.Fd()), &fs); err != nil {
		return fmt.Errorf("statfs: %w", err)
	}
	if int64(fs.Bavail)*int64(fs.Bsize)-need < c.reserve {
		return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("copying the workspace would leave the data directory's file system less than 1/%d free (other writers took its space meanwhile)", ReserveShare))
	}
	return nil
}

// over is the error of a copy past its byte budget.
func (c *copier) over() error {
	if c.hostFree {
		return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("the workspace holds more than %d bytes, and copying more would leave the data directory's file system less than 1/%d free", c.budget, ReserveShare))
	}
	return fmt.Errorf("%w: the workspace holds more than %d bytes (a copy is capped)", errdefs.ErrTooLarge, c.budget)
}

// dir copies the entries of source directory src (at rel) into out.
func (c *copier) dir(src, out *os.File, rel string, depth int) error {
	for _, name := range c.w.List(src, rel) {
		if c.w.Stopped(rel) {
			return nil
		}
		p := safefs.Join(rel, name)
		st, err := safefs.LstatAt(src, name)
		if errors.Is(err, unix.ENOENT) {
			continue // gone since it was listed
		}
		if err != nil {
			c.w.Skip(p, "lstat: "+err.Error())
			continue
		}
		// A directory or a symlink costs the copy what it takes in the
		// source (a block, more for a big directory or a long target).
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := c.count(st.Blocks * 512); err != nil {
				return err
			}
			if err := c.subdir(src, out, name, p, depth); err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := c.file(src, out, name, p, &st); err != nil {
				return err
			}
		case unix.S_IFLNK:
			if err := c.count(st.Blocks * 512); err != nil {
				return err
			}
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(int(src.Fd()), name, buf)
			if err != nil {
				c.w.Skip(p, "readlink: "+err.Error())
				continue
			}
			if err := unix.Symlinkat(string(buf[:n]), int(out.Fd()), name); err != nil {
				return fmt.Errorf("workspace copy: symlink %s: %w", p, err)
			}
			if err := own(int(out.Fd()), name, &st); err != nil {
				return err
			}
		default:
			if err := c.count(0); err != nil {
				return err
			}
			c.skip(fmt.Sprintf("%s (%s)", untrusted.Quote(p), safefs.TypeOf(st.Mode)))
		}
		if err := c.failed(); err != nil {
			return err // no use copying the rest
		}
	}
	return nil
}

// skip names a special file left out: the first maxSkipped, then a count.
func (c *copier) skip(what string) {
	if len(c.res.Skipped) < maxSkipped {
		c.res.Skipped = append(c.res.Skipped, what)
		return
	}
	c.moreSkipped++
}

// subdir copies directory name of src (at p) into a new directory of out.
func (c *copier) subdir(src, out *os.File, name, p string, depth int) error {
	sub := c.w.Enter(src, name, p, depth+1)
	if sub == nil {
		return nil
	}
	defer sub.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(sub.Fd()), &st); err != nil {
		return fmt.Errorf("workspace copy: fstat %s: %w", p, err)
	}
	if err := unix.Mkdirat(int(out.Fd()), name, 0o700); err != nil {
		return fmt.Errorf("workspace copy: mkdir %s: %w", p, err)
	}
	fd, err := unix.Openat(int(out.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("workspace copy: open %s: %w", p, err)
	}
	subOut := os.NewFile(uintptr(fd), p)
	defer subOut.Close()
	if err := c.dir(sub, subOut, p, depth+1); err != nil {
		return err
	}
	// Last: the directory's times change as it fills.
	return own(int(out.Fd()), name, &st)
}

// file copies regular file name of src (at p; st as listed): a further
// link of a file already copied becomes a link to that copy.
func (c *copier) file(src, out *os.File, name, p string, st *unix.Stat_t) error {
	if first := c.links.First(st, p); first != "" && c.link(first, out, name) {
		return c.count(0)
	}
	f, _, err := safefs.OpenRegular(src, name)
	if errors.Is(err, unix.ENOENT) {
		return nil // gone since it was listed
	}
	if err != nil {
		c.w.Skip(p, "open: "+safefs.ErrText(err))
		return nil
	}
	defer f.Close()
	var fst unix.Stat_t // what was opened, not what was listed
	if err := unix.Fstat(int(f.Fd()), &fst); err != nil {
		return fmt.Errorf("workspace copy: fstat %s: %w", p, err)
	}
	cost := min(fst.Size, fst.Blocks*512)
	if err := c.count(cost); err != nil {
		return err
	}
	fd, err := unix.Openat(int(out.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("workspace copy: create %s: %w", p, err)
	}
	dst := os.NewFile(uintptr(fd), p)
	defer dst.Close()
	// The tenant may fill the file's holes while it is copied: what is
	// written past its counted cost is counted too, within the budget.
	n, err := copyData(c.ctx, dst, f, fst.Size, cost+c.budget-c.res.Bytes, func(left int64) error {
		return c.room(min(left, cost))
	})
	if n > cost {
		c.res.Bytes += n - cost
	}
	if errors.Is(err, errGrew) {
		return c.over()
	}
	if err != nil {
		return fmt.Errorf("workspace copy: %s: %w", p, err)
	}
	return own(fd, "", &fst)
}

// link makes name of out a further link of first, a file of the copy, and
// reports whether it did. first is resolved beneath the copy's root
// without following any link.
func (c *copier) link(first string, out *os.File, name string) bool {
	fd, err := unix.Openat2(int(c.root.Fd()), first, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.Linkat(fd, "", int(out.Fd()), name, unix.AT_EMPTY_PATH) == nil
}

// own gives name of directory dirfd ("": dirfd itself) st's owner,
// permissions without setuid and setgid (safefs.HostMode) and times.
func own(dirfd int, name string, st *unix.Stat_t) error {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags = unix.AT_EMPTY_PATH
	}
	if err := unix.Fchownat(dirfd, name, int(st.Uid), int(st.Gid), flags); err != nil {
		return fmt.Errorf("workspace copy: chown %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		var err error
		if name == "" {
			err = unix.Fchmod(dirfd, safefs.HostMode(st.Mode))
		} else {
			err = unix.Fchmodat(dirfd, name, safefs.HostMode(st.Mode), 0)
		}
		if err != nil {
			return fmt.Errorf("workspace copy: chmod %s: %w", name, err)
		}
	}
	times := []unix.Timespec{st.Atim, st.Mtim}
	if name == "" {
		return unix.UtimesNanoAt(dirfd, "", times, unix.AT_EMPTY_PATH)
	}
	return unix.UtimesNanoAt(dirfd, name, times, unix.AT_SYMLINK_NOFOLLOW)
}

// errGrew is a file whose data grew past what copyData may write.
var errGrew = errors.New("the file's data grew while it was copied")

// copyData copies size bytes of src into the empty dst: a clone of the
// whole file where the file system shares extents (FICLONE), else its
// data segments (holes stay holes) by copy_file_range, else by read and
// write, at most max bytes of data (errGrew past them: a file whose holes
// are filled while it is copied), asking room before each piece past the
// first whether the destination still has the rest of the file's bytes. A
// file that shrinks meanwhile is copied as far as it goes. It returns the
// bytes of data it wrote (none for a clone, which shares the source's).
func copyData(ctx context.Context, dst, src *os.File, size, max int64, room func(left int64) error) (written int64, err error) {
	if size == 0 {
		return 0, nil
	}
	if unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil {
		// The clone is of the file as it is now: cut it back to the size
		// that was counted.
		return 0, dst.Truncate(size)
	}
	if err := dst.Truncate(size); err != nil {
		return 0, err
	}
	kernel := true
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || data >= size {
			return written, nil // only a hole remains
		}
		if err != nil {
			return written, fmt.Errorf("lseek SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return written, fmt.Errorf("lseek SEEK_HOLE: %w", err)
		}
		hole = min(hole, size)
		for off = data; off < hole; {
			if err := ctx.Err(); err != nil {
				return written, err
			}
			if written >= max {
				return written, errGrew
			}
			if written > 0 {
				if err := room(size - off); err != nil {
					return written, err
				}
			}
			chunk := min(hole-off, 64<<20, max-written)
			var n int64
			if kernel {
				r, w := off, off
				m, err := unix.CopyFileRange(int(src.Fd()), &r, int(dst.Fd()), &w, int(chunk), 0)
				switch {
				case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS):
					kernel = false
					continue
				case err != nil:
					return written, fmt.Errorf("copy_file_range: %w", err)
				}
				n = int64(m)
			} else {
				m, err := io.Copy(io.NewOffsetWriter(dst, off), io.NewSectionReader(src, off, chunk))
				if err != nil {
					return written + m, err
				}
				n = m
			}
			if n == 0 {
				return written, nil // the file shrank
			}
			off += n
			written += n
		}
	}
	return written, nil
}
