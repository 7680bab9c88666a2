package gvisor

import (
	"fmt"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/linux/mount"
	"github.com/airlock-sandbox/airlock/internal/wall"
)

// cloneTrees clones each of trees (recursively, read-only, nosuid, nodev)
// into a detached mount, in the host's mount namespace, for attachTrees
// in the sandbox's. A tree may be a descriptor of the daemon's
// (/proc/self/fd/N: a tenant's directory image, a snapshot's root, opened
// where its path was checked), on a mount of the host's namespace:
// overlayfs refuses such a mount as a lower layer from another namespace
// ("failed to clone lowerpath"), nothing can be bound from it there, and
// runsc, another process, could not resolve the path at all.
func cloneTrees(trees []wall.Tree) (fds []int, err error) {
	defer func() {
		if err != nil {
			closeTrees(fds)
		}
	}()
	for _, t := range trees {
		fd, err := unix.OpenTree(unix.AT_FDCWD, t.HostPath, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return fds, fmt.Errorf("open_tree %s: %w", t.HostPath, err)
		}
		fds = append(fds, fd)
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
			return fds, fmt.Errorf("mount_setattr %s: %w", t.HostPath, err)
		}
	}
	return fds, nil
}

func closeTrees(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// attachTrees attaches the clones of cloneTrees under dir (in the
// sandbox's mount namespace) and returns where: the sources of the root
// and the trees, in Options.Trees' order.
func attachTrees(fds []int, dir string) ([]string, error) {
	var at []string
	for i, fd := range fds {
		p := filepath.Join(dir, strconv.Itoa(i))
		if err := unix.Mkdir(p, 0o755); err != nil {
			return nil, fmt.Errorf("mkdir %s: %w", p, err)
		}
		if err := mount.MoveTo(fd, p); err != nil {
			return nil, err
		}
		at = append(at, p)
	}
	return at, nil
}
