package workspace

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
)

// MaxTarEntries caps the entries of one archive.
const MaxTarEntries = 100_000

// Tar writes the tree at rel under root (a sandbox's merged workspace) as
// a tar stream, reading it from the host by the safe-access rules: a walk
// by directory descriptors (safefs.Walker), no symlink or magic-link
// following,
// regular files and directories only (symlinks are recorded, never
// followed; a file's further hard links are hard-link entries, its content
// shipped once; other types, and what the walk could not read, are
// skipped and named). No setuid or setgid bit is recorded (safefs.HostMode): root
// unpacking the archive would otherwise get them.
//
// The tree is walked twice, on a sandbox that does not change meanwhile
// (frozen): first to count it — more than maxBytes of file content or
// MaxTarEntries entries fails with ErrTooLarge before anything is written
// —, then to write it. start is called between the two with what will be
// skipped and returns where the stream goes, so that a caller can answer
// an error, or say what is left out, before the first byte.
func Tar(ctx context.Context, root *os.File, rel string, maxBytes int64, start func(skipped []string) io.Writer) error {
	rel = strings.Trim(path.Clean("/"+rel), "/")
	plan := &tarWalk{w: safefs.NewWalker(ctx), links: safefs.Links{}}
	if err := plan.run(root, rel); err != nil {
		return err
	}
	switch {
	case plan.bytes > maxBytes:
		return fmt.Errorf("%w: more than %d bytes of files under /workspace/%s", safefs.ErrTooLarge, maxBytes, rel)
	case plan.entries > MaxTarEntries:
		return fmt.Errorf("%w: more than %d entries under /workspace/%s", safefs.ErrTooLarge, MaxTarEntries, rel)
	}
	var skipped []string
	for _, u := range plan.w.Unread() {
		skipped = append(skipped, u.String())
	}
	tw := tar.NewWriter(start(skipped))
	// The second walk ships exactly what the first counted: the same
	// limits, and no time limit of its own (the first one's end is where
	// both stop).
	out := &tarWalk{w: safefs.NewWalker(context.Background()), links: safefs.Links{}, tw: tw, budget: plan.bytes, stopAt: plan.entries}
	if err := out.run(root, rel); err != nil {
		return err
	}
	return tw.Close()
}

// tarWalk is one walk of Tar: counting (tw nil) or writing.
type tarWalk struct {
	w       *safefs.Walker
	links   safefs.Links
	tw      *tar.Writer
	budget  int64 // writing: bytes of content at most (what was counted)
	stopAt  int   // writing: entries at most (what was counted)
	bytes   int64 // content bytes
	entries int
}

// run walks the tree at rel under root (through a descriptor of its own:
// a directory's read position is per descriptor).
func (t *tarWalk) run(root *os.File, rel string) error {
	r, err := safefs.Reopen(root)
	if err != nil {
		return err
	}
	defer r.Close()
	if rel == "" {
		return t.dir(r, ".", 0)
	}
	// Down to rel's parent, one name at a time.
	parts := strings.Split(rel, "/")
	d := r
	for i, name := range parts[:len(parts)-1] {
		sub, err := safefs.OpenIn(d, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if d != r {
			d.Close()
		}
		if err != nil {
			return notExist(strings.Join(parts[:i+1], "/"), err)
		}
		d = sub
	}
	if d != r {
		defer d.Close()
	}
	name := parts[len(parts)-1]
	st, err := safefs.LstatAt(d, name)
	if err != nil {
		return notExist(rel, err)
	}
	return t.add(d, name, rel, st, len(parts))
}

func notExist(rel string, err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENAMETOOLONG) {
		return fmt.Errorf("%s: %w", rel, os.ErrNotExist)
	}
	return err
}

func (t *tarWalk) dir(d *os.File, rel string, depth int) error {
	for _, n := range t.w.List(d, rel) {
		if t.w.Stopped(rel) {
			return nil
		}
		st, err := safefs.LstatAt(d, n)
		if err != nil {
			continue // gone meanwhile
		}
		if err := t.add(d, n, safefs.Join(rel, n), st, depth); err != nil {
			return err
		}
	}
	return nil
}

// add puts entry name of directory dir (at p) in the archive.
func (t *tarWalk) add(dir *os.File, name, p string, st unix.Stat_t, depth int) error {
	if t.tw != nil && t.entries >= t.stopAt {
		return nil
	}
	h := &tar.Header{Name: p, Mode: int64(safefs.HostMode(st.Mode)), ModTime: timeOf(st), Format: tar.FormatPAX}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag, h.Name = tar.TypeDir, p+"/"
		if err := t.header(h); err != nil {
			return err
		}
		sub := t.w.Enter(dir, name, p, depth+1)
		if sub == nil {
			return nil
		}
		defer sub.Close()
		return t.dir(sub, p, depth+1)
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return err
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, string(buf[:n])
		return t.header(h)
	case unix.S_IFREG:
		if first := t.links.First(&st, p); first != "" {
			h.Typeflag, h.Linkname = tar.TypeLink, first
			return t.header(h)
		}
		if t.tw == nil {
			t.bytes += st.Size
			t.entries++
			return nil
		}
		f, fi, err := safefs.OpenRegular(dir, name)
		if err != nil {
			return err
		}
		defer f.Close()
		if t.bytes += fi.Size(); t.bytes > t.budget {
			return fmt.Errorf("%w: %s grew while the sandbox was frozen", safefs.ErrTooLarge, p)
		}
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		if err := t.header(h); err != nil {
			return err
		}
		_, err = io.CopyN(t.tw, f, fi.Size())
		return err
	}
	t.w.Skip(p, safefs.TypeOf(st.Mode)+": not archived")
	return nil
}

// header counts an entry, and writes it when writing.
func (t *tarWalk) header(h *tar.Header) error {
	t.entries++
	if t.tw == nil {
		return nil
	}
	return t.tw.WriteHeader(h)
}

func timeOf(st unix.Stat_t) time.Time { return time.Unix(st.Mtim.Sec, st.Mtim.Nsec) }
