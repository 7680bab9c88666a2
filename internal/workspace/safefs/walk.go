package safefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// Every reading of a sandbox's tree on the host — the change set, the
// diff, the archive, the export, the snapshot — walks it the same way and
// pays for it in bytes, not files:
//
//   - by directory descriptors: each directory is opened relative to its
//     parent's descriptor, one name at a time (openat2 without following
//     symlinks or magic links, without crossing mounts), so the walk
//     never gives a syscall more than one name; what is read after it (a
//     diff's hunks, a digest) or written into a snapshot is named by its
//     path below the root, at most MaxPath bytes, resolved by openat2
//     confined to the root;
//   - what it cannot read — a subtree deeper than MaxDepth levels, names
//     past MaxPath bytes, a directory of more than MaxDirEntries entries,
//     an open that fails, a walk whose time ran out — is named (Unread)
//     and the walk goes on with everything else, so one hostile corner
//     never hides the rest;
//   - a regular file with several links is read, shipped or copied once:
//     the others are written as its links (Links);
//   - every reader has a byte budget and says what it left out.

// Caps of every walk.
const (
	MaxDepth      = 256              // directory levels below the walk's root
	MaxPath       = unix.PathMax - 1 // bytes of a path below the walk's root
	MaxDirEntries = 100_000          // entries read from one directory
	MaxWalkNames  = 64 << 20         // bytes of names one walk reads (held along its path)
	maxLinkPaths  = 16 << 20         // bytes of first-link paths one walk remembers
	maxUnread     = 1000             // unread subtrees named; the rest counted
)

// Unread is what a walk left out, and why.
type Unread struct {
	Path string `json:"path"`
	Why  string `json:"why"`
}

// String is the path, quoted when it must be (untrusted.Quote), and why.
func (u Unread) String() string { return untrusted.Quote(u.Path) + " (" + u.Why + ")" }

// Walker is the state of one walk: when it must stop, and what it left out.
type Walker struct {
	ctx    context.Context
	unread []Unread
	more   int   // unread entries past maxUnread
	late   bool  // ctx ended: everything after is unread
	names  int64 // bytes of names read so far
	max    int64 // MaxWalkNames
}

// NewWalker starts a walk that stops where ctx ends (nil: never).
func NewWalker(ctx context.Context) *Walker {
	if ctx == nil {
		ctx = context.Background()
	}
	return &Walker{ctx: ctx, max: MaxWalkNames}
}

// Skip names what the walk leaves out.
func (w *Walker) Skip(p, why string) {
	if p == "" {
		p = "."
	}
	if len(w.unread) < maxUnread {
		w.unread = append(w.unread, Unread{p, why})
		return
	}
	w.more++
}

// Unread lists what the walk left out (the last entry counts the rest
// when there were more than can be named).
func (w *Walker) Unread() []Unread {
	if w.more == 0 {
		return w.unread
	}
	return append(slices.Clip(w.unread), Unread{"…", fmt.Sprintf("%d more not read", w.more)})
}

// Stopped reports whether the walk's time is up (named once, where it
// stopped).
func (w *Walker) Stopped(at string) bool {
	if w.late {
		return true
	}
	if err := w.ctx.Err(); err != nil {
		w.late = true
		why := "the walk's time budget ran out in this directory: its rest and what follows were not read"
		if errors.Is(err, context.Canceled) {
			why = "the walk was cancelled in this directory: its rest and what follows were not read"
		}
		w.Skip(at, why)
		return true
	}
	return false
}

// NamesRead is how many bytes of names the walk has read so far (what its
// budget, MaxWalkNames, is counted in).
func (w *Walker) NamesRead() int64 { return w.names }

// Join is the path of name in the directory at rel ("" or "." is the
// walk's root); for naming only, never given to a syscall.
func Join(rel, name string) string {
	if rel == "" || rel == "." {
		return name
	}
	return rel + "/" + name
}

// List reads the names of directory d (at rel), sorted: at most
// MaxDirEntries, and none whose path would pass MaxPath; what it leaves
// out is named.
func (w *Walker) List(d *os.File, rel string) []string {
	if w.names > w.max {
		return nil
	}
	names, err := d.Readdirnames(MaxDirEntries + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		w.Skip(rel, "not read: "+ErrText(err))
	}
	if len(names) > MaxDirEntries {
		names = names[:MaxDirEntries]
		w.Skip(rel, fmt.Sprintf("more than %d entries: the rest were not read", MaxDirEntries))
	}
	for i, n := range names {
		if w.names += int64(len(n)) + 16; w.names > w.max {
			w.Skip(rel, fmt.Sprintf("the walk read more than %d bytes of names: this directory's rest and what follows were not read", w.max))
			names = names[:i]
			break
		}
	}
	long := 0
	names = slices.DeleteFunc(names, func(n string) bool {
		if len(Join(rel, n)) > MaxPath {
			long++
			return true
		}
		return false
	})
	if long > 0 {
		w.Skip(rel, fmt.Sprintf("%d entries whose paths are longer than %d bytes were not read", long, MaxPath))
	}
	slices.Sort(names)
	return names
}

// Enter opens directory name of d (at path p, depth levels below the
// root), or names it unread and returns nil.
func (w *Walker) Enter(d *os.File, name, p string, depth int) *os.File {
	if depth > MaxDepth {
		w.Skip(p, fmt.Sprintf("deeper than %d levels: not read", MaxDepth))
		return nil
	}
	sub, err := OpenIn(d, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		w.Skip(p, "not read: "+ErrText(err))
		return nil
	}
	return sub
}

// ErrText is an error's text without the path (the walk names it).
func ErrText(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// linkKey identifies a regular file that has several links. The change
// time is part of it: overlayfs can report a copied-up file under its
// lower origin's inode number, so (dev, ino) alone could pair a changed
// file with an unchanged lower sibling; a copy-up has a ctime of its own,
// and nobody can set one.
type linkKey struct {
	dev, ino uint64
	ctime    unix.Timespec
	size     int64
}

// Links remembers the first path met of each multiply-linked file, up to
// maxLinkPaths bytes of paths; past it further files are read as if they
// had one link (their cost still counts against the reader's budget).
type Links struct {
	m     map[linkKey]string
	bytes int64
}

// First returns the path of a link to st's file met earlier in the walk;
// otherwise it records p as that file's first link and returns "".
func (l *Links) First(st *unix.Stat_t, p string) string {
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink < 2 {
		return ""
	}
	k := linkKey{uint64(st.Dev), st.Ino, st.Ctim, st.Size}
	if f, ok := l.m[k]; ok {
		return f
	}
	if l.bytes+int64(len(p)) > maxLinkPaths {
		return ""
	}
	if l.m == nil {
		l.m = map[linkKey]string{}
	}
	l.m[k] = p
	l.bytes += int64(len(p))
	return ""
}

// TypeOf names a file type for people: file, dir, symlink, fifo, socket or device.
func TypeOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	default:
		return "device"
	}
}

// IsOpaque reports whether directory d of an overlay upper layer is opaque
// (it hides the whole lower directory of its name).
func IsOpaque(d *os.File) bool {
	buf := make([]byte, 8)
	n, err := unix.Fgetxattr(int(d.Fd()), "user.overlay.opaque", buf)
	return err == nil && n > 0 && buf[0] == 'y'
}
