// Package safefs is the host's safe reader of trees a sandbox wrote: every
// open is openat2 confined to a root descriptor without following links or
// crossing mounts, every read is capped, and every walk (Walker) goes one
// directory descriptor at a time within a depth, path, entry, name and
// time budget, naming what it leaves out (Unread). The change sets, the
// archive, the export and the snapshot writer all read through it.
//
// It imports internal/untrusted and x/sys only; nothing of the rest of
// internal/workspace.
package safefs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// A sandbox writes whatever it likes into its workspace, so the host reads
// it as hostile: every open is openat2 relative to a root descriptor with
// RESOLVE_IN_ROOT (".." and absolute symlinks stay inside),
// RESOLVE_NO_MAGICLINKS (no /proc/self/fd tricks), RESOLVE_NO_XDEV (no
// wandering onto other mounts) and RESOLVE_NO_SYMLINKS for the final
// component; files are opened O_NOFOLLOW|O_NONBLOCK (a fifo cannot block
// us), must be regular files, and are read up to a cap.
const Resolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_SYMLINKS

// ErrNotRegular is returned when a path is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned when a file exceeds the read cap.
var ErrTooLarge = errors.New("file too large")

// OpenIn opens rel below root with openat2 (Resolve), never following a
// final symlink nor blocking on a fifo.
func OpenIn(root *os.File, rel string, flags int) (*os.File, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK), Resolve: Resolve}
	fd, err := unix.Openat2(int(root.Fd()), rel, &how)
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// OpenDir opens a directory below root.
func OpenDir(root *os.File, rel string) (*os.File, error) {
	if rel == "" || rel == "." {
		rel = "."
	}
	return OpenIn(root, rel, unix.O_RDONLY|unix.O_DIRECTORY)
}

// ListDir opens a directory below root and returns it with its entries,
// sorted. The caller closes the directory.
func ListDir(root *os.File, rel string) (*os.File, []string, error) {
	d, err := OpenDir(root, rel)
	if err != nil {
		return nil, nil, err
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	slices.Sort(names)
	return d, names, nil
}

// OpenRegular opens a regular file below root for reading.
func OpenRegular(root *os.File, rel string) (*os.File, os.FileInfo, error) {
	f, err := OpenIn(root, rel, unix.O_RDONLY)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", rel, ErrNotRegular)
	}
	return f, fi, nil
}

// ReadCapped reads a whole regular file below root, up to max bytes.
func ReadCapped(root *os.File, rel string, max int64) ([]byte, error) {
	f, fi, err := OpenRegular(root, rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() > max {
		return nil, fmt.Errorf("%s: %w (%d bytes, cap %d)", rel, ErrTooLarge, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: %w", rel, ErrTooLarge)
	}
	return b, nil
}

// LstatAt stats name in dir without following a final symlink.
func LstatAt(dir *os.File, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// Reopen turns an O_PATH directory descriptor into a readable one.
func Reopen(f *os.File) (*os.File, error) {
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: Resolve}
	fd, err := unix.Openat2(int(f.Fd()), ".", &how)
	if err != nil {
		return nil, fmt.Errorf("reopen %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// CopySparse copies src to dst skipping holes (SEEK_DATA/SEEK_HOLE), so a
// huge sparse file costs only its real data.
func CopySparse(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	var off int64
	for off < size {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("lseek SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("lseek SEEK_HOLE: %w", err)
		}
		if _, err := io.Copy(io.NewOffsetWriter(dst, data), io.NewSectionReader(src, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// HostMode is the mode a file or directory gets when the host writes what
// a sandbox made (export, snapshots): its permission bits and sticky, never
// setuid or setgid. On the host those would run a program as, or hand a
// directory's group to, whoever the file is mapped to: root, for what the
// sandbox's root made.
func HostMode(mode uint32) uint32 { return mode & (0o777 | unix.S_ISVTX) }
