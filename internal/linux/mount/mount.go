// Package mount wraps the new mount API (open_tree, mount_setattr,
// move_mount) and the few classic mount(2) calls airlock needs, and makes
// the user namespaces an idmapped mount takes its mapping from. Kernel
// errors are prefixed with the syscall. Only x/sys is imported.
package mount

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// IdmappedTree clones the mount tree at path (recursively) into a detached
// mount whose ownership is shifted by the user namespace usernsFD, read-only,
// nosuid and nodev. The returned fd can cross a process boundary and be
// attached with MoveTo inside the sandbox's mount namespace. A final
// symlink is not followed, except a /proc/self/fd/N path: a directory this
// process opened earlier (safely), cloned as it is.
func IdmappedTree(path string, usernsFD int, readOnly bool) (int, error) {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_RECURSIVE
	if !strings.HasPrefix(path, "/proc/self/fd/") {
		flags |= unix.AT_SYMLINK_NOFOLLOW
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, uint(flags))
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	attr := &unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(usernsFD),
	}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr idmap %s: %w", path, err)
	}
	return fd, nil
}

// MoveTo attaches the detached tree fd at target.
func MoveTo(fd int, target string) error {
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount %s: %w", target, err)
	}
	return nil
}

// Mount is mount(2) with the error prefixed.
func Mount(source, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", source, target, fstype, err)
	}
	return nil
}

// Bind bind-mounts source on target, then applies flags (MS_RDONLY,
// MS_NOSUID, MS_NODEV, MS_NOEXEC) with a remount, as the kernel requires.
func Bind(source, target string, flags uintptr) error {
	if err := Mount(source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if flags == 0 {
		return nil
	}
	return Remount(target, flags)
}

// Remount changes a bind mount's per-mount flags. Flags the kernel has
// locked (inherited from a more privileged namespace) are kept.
func Remount(target string, flags uintptr) error {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", target, err)
	}
	locked := uintptr(st.Flags) & (unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_RELATIME | unix.MS_NODIRATIME)
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|flags|locked, ""); err != nil {
		return fmt.Errorf("remount %s: %w", target, err)
	}
	return nil
}

// MaskFile hides a file by binding devNull over it, read-only. The mask
// must not be nodev: reading it should give nothing, not EACCES.
func MaskFile(devNull, target string) error {
	if _, err := os.Lstat(target); err != nil {
		return nil // absent on this kernel: nothing to mask
	}
	return Bind(devNull, target, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC)
}

// MaskDir hides a directory under an empty read-only tmpfs.
func MaskDir(target string) error {
	if fi, err := os.Lstat(target); err != nil || !fi.IsDir() {
		return nil
	}
	return Mount("tmpfs", target, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=555")
}

// ReadOnly makes an existing path a read-only bind of itself.
func ReadOnly(target string) error {
	if _, err := os.Lstat(target); err != nil {
		return nil
	}
	return Bind(target, target, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
}
