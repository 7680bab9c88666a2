// Package unpack applies an OCI image's layers (tar streams) to a root
// directory as hostile input: every entry is written relative to a
// directory descriptor without following links, whiteouts and opaque
// directories are honoured, and path traversal, writes through symlinks,
// hard links out of the image, device nodes and archives past their caps
// are refused (ErrHostile). It imports internal/errdefs and x/sys.
package unpack

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// ErrHostile classes archives refused for what they contain; it is an
// invalid argument as far as callers are concerned.
var ErrHostile = fmt.Errorf("refused image archive (%w)", errdefs.ErrInvalidArgument)

// Hostile is an ErrHostile error saying what was refused.
func Hostile(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrHostile, fmt.Sprintf(format, a...))
}

// MaxImageEntries caps the tar entries of one image, all layers together.
const MaxImageEntries = 1 << 21

// Unpacker applies image layers to a root directory with the image's own
// ownership and modes. Every path is resolved component by component from
// a directory descriptor without following symlinks, so an entry can never
// be written outside the root: ".." components, entries below a symlink,
// hard links that leave the root or point at anything but a regular file,
// and device nodes are refused with ErrHostile.
type Unpacker struct {
	root     int
	maxBytes int64
	written  int64
	// entries counts the tar entries of every layer, up to maxEntries:
	// empty files cost no bytes but an inode each, and their headers
	// compress to almost nothing.
	entries, maxEntries int64
	// created holds the paths this layer has written, which its own
	// whiteouts must not remove.
	created map[string]bool
	// progress counts bytes for the progress reporter.
	progress func(n int64)
}

// New opens rootDir (an empty directory the caller made) for unpacking at
// most maxBytes; progress, when set, is given the bytes of each write.
func New(rootDir string, maxBytes int64, progress func(int64)) (*Unpacker, error) {
	fd, err := unix.Open(rootDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", rootDir, err)
	}
	return &Unpacker{root: fd, maxBytes: maxBytes, maxEntries: MaxImageEntries, progress: progress}, nil
}

// Written is how many bytes of file content the layers have written.
func (u *Unpacker) Written() int64 { return u.written }

// Close releases the root directory.
func (u *Unpacker) Close() { unix.Close(u.root) }

// cleanName turns a tar entry name into a clean relative path, or refuses it.
func cleanName(name string) (string, error) {
	n := strings.TrimLeft(name, "/")
	for strings.HasPrefix(n, "./") {
		n = strings.TrimLeft(n[2:], "/")
	}
	if strings.IndexByte(n, 0) >= 0 {
		return "", Hostile("entry %q has a NUL byte", name)
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", Hostile("entry %q: path traversal", name)
		}
	}
	n = path.Clean(n)
	if n == "." {
		return "", nil
	}
	return n, nil
}

// openDir walks rel from the root, one component at a time, never following
// a symlink. With create, missing directories are made (mode 0755, root).
// It returns -1 and no error when a component is missing and !create.
func (u *Unpacker) openDir(rel string, create bool) (int, error) {
	cur, err := unix.Dup(u.root)
	if err != nil {
		return -1, err
	}
	if rel == "" || rel == "." {
		return cur, nil
	}
	for _, c := range strings.Split(rel, "/") {
		var st unix.Stat_t
		err := unix.Fstatat(cur, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case errors.Is(err, unix.ENOENT):
			if !create {
				unix.Close(cur)
				return -1, nil
			}
			if err := unix.Mkdirat(cur, c, 0o755); err != nil {
				unix.Close(cur)
				return -1, fmt.Errorf("mkdir %s: %w", rel, err)
			}
		case err != nil:
			unix.Close(cur)
			return -1, err
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			unix.Close(cur)
			return -1, Hostile("entry below %q is written through a symlink", rel)
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			unix.Close(cur)
			return -1, Hostile("entry below %q: a parent is not a directory", rel)
		}
		next, err := unix.Openat(cur, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", rel, err)
		}
		cur = next
	}
	return cur, nil
}

// removeAt deletes name in dir, recursively for directories.
func removeAt(dir int, name string) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	sub, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(sub), name)
	names, _ := f.Readdirnames(-1)
	for _, n := range names {
		if err := removeAt(sub, n); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
}

// ApplyLayer extracts one uncompressed layer tarball.
func (u *Unpacker) ApplyLayer(ctx context.Context, r io.Reader) error {
	u.created = map[string]bool{}
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if n%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return Hostile("corrupt layer: %v", err)
		}
		if u.entries++; u.entries > u.maxEntries {
			return fmt.Errorf("%w: image has more than %d entries", errdefs.ErrResourceExhausted, u.maxEntries)
		}
		if err := u.entry(hdr, tr); err != nil {
			return err
		}
	}
}

func (u *Unpacker) entry(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "" {
		return nil // the root itself
	}
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")

	// Whiteouts (OCI image spec): remove what lower layers put here.
	if base == ".wh..wh..opq" {
		return u.opaque(dir)
	}
	if strings.HasPrefix(base, ".wh.") {
		target := path.Join(dir, base[len(".wh."):])
		if u.created[target] {
			return nil
		}
		pd, err := u.openDir(dir, false)
		if err != nil || pd < 0 {
			return err
		}
		defer unix.Close(pd)
		return removeAt(pd, base[len(".wh."):])
	}

	pd, err := u.openDir(dir, true)
	if err != nil {
		return err
	}
	defer unix.Close(pd)
	u.created[name] = true
	mode := uint32(hdr.Mode & 0o7777)

	var existing unix.Stat_t
	exists := unix.Fstatat(pd, base, &existing, unix.AT_SYMLINK_NOFOLLOW) == nil
	if exists && !(hdr.Typeflag == tar.TypeDir && existing.Mode&unix.S_IFMT == unix.S_IFDIR) {
		if err := removeAt(pd, base); err != nil {
			return fmt.Errorf("replace %s: %w", name, err)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir %s: %w", name, err)
		}
	case tar.TypeReg, tar.TypeRegA:
		if u.written+hdr.Size > u.maxBytes {
			return fmt.Errorf("%w: image larger than the cache cap (%d bytes)", errdefs.ErrResourceExhausted, u.maxBytes)
		}
		fd, err := unix.Openat(pd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		f := os.NewFile(uintptr(fd), name)
		n, err := io.Copy(f, io.LimitReader(r, hdr.Size))
		u.written += n
		if u.progress != nil {
			u.progress(n)
		}
		if err == nil && n != hdr.Size {
			err = Hostile("entry %s is truncated", name)
		}
		if err == nil {
			err = f.Chown(hdr.Uid, hdr.Gid)
		}
		if err == nil {
			err = f.Chmod(os.FileMode(mode&0o777) | goMode(mode))
		}
		if err == nil {
			ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
			_ = unix.UtimesNanoAt(pd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		return nil
	case tar.TypeSymlink:
		if strings.IndexByte(hdr.Linkname, 0) >= 0 || hdr.Linkname == "" {
			return Hostile("symlink %s has a bad target", name)
		}
		if err := unix.Symlinkat(hdr.Linkname, pd, base); err != nil {
			return fmt.Errorf("symlink %s: %w", name, err)
		}
		return unix.Fchownat(pd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil || target == "" {
			return Hostile("hard link %s -> %q leaves the image", name, hdr.Linkname)
		}
		tdir, tbase := path.Split(target)
		td, err := u.openDir(strings.TrimSuffix(tdir, "/"), false)
		if err != nil {
			return err
		}
		if td < 0 {
			return Hostile("hard link %s -> %s: target missing", name, target)
		}
		defer unix.Close(td)
		var st unix.Stat_t
		if err := unix.Fstatat(td, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return Hostile("hard link %s -> %s: target is not a regular file in the image", name, target)
		}
		if err := unix.Linkat(td, tbase, pd, base, 0); err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
		return nil
	case tar.TypeFifo:
		if err := unix.Mknodat(pd, base, unix.S_IFIFO|mode&0o777, 0); err != nil {
			return fmt.Errorf("mkfifo %s: %w", name, err)
		}
	case tar.TypeChar, tar.TypeBlock:
		return Hostile("entry %s is a device node", name)
	default:
		return nil // PAX/GNU metadata the reader already folded in, or unknown: skipped
	}
	if err := unix.Fchownat(pd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	// Chmod after chown: chown clears setuid/setgid bits.
	return unix.Fchmodat(pd, base, mode, 0)
}

// goMode carries setuid, setgid and sticky into an os.FileMode.
func goMode(m uint32) os.FileMode {
	var fm os.FileMode
	if m&unix.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// opaque empties dir of everything lower layers put there.
func (u *Unpacker) opaque(dir string) error {
	d, err := u.openDir(dir, true)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	dup, err := unix.Dup(d)
	if err != nil {
		return err
	}
	lf := os.NewFile(uintptr(dup), dir)
	names, _ := lf.Readdirnames(-1)
	lf.Close()
	for _, n := range names {
		if u.created[path.Join(dir, n)] {
			continue
		}
		if err := removeAt(d, n); err != nil {
			return err
		}
	}
	return nil
}
