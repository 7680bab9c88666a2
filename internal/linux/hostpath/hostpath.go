// Package hostpath opens a host path someone else named (a tenant's
// workspace, repository or image) beneath the root the operator granted:
// openat2 from a descriptor of the root with RESOLVE_BENEATH (no "..", no
// absolute or relative link leads out of it) and RESOLVE_NO_MAGICLINKS.
// It returns an O_PATH descriptor, and callers use that descriptor (its
// /proc/self/fd path) from then on, never the name again: a directory
// swapped for a link after the open changes nothing. It imports x/sys only.
package hostpath

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrOutside: the path is not under the root (by name, or by a link).
var ErrOutside = errors.New("not beneath the root")

// Open opens p (absolute, clean) as an O_PATH descriptor. With root ""
// it is opened as it is, links followed (a user's own path, airlock run).
// Otherwise p must lie under root (absolute, clean) and is resolved
// beneath it: root is a real path (as roots are kept) and opened without
// following a link; nothing below it may lead out.
func Open(root, p string) (*os.File, error) {
	if !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsRune(p, 0) {
		return nil, fmt.Errorf("%q: not an absolute, clean path", p)
	}
	if root == "" {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: p, Err: err}
		}
		return os.NewFile(uintptr(fd), p), nil
	}
	rel, ok := Rel(root, p)
	if !ok {
		return nil, fmt.Errorf("%s: %w %s", p, ErrOutside, root)
	}
	// The root is kept by its real path: a link in it now means its name
	// was swapped since it was granted (a tenant that can rename its root,
	// say /home/alice/work, for a link to the data directory), so it is not
	// followed.
	rfd, err := unix.Openat2(unix.AT_FDCWD, root, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s: %w %s (the root's own path now passes through a link)", p, ErrOutside, root)
	}
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: root, Err: err}
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.EXDEV) {
		return nil, fmt.Errorf("%s: %w %s (a link leads out)", p, ErrOutside, root)
	}
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// Rel is p relative to root ("." for root itself), and whether p lies
// under root at all; both absolute and clean.
func Rel(root, p string) (string, bool) {
	for _, s := range []string{root, p} {
		if !path.IsAbs(s) || path.Clean(s) != s || strings.ContainsRune(s, 0) {
			return "", false
		}
	}
	if p == root {
		return ".", true
	}
	prefix := strings.TrimSuffix(root, "/") + "/"
	rel, ok := strings.CutPrefix(p, prefix)
	return rel, ok
}

// FDPath is the path through which this process reaches what f holds,
// whatever has since happened to its name.
func FDPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }
