package rootfs

import (
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ReadSmall reads rel inside root without leaving it (symlinks resolved
// within root, no magic links, no other mounts), up to 1 MiB; "" on error.
func ReadSmall(root, rel string) string {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(rfd)
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	fd, err := unix.Openat2(rfd, filepath.Clean(rel), &how)
	if err != nil {
		return ""
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(b)
}
