// Package hostfiles opens the host paths of a sandbox's spec — its image,
// workspace and repository — once, beneath the tenant's roots when the spec
// has them (openat2, internal/linux/hostpath), and hands out descriptors:
// the lifecycle (internal/lifecycle) uses a path only through them, so a
// directory swapped for a link after the check changes nothing.
package hostfiles

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/linux/hostpath"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/workspace/checkout"
)

// Files are the host paths of one sandbox's spec, each opened once
// (beneath its root when the spec has roots: a tenant's) and used through
// that descriptor from then on: the name is never resolved again.
type Files struct {
	confined  bool
	Image     *os.File // a rootfs directory, oci: layout or docker-archive: file
	Workspace *os.File
	repo      *os.File
	// TenantTree: the image is a rootfs directory of a tenant's root,
	// used in place (not the daemon's snapshot), whose files the daemon
	// only reads through the sandbox's mount.
	TenantTree bool
}

// Open opens the host paths s names; snapshots is the daemon's directory
// of snapshots (an image there is the daemon's, not a tenant's tree).
func Open(s *spec.Spec, snapshots string) (_ *Files, err error) {
	h := &Files{confined: s.HostRoots != nil}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	if p := spec.ImagePath(s.Image); p != "" {
		if h.Image, err = h.open(s, "image", p, !strings.HasPrefix(s.Image, "docker-archive:")); err != nil {
			return nil, err
		}
		h.TenantTree = h.confined && strings.HasPrefix(s.Image, "/") && !InSnapshots(snapshots, p)
	}
	if s.Workspace != "" {
		if h.Workspace, err = h.open(s, "workspace", s.Workspace, true); err != nil {
			return nil, err
		}
	}
	if s.Repo != "" {
		if h.repo, err = h.open(s, "repo", s.Repo, true); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// InSnapshots reports whether path p lies in the daemon's directory of
// snapshots: files airlock wrote once, and keeps unchanged while a sandbox
// uses them.
func InSnapshots(snapshots, p string) bool {
	if spec.Within(snapshots, p) {
		return true
	}
	real, err := filepath.EvalSymlinks(snapshots)
	return err == nil && spec.Within(real, p)
}

// open opens p for field: a directory, or a regular file. A tenant's
// refusals all read alike: missing, unreadable, of the wrong type or
// leading out of its roots.
func (h *Files) open(s *spec.Spec, field, p string, dir bool) (*os.File, error) {
	root := ""
	if h.confined {
		if root = spec.RootOf(s.HostRoots, p); root == "" {
			return nil, errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("%s %q: not under a root of this tenant", field, p))
		}
	}
	f, err := hostpath.Open(root, p)
	if err == nil {
		var fi os.FileInfo
		if fi, err = f.Stat(); err == nil && fi.IsDir() != dir {
			err = fmt.Errorf("%s %s: not a %s", field, p, map[bool]string{true: "directory", false: "regular file"}[dir])
		}
		if err == nil && !dir && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s %s: not a regular file", field, p)
		}
		if err != nil {
			f.Close()
		}
	}
	switch {
	case err == nil:
		return f, nil
	case h.confined:
		return nil, errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("%s %q: no %s this tenant may use there (missing, unreadable, of another type and leading out of the tenant's roots all answer alike)", field, p, map[bool]string{true: "directory", false: "file"}[dir]))
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%w: --%s %s: %v", errdefs.ErrNotFound, field, p, err)
	}
	return nil, errdefs.Invalid(fmt.Sprintf("--%s %s: %v", field, p, err))
}

// WorkspaceDir is where this process reaches the workspace directory (""
// for none).
func (h *Files) WorkspaceDir() string {
	if h.Workspace == nil {
		return ""
	}
	return hostpath.FDPath(h.Workspace)
}

// Checkout makes the workspace of s's repo under tmp, through the repo's
// descriptor; it stops when ctx ends (the kill switch, a tenant's
// deletion).
func (h *Files) Checkout(ctx context.Context, s *spec.Spec, tmp, id string) (string, func(), error) {
	if h.confined {
		return checkout.FromRepoBeneath(ctx, h.repo, s.Repo, s.Commit, tmp, id)
	}
	return checkout.FromRepo(ctx, s.Repo, s.Commit, tmp, id)
}

// Close closes the descriptors.
func (h *Files) Close() {
	for _, f := range []*os.File{h.Image, h.Workspace, h.repo} {
		if f != nil {
			f.Close()
		}
	}
}
