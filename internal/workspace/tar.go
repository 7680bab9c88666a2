package workspace

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Tar writes the tree at rel under root (a sandbox's merged workspace) to
// w as a tar stream, reading it from the host by the safe-access rules:
// openat2 confined to root, no symlink or magic-link following, regular
// files and directories only (symlinks are recorded, never followed; other
// types are skipped and named in skipped). At most maxBytes of file
// content is written; past it Tar fails with ErrTooLarge. No setuid or
// setgid bit is recorded (hostMode): root unpacking the archive would
// otherwise get them.
func Tar(root *os.File, rel string, w io.Writer, maxBytes int64) (skipped []string, err error) {
	rel = strings.Trim(path.Clean("/"+rel), "/")
	if rel == "" {
		rel = "."
	}
	r, err := reopen(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	tw := tar.NewWriter(w)
	var total int64
	var walk func(rel string) error
	add := func(rel string, st unix.Stat_t, dir *os.File, name string) error {
		h := &tar.Header{Name: rel, Mode: int64(hostMode(st.Mode)), ModTime: timeOf(st), Format: tar.FormatPAX}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			h.Typeflag, h.Name = tar.TypeDir, rel+"/"
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			return walk(rel)
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, string(buf[:n])
			return tw.WriteHeader(h)
		case unix.S_IFREG:
			f, fi, err := openRegular(r, rel)
			if err != nil {
				return err
			}
			defer f.Close()
			if total += fi.Size(); total > maxBytes {
				return fmt.Errorf("%w: more than %d bytes under %s", ErrTooLarge, maxBytes, rel)
			}
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, fi.Size())
			return err
		}
		skipped = append(skipped, rel)
		return nil
	}
	walk = func(rel string) error {
		d, names, err := listDir(r, rel)
		if err != nil {
			return err
		}
		defer d.Close()
		for _, n := range names {
			st, err := lstatAt(d, n)
			if err != nil {
				continue // gone meanwhile
			}
			if err := add(path.Join(rel, n), st, d, n); err != nil {
				return err
			}
		}
		return nil
	}
	if rel == "." {
		err = walk(".")
	} else {
		parent, name := path.Split(rel)
		var d *os.File
		if d, err = openDir(r, strings.TrimSuffix(parent, "/")); err == nil {
			var st unix.Stat_t
			if st, err = lstatAt(d, name); err == nil {
				err = add(rel, st, d, name)
			}
			d.Close()
		}
	}
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return skipped, fmt.Errorf("%s: %w", rel, os.ErrNotExist)
		}
		return skipped, err
	}
	return skipped, tw.Close()
}

func timeOf(st unix.Stat_t) time.Time { return time.Unix(st.Mtim.Sec, st.Mtim.Nsec) }
