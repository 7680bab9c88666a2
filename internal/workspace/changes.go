// Package workspace reads back what a sandbox did to its /workspace: the
// change set of its upper layer against the lower directory, the changes
// as a unified diff, an export of the result into a host directory, and a
// tar archive of a path. Everything the sandbox wrote is read as hostile,
// through internal/workspace/safefs. The workspace's other jobs live
// beside it: a checkout of a git commit (internal/workspace/checkout) and
// the snapshot writer (internal/workspace/snapshot).
//
// It imports internal/workspace/safefs, internal/untrusted, go-udiff and
// x/sys.
package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"unicode/utf8"

	udiff "github.com/aymanbagabas/go-udiff"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/untrusted"
	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
)

// Caps on what the host reads back (safefs has the walk's own).
const (
	MaxDiffFile     = 1 << 20   // files larger than this are named, not diffed
	MaxChanges      = 100000    // entries in one change set
	MaxChangeBytes  = 16 << 20  // bytes of names (paths, link targets) in one change set
	MaxCompareBytes = 256 << 20 // content read to tell a copied-up file from a changed one
	MaxDiffBytes    = 64 << 20  // a diff's text, unless its caller gives less
	MaxHashedBytes  = 256 << 20 // content Digest reads for one change set
)

// Kind of change.
type Kind string

const (
	Added    Kind = "added"
	Modified Kind = "modified"
	Deleted  Kind = "deleted"
)

// Change is one path that differs from the original workspace.
type Change struct {
	Path string `json:"path"`
	Kind Kind   `json:"kind"`
	Type string `json:"type"` // file, dir, symlink, fifo, socket, device
	Size int64  `json:"size"`
	Link string `json:"link,omitempty"`
	// HardLink names an earlier path of the same file (a regular file
	// with several links is read once).
	HardLink string `json:"hardlink,omitempty"`
}

// Set is the changes of one sandbox's workspace.
type Set struct {
	Changes []Change
	// Unread names the subtrees the walk could not read, and why; every
	// other change is listed.
	Unread []safefs.Unread
	// Truncated says why Changes stops short ("" when it is whole).
	Truncated string

	ctx      context.Context
	max      int      // changes listed at most (MaxChanges)
	lower    *os.File // nil: the workspace started empty
	upper    *os.File
	merged   *os.File
	w        *safefs.Walker
	links    safefs.Links
	names    int64             // bytes of names in Changes
	compared int64             // content read by sameContent
	hashed   int64             // content read by Digest
	digests  map[string]string // Digest's, by path
}

// Changes compares the overlay's upper layer with the original workspace
// lowerDir ("" when it started empty). upper and merged are the directory
// descriptors the sandbox's init handed over. The walk stops where ctx
// ends (its deadline is the walk's time budget) and says so in Unread.
func Changes(ctx context.Context, lowerDir string, upper, merged *os.File) (*Set, error) {
	up, err := safefs.Reopen(upper)
	if err != nil {
		return nil, err
	}
	s := &Set{ctx: ctx, max: MaxChanges, upper: up, merged: merged, w: safefs.NewWalker(ctx), links: safefs.Links{}, digests: map[string]string{}}
	if lowerDir != "" {
		if s.lower, err = os.OpenFile(lowerDir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return nil, err
		}
	}
	s.walk(up, s.lower, "", 0)
	s.Unread = s.w.Unread()
	sort.Slice(s.Changes, func(i, j int) bool { return s.Changes[i].Path < s.Changes[j].Path })
	return s, nil
}

// full reports whether the change list is at its cap.
func (s *Set) full() bool { return s.Truncated != "" }

func (s *Set) add(c Change) {
	switch {
	case s.full():
		return
	case len(s.Changes) >= s.max:
		s.Truncated = fmt.Sprintf("more than %d changes", s.max)
		return
	case s.names+int64(len(c.Path)+len(c.Link)+len(c.HardLink)) > MaxChangeBytes:
		s.Truncated = fmt.Sprintf("more than %d bytes of changed paths", MaxChangeBytes)
		return
	}
	s.names += int64(len(c.Path) + len(c.Link) + len(c.HardLink))
	s.Changes = append(s.Changes, c)
}

// walk lists the changes under upper directory d at rel; l is the lower
// directory at the same place (nil when there is none).
func (s *Set) walk(d, l *os.File, rel string, depth int) {
	names := s.w.List(d, rel)
	if rel != "" && safefs.IsOpaque(d) {
		s.deleteLower(l, rel, names, depth)
	}
	for _, name := range names {
		if s.full() || s.w.Stopped(rel) {
			return
		}
		p := safefs.Join(rel, name)
		st, err := safefs.LstatAt(d, name)
		if err != nil {
			continue
		}
		var lst unix.Stat_t
		inLower := false
		if l != nil {
			lst, err = safefs.LstatAt(l, name)
			inLower = err == nil
		}
		kind := Added
		if inLower {
			kind = Modified
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev == 0 { // an overlay whiteout: deleted
				if inLower {
					s.deleted(l, name, p, lst, depth)
				}
				continue
			}
			s.add(Change{Path: p, Kind: kind, Type: "device"})
		case unix.S_IFDIR:
			lowerDir := inLower && lst.Mode&unix.S_IFMT == unix.S_IFDIR
			if !lowerDir {
				if inLower {
					s.deleted(l, name, p, lst, depth)
				}
				s.add(Change{Path: p, Kind: Added, Type: "dir"})
			}
			sub := s.w.Enter(d, name, p, depth+1)
			if sub == nil {
				continue
			}
			var lsub *os.File
			if lowerDir {
				lsub = s.w.Enter(l, name, p, depth+1)
			}
			s.walk(sub, lsub, p, depth+1)
			sub.Close()
			if lsub != nil {
				lsub.Close()
			}
		case unix.S_IFREG:
			c := Change{Path: p, Kind: kind, Type: "file", Size: st.Size, HardLink: s.links.First(&st, p)}
			if inLower && lst.Mode&unix.S_IFMT == unix.S_IFREG && lst.Size == st.Size && lst.Mode == st.Mode && s.sameContent(l, d, name, st.Size) {
				continue // copied up for metadata only, content unchanged
			}
			if inLower && lst.Mode&unix.S_IFMT != unix.S_IFREG {
				s.deleted(l, name, p, lst, depth)
				c.Kind = Added
			}
			s.add(c)
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			n, _ := unix.Readlinkat(int(d.Fd()), name, buf)
			s.add(Change{Path: p, Kind: kind, Type: "symlink", Link: string(buf[:max(n, 0)])})
		default:
			s.add(Change{Path: p, Kind: kind, Type: safefs.TypeOf(st.Mode)})
		}
	}
}

// deleted records name of lower directory l (at p) as deleted, and
// everything under it if a directory. A directory is a change of its own,
// so a deleted tree of empty directories costs the change list what it
// costs the walk, and the walk stops where the list is full.
func (s *Set) deleted(l *os.File, name, p string, st unix.Stat_t, depth int) {
	s.add(Change{Path: p, Kind: Deleted, Type: safefs.TypeOf(st.Mode), Size: st.Size})
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || s.full() {
		return
	}
	sub := s.w.Enter(l, name, p, depth+1)
	if sub == nil {
		return
	}
	defer sub.Close()
	s.deleteLower(sub, p, nil, depth+1)
}

// deleteLower records every entry of lower directory l (at rel) as
// deleted, except the names kept (sorted): an opaque or replaced
// directory.
func (s *Set) deleteLower(l *os.File, rel string, keep []string, depth int) {
	if l == nil || s.full() || s.w.Stopped(rel) {
		return
	}
	for _, n := range s.w.List(l, rel) {
		if s.full() || s.w.Stopped(rel) {
			return
		}
		if _, kept := slices.BinarySearch(keep, n); kept {
			continue
		}
		st, err := safefs.LstatAt(l, n)
		if err != nil {
			continue
		}
		s.deleted(l, n, safefs.Join(rel, n), st, depth)
	}
}

// sameContent reports whether file name of lower directory l and of upper
// directory u hold the same bytes, within the set's compare budget (past
// it the file counts as changed).
func (s *Set) sameContent(l, u *os.File, name string, size int64) bool {
	if size > MaxDiffFile || s.compared+2*size > MaxCompareBytes {
		return false
	}
	s.compared += 2 * size
	a, err := safefs.ReadCapped(l, name, MaxDiffFile)
	if err != nil {
		return false
	}
	b, err := safefs.ReadCapped(u, name, MaxDiffFile)
	return err == nil && bytes.Equal(a, b)
}

func isText(b []byte) bool {
	head := b[:min(len(b), 8000)]
	return bytes.IndexByte(head, 0) < 0 && utf8.Valid(b)
}

// countWriter counts what passes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteDiff writes a unified diff of the text changes; binary, oversized,
// special and deleted files are named, a file's further hard links are
// named once its content was. Once about maxBytes are written (or the set's
// time is up) the remaining files are named, not diffed, and the diff ends
// by saying so, and by naming what the walk could not read.
func (s *Set) WriteDiff(w io.Writer, maxBytes int64) error {
	cw := &countWriter{w: w}
	var read int64
	notDiffed := 0
	for i := range s.Changes {
		c := &s.Changes[i]
		var err error
		switch c.Type {
		case "file":
			switch {
			case c.HardLink != "":
				_, err = fmt.Fprintf(cw, "%s file %s (a hard link to %s: the same content)\n", c.Kind, untrusted.Quote(c.Path), untrusted.Quote(c.HardLink))
			case cw.n >= maxBytes || read >= 4*maxBytes || s.ctx.Err() != nil:
				notDiffed++
				_, err = fmt.Fprintf(cw, "%s file %s (%d bytes, not diffed: the diff is past its budget)\n", c.Kind, untrusted.Quote(c.Path), c.Size)
			default:
				err = s.fileDiff(cw, c, &read)
			}
		case "symlink":
			_, err = fmt.Fprintf(cw, "%s symlink %s -> %s\n", c.Kind, untrusted.Quote(c.Path), untrusted.Quote(c.Link))
		case "dir":
			if c.Kind == Added {
				_, err = fmt.Fprintf(cw, "new directory %s\n", untrusted.Quote(c.Path))
			} else {
				_, err = fmt.Fprintf(cw, "deleted directory %s\n", untrusted.Quote(c.Path))
			}
		default:
			_, err = fmt.Fprintf(cw, "%s %s %s (not shown)\n", c.Kind, c.Type, untrusted.Quote(c.Path))
		}
		if err != nil {
			return err
		}
	}
	if notDiffed > 0 {
		if _, err := fmt.Fprintf(cw, "airlock: the diff reached its budget (%d bytes, or its time): %d files are named above, not diffed\n", maxBytes, notDiffed); err != nil {
			return err
		}
	}
	for _, u := range s.Unread {
		if _, err := fmt.Fprintf(cw, "airlock: not read: %s\n", u); err != nil {
			return err
		}
	}
	if s.Truncated != "" {
		_, err := fmt.Fprintf(cw, "airlock: %s; the rest are not shown\n", s.Truncated)
		return err
	}
	return nil
}

func (s *Set) fileDiff(w io.Writer, c *Change, read *int64) error {
	var old, cur []byte
	var err error
	if c.Kind != Added {
		if old, err = safefs.ReadCapped(s.lower, c.Path, MaxDiffFile); err != nil {
			return s.named(w, c, err)
		}
	}
	if c.Kind != Deleted {
		if cur, err = safefs.ReadCapped(s.upper, c.Path, MaxDiffFile); err != nil {
			return s.named(w, c, err)
		}
	}
	*read += int64(len(old) + len(cur))
	if !isText(old) || !isText(cur) {
		_, err := fmt.Fprintf(w, "Binary files %s and %s differ\n", side("a", c.Path, c.Kind != Added), side("b", c.Path, c.Kind != Deleted))
		return err
	}
	text, err := udiff.ToUnified(side("a", c.Path, c.Kind != Added), side("b", c.Path, c.Kind != Deleted), string(old), udiff.Lines(string(old), string(cur)), 3)
	if err != nil {
		return err
	}
	if text == "" { // only the mode changed
		_, err = fmt.Fprintf(w, "mode changed %s\n", untrusted.Quote(c.Path))
		return err
	}
	_, err = io.WriteString(w, text)
	return err
}

func (s *Set) named(w io.Writer, c *Change, err error) error {
	switch {
	case errors.Is(err, safefs.ErrTooLarge):
		_, err = fmt.Fprintf(w, "%s file %s (%d bytes, too large to diff)\n", c.Kind, untrusted.Quote(c.Path), c.Size)
	case errors.Is(err, safefs.ErrNotRegular):
		_, err = fmt.Fprintf(w, "%s %s (not a regular file, not shown)\n", c.Kind, untrusted.Quote(c.Path))
	default:
		_, err = fmt.Fprintf(w, "%s %s (unreadable: %s)\n", c.Kind, untrusted.Quote(c.Path), untrusted.Quote(err.Error()))
	}
	return err
}

func side(prefix, p string, exists bool) string {
	if !exists {
		return "/dev/null"
	}
	return untrusted.Quote(prefix + "/" + p)
}

// MaxExportBytes caps the file content an export writes: past it files
// are skipped and named. Regular files are copied by their data only
// (holes stay holes), and a file with several links is copied once.
const MaxExportBytes = 64 << 30

// Export copies the workspace as the sandbox left it into dst, which must
// not exist yet. Only directories, regular files (sparse-aware; further
// hard links of a file as links), both without setuid, setgid, group or
// other write bits (exportMode), and symlinks that cannot resolve outside
// dst (untrusted.LinkInside) are written; everything else, and what the
// walk could not read, is skipped and named in the returned list.
func (s *Set) Export(dst string) (skipped []string, err error) {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	src, err := safefs.Reopen(s.merged)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	e := &exporter{root: out, owner: exportOwner(), w: safefs.NewWalker(s.ctx), links: safefs.Links{}, max: MaxExportBytes}
	_ = out.Chown(e.owner[0], e.owner[1]) // the export's own directory too
	err = e.dir(src, out, "", 0)
	for _, u := range e.w.Unread() {
		e.skipped = append(e.skipped, u.String())
	}
	return e.skipped, err
}

// exportOwner is the invoking user behind sudo, so exported files belong to
// whoever asked for them; -1 keeps root.
func exportOwner() [2]int {
	o := [2]int{-1, -1}
	if u, g := os.Getenv("SUDO_UID"), os.Getenv("SUDO_GID"); u != "" && g != "" {
		fmt.Sscanf(u, "%d", &o[0])
		fmt.Sscanf(g, "%d", &o[1])
	}
	return o
}

// exporter is one export's walk: where it writes, what it has written.
type exporter struct {
	root    *os.File // the export's directory
	owner   [2]int
	w       *safefs.Walker
	links   safefs.Links
	max     int64 // bytes of file data at most
	total   int64
	skipped []string
}

// dir exports the entries of source directory src (at rel) into out.
func (e *exporter) dir(src, out *os.File, rel string, depth int) error {
	for _, name := range e.w.List(src, rel) {
		if e.w.Stopped(rel) {
			return nil
		}
		p := safefs.Join(rel, name)
		st, err := safefs.LstatAt(src, name)
		if err != nil {
			continue
		}
		perm := exportMode(st.Mode)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := unix.Mkdirat(int(out.Fd()), name, perm|0o700); err != nil {
				return fmt.Errorf("export mkdir %s: %w", p, err)
			}
			_ = unix.Fchownat(int(out.Fd()), name, e.owner[0], e.owner[1], unix.AT_SYMLINK_NOFOLLOW)
			sub := e.w.Enter(src, name, p, depth+1)
			if sub == nil {
				continue
			}
			subOut, err := safefs.OpenIn(out, name, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				sub.Close()
				return fmt.Errorf("export %s: %w", p, err)
			}
			err = e.dir(sub, subOut, p, depth+1)
			sub.Close()
			subOut.Close()
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := e.file(src, out, name, p, &st, perm); err != nil {
				return err
			}
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(int(src.Fd()), name, buf)
			if err != nil {
				continue
			}
			target := string(buf[:n])
			if !untrusted.LinkInside(p, target) {
				e.skipped = append(e.skipped, fmt.Sprintf("%s (symlink to %s: it could resolve outside the export)", untrusted.Quote(p), untrusted.Quote(target)))
				continue
			}
			if err := unix.Symlinkat(target, int(out.Fd()), name); err != nil {
				return fmt.Errorf("export symlink %s: %w", p, err)
			}
			_ = unix.Fchownat(int(out.Fd()), name, e.owner[0], e.owner[1], unix.AT_SYMLINK_NOFOLLOW)
		default:
			e.skipped = append(e.skipped, fmt.Sprintf("%s (%s)", untrusted.Quote(p), safefs.TypeOf(st.Mode)))
		}
	}
	return nil
}

// file exports regular file name of src (at p): a further link of a file
// already exported becomes a hard link to it.
func (e *exporter) file(src, out *os.File, name, p string, st *unix.Stat_t, perm uint32) error {
	if first := e.links.First(st, p); first != "" {
		if unix.Linkat(int(e.root.Fd()), first, int(out.Fd()), name, 0) == nil {
			return nil
		}
	}
	cost := min(st.Size, st.Blocks*512) // holes are not written
	if e.total+cost > e.max {
		e.skipped = append(e.skipped, fmt.Sprintf("%s (%d bytes: the export passed its cap of %d bytes)", p, cost, e.max))
		return nil
	}
	e.total += cost
	in, fi, err := safefs.OpenRegular(src, name)
	if err != nil {
		return err
	}
	defer in.Close()
	fd, err := unix.Openat(int(out.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return fmt.Errorf("export create %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if err := safefs.CopySparse(f, in, fi.Size()); err != nil {
		return fmt.Errorf("export copy %s: %w", p, err)
	}
	// Set the mode explicitly: umask is not ours to trust, and perm has no
	// setuid, setgid, group or other write (exportMode).
	if err := f.Chmod(os.FileMode(perm)); err != nil {
		return err
	}
	if e.owner[0] >= 0 {
		_ = f.Chown(e.owner[0], e.owner[1])
	}
	return nil
}

// MaxHashedFile caps the files Digest reads.
const MaxHashedFile = 64 << 20

// Digest is the SHA-256 (hex) of a changed regular file's new contents,
// read from the merged view by the safe-access rules; "" for what is not a
// regular file now, is larger than MaxHashedFile, or is past the set's
// MaxHashedBytes or its time. A file's hard links share its digest (it is
// read once).
func (s *Set) Digest(c Change) string {
	if c.Type != "file" || c.Kind == Deleted || c.Size > MaxHashedFile || s.ctx.Err() != nil {
		return ""
	}
	p := c.Path
	if c.HardLink != "" {
		p = c.HardLink
	}
	if d, ok := s.digests[p]; ok {
		return d
	}
	if s.hashed+c.Size > MaxHashedBytes {
		return ""
	}
	s.hashed += c.Size
	f, fi, err := safefs.OpenRegular(s.merged, p)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, min(fi.Size(), MaxHashedFile))); err != nil {
		return ""
	}
	d := hex.EncodeToString(h.Sum(nil))
	s.digests[p] = d
	return d
}

// exportMode is the mode export gives what a sandbox made, in the user's
// own tree: safefs.HostMode without group or other write (umask 022, applied
// whatever the process's umask), as a careful tool does. A sandbox sets
// every mode it likes; it must not make the user's files or directories
// writable by every other user of the host. (Snapshots keep safefs.HostMode: what
// they hold is shown only to sandboxes.)
func exportMode(mode uint32) uint32 { return safefs.HostMode(mode) &^ 0o022 }
