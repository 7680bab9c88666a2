// Package rootfs is what a sandbox's root is made of once resolved
// (Layout: host trees shown read-only, symlinks and the user database to
// generate), and the two kinds of image that need no unpacking: the host
// image (Host: the host's system directories and a sanitized template of
// part of its /etc, HostEtc) and a root filesystem directory (Dir). It
// imports internal/errdefs and x/sys.
package rootfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// HostEtc is the part of the host's /etc a sandbox of the host image sees,
// copied (world-readable files only, symlinks as links). It leaves out
// everything that names users, secrets or host services: passwd, shadow,
// group, sudoers, ssh, environment, gitconfig, machine-id, hostname.
var HostEtc = []string{
	"/etc/alternatives", "/etc/ssl", "/etc/ca-certificates", "/etc/ca-certificates.conf",
	"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/timezone",
	"/etc/nsswitch.conf", "/etc/os-release", "/etc/debian_version", "/etc/lsb-release",
	"/etc/mime.types", "/etc/protocols", "/etc/services", "/etc/ethertypes",
	"/etc/bash.bashrc", "/etc/profile", "/etc/profile.d", "/etc/inputrc", "/etc/skel",
	"/etc/gai.conf", "/etc/host.conf", "/etc/magic", "/etc/mke2fs.conf",
	"/etc/python3", "/etc/python3.11", "/etc/perl", "/etc/vim", "/etc/xdg", "/etc/dpkg", "/etc/apt",
	// account tools and PAM, for --user root (useradd, su, adduser)
	"/etc/pam.d", "/etc/pam.conf", "/etc/security", "/etc/login.defs", "/etc/adduser.conf",
	"/etc/deluser.conf", "/etc/default/useradd", "/etc/shells", "/etc/subuid", "/etc/subgid",
}

// hostDirs are the host's top-level system directories shown in the host
// image; on a merged-/usr host all but /usr are symlinks into it.
// /var/lib/dpkg is the package database of what /usr holds, so package
// tools inside (with --writable-rootfs) see the same system.
var hostDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/var/lib/dpkg"}

// Host returns the layout of the host image: a read-only view of the host's
// /usr (and /bin, /sbin, /lib* where they are real directories) and a
// sanitized /etc, built once into a template under etcDir.
func Host(etcDir string) (*Layout, error) {
	tmpl, err := hostEtcTemplate(etcDir)
	if err != nil {
		return nil, err
	}
	l := &Layout{Name: "host", Trees: []Tree{{HostPath: tmpl, Target: "/"}}}
	for _, d := range hostDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(d)
			if err != nil {
				return nil, err
			}
			l.Symlinks = append(l.Symlinks, Symlink{Path: d, Target: target})
		case fi.IsDir():
			l.Trees = append(l.Trees, Tree{HostPath: d, Target: d})
		}
	}
	l.Passwd = systemAccounts(ReadSmall("/", "etc/passwd"), basePasswd, 2)
	l.Group = systemAccounts(ReadSmall("/", "etc/group"), baseGroup, 2)
	return l, nil
}

// systemAccounts keeps the host's system accounts (ids below 1000, and
// 65534) from a passwd or group database, so that package tools find the
// users and groups the host's packages reference; human accounts are left
// out, passwords are always "x", and group member lists are dropped. The
// id is field idField. With no host database, base is returned.
func systemAccounts(db, base string, idField int) string {
	var b strings.Builder
	for _, line := range strings.Split(db, "\n") {
		f := strings.Split(line, ":")
		if len(f) < idField+2 || strings.HasPrefix(line, "#") {
			continue
		}
		id, err := strconv.Atoi(f[idField])
		if err != nil || id >= 1000 && id != 65534 {
			continue
		}
		f[1] = "x"
		if len(f) == 4 { // group: name:x:gid:members
			f[3] = ""
		}
		b.WriteString(strings.Join(f, ":") + "\n")
	}
	if b.Len() == 0 {
		return base
	}
	return b.String()
}

const (
	basePasswd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	baseGroup  = "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n"
)

// Tree is a host directory shown read-only at Target inside the sandbox.
type Tree struct {
	HostPath string
	Target   string
}

// Symlink is a link created in the sandbox's top layer.
type Symlink struct {
	Path   string
	Target string
}

// Layout is a resolved image: what to mount and what to generate.
type Layout struct {
	Name     string // as the user named it
	Digest   string // content digest, for OCI images
	Trees    []Tree
	Symlinks []Symlink
	// Passwd and Group are the image's own user database, to which airlock
	// adds the sandbox user.
	Passwd, Group string
	// Env is the image's configured environment (OCI), PATH first.
	Env []string
	// Release drops the image's use lock (OCI images); nil otherwise.
	Release func()
}

// Done releases what the layout holds.
func (l *Layout) Done() {
	if l.Release != nil {
		l.Release()
	}
}

// Dir returns the layout of a root filesystem directory. Its files keep the
// ownership they have on the host (uid 0 appears as root inside).
func Dir(path string) (*Layout, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --image %s: %v", errdefs.ErrNotFound, path, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.Invalid(fmt.Sprintf("--image %s: not a directory", path))
	}
	l := &Layout{Name: path, Trees: []Tree{{HostPath: path, Target: "/"}}}
	l.Passwd = ReadSmall(path, "etc/passwd")
	l.Group = ReadSmall(path, "etc/group")
	return l, nil
}
