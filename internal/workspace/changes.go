// Package workspace builds a sandbox's /workspace and reads back what the
// sandbox did to it: a workspace from a git commit (objects only: no hooks,
// no repository config, no credentials), the changes as a unified diff, and
// an export of the result. Everything the sandbox wrote is read as hostile
// (see safefs.go).
package workspace

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"sort"
	"unicode/utf8"

	udiff "github.com/aymanbagabas/go-udiff"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// Caps on what the host reads back.
const (
	MaxDiffFile    = 1 << 20 // files larger than this are named, not diffed
	MaxChanges     = 100000  // entries in one change set
	MaxDeletedWalk = 100000  // lower entries listed under a deleted directory
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
}

// Set is the changes of one sandbox's workspace.
type Set struct {
	Changes   []Change
	Truncated bool
	lower     *os.File // nil: the workspace started empty
	upper     *os.File
	merged    *os.File
}

// Changes compares the overlay's upper layer with the original workspace
// lowerDir ("" when it started empty). upper and merged are the directory
// descriptors the sandbox's init handed over.
func Changes(lowerDir string, upper, merged *os.File) (*Set, error) {
	up, err := reopen(upper)
	if err != nil {
		return nil, err
	}
	s := &Set{upper: up, merged: merged}
	if lowerDir != "" {
		if s.lower, err = os.OpenFile(lowerDir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return nil, err
		}
	}
	if err := s.walk(""); err != nil {
		return nil, err
	}
	sort.Slice(s.Changes, func(i, j int) bool { return s.Changes[i].Path < s.Changes[j].Path })
	return s, nil
}

func (s *Set) add(c Change) {
	if len(s.Changes) >= MaxChanges {
		s.Truncated = true
		return
	}
	s.Changes = append(s.Changes, c)
}

func typeOf(mode uint32) string {
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

// lowerStat stats rel in the original workspace without following links.
func (s *Set) lowerStat(rel string) (unix.Stat_t, bool) {
	if s.lower == nil {
		return unix.Stat_t{}, false
	}
	dir, err := openDir(s.lower, path.Dir(rel))
	if err != nil {
		return unix.Stat_t{}, false
	}
	defer dir.Close()
	st, err := lstatAt(dir, path.Base(rel))
	return st, err == nil
}

func (s *Set) walk(rel string) error {
	d, names, err := listDir(s.upper, rel)
	if err != nil {
		return err
	}
	defer d.Close()
	if rel != "" && isOpaque(d) {
		s.deleteLower(rel, names)
	}
	for _, name := range names {
		if s.Truncated {
			return nil
		}
		p := path.Join(rel, name)
		st, err := lstatAt(d, name)
		if err != nil {
			continue
		}
		lst, inLower := s.lowerStat(p)
		kind := Added
		if inLower {
			kind = Modified
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev == 0 { // an overlay whiteout: deleted
				if inLower {
					s.deleted(p, lst)
				}
				continue
			}
			s.add(Change{Path: p, Kind: kind, Type: "device"})
		case unix.S_IFDIR:
			if !inLower || lst.Mode&unix.S_IFMT != unix.S_IFDIR {
				if inLower {
					s.deleted(p, lst)
				}
				s.add(Change{Path: p, Kind: Added, Type: "dir"})
			}
			if err := s.walk(p); err != nil {
				return err
			}
		case unix.S_IFREG:
			c := Change{Path: p, Kind: kind, Type: "file", Size: st.Size}
			if inLower && lst.Mode&unix.S_IFMT == unix.S_IFREG && lst.Size == st.Size && lst.Mode == st.Mode {
				if same, _ := s.sameContent(p); same {
					continue // copied up for metadata only, content unchanged
				}
			}
			if inLower && lst.Mode&unix.S_IFMT != unix.S_IFREG {
				s.deleted(p, lst)
				c.Kind = Added
			}
			s.add(c)
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			n, _ := unix.Readlinkat(int(d.Fd()), name, buf)
			s.add(Change{Path: p, Kind: kind, Type: "symlink", Link: string(buf[:max(n, 0)])})
		default:
			s.add(Change{Path: p, Kind: kind, Type: typeOf(st.Mode)})
		}
	}
	return nil
}

// deleted records rel as deleted, and everything under it if a directory.
func (s *Set) deleted(rel string, st unix.Stat_t) {
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		s.deleteLower(rel, nil)
		return
	}
	s.add(Change{Path: rel, Kind: Deleted, Type: typeOf(st.Mode), Size: st.Size})
}

// deleteLower records every lower entry under rel, except the names kept,
// as deleted (an opaque or replaced directory).
func (s *Set) deleteLower(rel string, keep []string) {
	if s.lower == nil {
		return
	}
	d, err := openDir(s.lower, rel)
	if err != nil {
		return
	}
	defer d.Close()
	names, _ := d.Readdirnames(MaxDeletedWalk)
	slices.Sort(names)
	for _, n := range names {
		if slices.Contains(keep, n) {
			continue
		}
		st, err := lstatAt(d, n)
		if err != nil {
			continue
		}
		s.deleted(path.Join(rel, n), st)
	}
}

func isOpaque(d *os.File) bool {
	buf := make([]byte, 8)
	n, err := unix.Fgetxattr(int(d.Fd()), "user.overlay.opaque", buf)
	return err == nil && n > 0 && buf[0] == 'y'
}

func (s *Set) sameContent(rel string) (bool, error) {
	a, err := readCapped(s.lower, rel, MaxDiffFile)
	if err != nil {
		return false, err
	}
	b, err := readCapped(s.upper, rel, MaxDiffFile)
	if err != nil {
		return false, err
	}
	return bytes.Equal(a, b), nil
}

func isText(b []byte) bool {
	head := b[:min(len(b), 8000)]
	return bytes.IndexByte(head, 0) < 0 && utf8.Valid(b)
}

// WriteDiff writes a unified diff of the text changes; binary, oversized,
// special and deleted files are named.
func (s *Set) WriteDiff(w io.Writer) error {
	for i := range s.Changes {
		c := &s.Changes[i]
		var err error
		switch c.Type {
		case "file":
			err = s.fileDiff(w, c)
		case "symlink":
			_, err = fmt.Fprintf(w, "%s symlink %s -> %s\n", c.Kind, untrusted.Quote(c.Path), untrusted.Quote(c.Link))
		case "dir":
			if c.Kind == Added {
				_, err = fmt.Fprintf(w, "new directory %s\n", untrusted.Quote(c.Path))
			} else {
				_, err = fmt.Fprintf(w, "deleted directory %s\n", untrusted.Quote(c.Path))
			}
		default:
			_, err = fmt.Fprintf(w, "%s %s %s (not shown)\n", c.Kind, c.Type, untrusted.Quote(c.Path))
		}
		if err != nil {
			return err
		}
	}
	if s.Truncated {
		_, err := fmt.Fprintf(w, "airlock: more than %d changes; the rest are not shown\n", MaxChanges)
		return err
	}
	return nil
}

func (s *Set) fileDiff(w io.Writer, c *Change) error {
	var old, cur []byte
	var err error
	if c.Kind != Added {
		if old, err = readCapped(s.lower, c.Path, MaxDiffFile); err != nil {
			return s.named(w, c, err)
		}
	}
	if c.Kind != Deleted {
		if cur, err = readCapped(s.upper, c.Path, MaxDiffFile); err != nil {
			return s.named(w, c, err)
		}
	}
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
	case errors.Is(err, ErrTooLarge):
		_, err = fmt.Fprintf(w, "%s file %s (%d bytes, too large to diff)\n", c.Kind, untrusted.Quote(c.Path), c.Size)
	case errors.Is(err, ErrNotRegular):
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

// Export copies the workspace as the sandbox left it into dst, which must
// not exist yet. Only directories, regular files (sparse-aware), both
// without setuid or setgid bits, and symlinks that cannot resolve outside
// dst (untrusted.LinkInside) are written; everything else is skipped and
// named in the returned list.
func (s *Set) Export(dst string) (skipped []string, err error) {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	src, err := reopen(s.merged)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	owner := exportOwner()
	err = exportDir(src, out, "", owner, &skipped)
	return skipped, err
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

func exportDir(src, out *os.File, rel string, owner [2]int, skipped *[]string) error {
	d, names, err := listDir(src, rel)
	if err != nil {
		return err
	}
	defer d.Close()
	for _, name := range names {
		p := path.Join(rel, name)
		st, err := lstatAt(d, name)
		if err != nil {
			continue
		}
		perm := hostMode(st.Mode)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := unix.Mkdirat(int(out.Fd()), p, perm|0o700); err != nil {
				return fmt.Errorf("export mkdir %s: %w", p, err)
			}
			_ = unix.Fchownat(int(out.Fd()), p, owner[0], owner[1], unix.AT_SYMLINK_NOFOLLOW)
			if err := exportDir(src, out, p, owner, skipped); err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := exportFile(src, out, p, perm, owner); err != nil {
				return err
			}
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(int(d.Fd()), name, buf)
			if err != nil {
				continue
			}
			target := string(buf[:n])
			if !untrusted.LinkInside(p, target) {
				*skipped = append(*skipped, fmt.Sprintf("%s (symlink to %s: it could resolve outside the export)", untrusted.Quote(p), untrusted.Quote(target)))
				continue
			}
			if err := unix.Symlinkat(target, int(out.Fd()), p); err != nil {
				return fmt.Errorf("export symlink %s: %w", p, err)
			}
			_ = unix.Fchownat(int(out.Fd()), p, owner[0], owner[1], unix.AT_SYMLINK_NOFOLLOW)
		default:
			*skipped = append(*skipped, fmt.Sprintf("%s (%s)", untrusted.Quote(p), typeOf(st.Mode)))
		}
	}
	return nil
}

func exportFile(src, out *os.File, rel string, perm uint32, owner [2]int) error {
	in, fi, err := openRegular(src, rel)
	if err != nil {
		return err
	}
	defer in.Close()
	fd, err := unix.Openat(int(out.Fd()), rel, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return fmt.Errorf("export create %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if err := copySparse(f, in, fi.Size()); err != nil {
		return fmt.Errorf("export copy %s: %w", rel, err)
	}
	// Set the mode explicitly: umask is not ours to trust, and perm has no
	// setuid or setgid (hostMode).
	if err := f.Chmod(os.FileMode(perm)); err != nil {
		return err
	}
	if owner[0] >= 0 {
		_ = f.Chown(owner[0], owner[1])
	}
	return nil
}

// MaxHashedFile caps the files Digest reads.
const MaxHashedFile = 64 << 20

// Digest is the SHA-256 (hex) of a changed regular file's new contents,
// read from the merged view by the safe-access rules; "" for what is not a
// regular file now, or is larger than MaxHashedFile.
func (s *Set) Digest(c Change) string {
	if c.Type != "file" || c.Kind == Deleted || c.Size > MaxHashedFile {
		return ""
	}
	f, fi, err := openRegular(s.merged, c.Path)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, min(fi.Size(), MaxHashedFile))); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}
