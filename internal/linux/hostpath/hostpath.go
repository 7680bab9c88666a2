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
// beneath it: root itself is the operator's (or the daemon's) and opened as
// it is; nothing below it may lead out.
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
	rfd, err := unix.Openat2(unix.AT_FDCWD, root, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	})
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
