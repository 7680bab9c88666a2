package lifecycle

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

// hostFiles are the host paths of one sandbox's spec, each opened once
// (beneath its root when the spec has roots: a tenant's) and used through
// that descriptor from then on: the name is never resolved again, so a
// directory swapped for a link after the check changes nothing.
type hostFiles struct {
	confined bool
	image    *os.File // a rootfs directory, oci: layout or docker-archive: file
	ws       *os.File
	repo     *os.File
	// tenantTree: the image is a rootfs directory of a tenant's root,
	// used in place (not the daemon's snapshot), whose files the daemon
	// only reads through the sandbox's mount.
	tenantTree bool
}

// openHost opens the host paths s names.
func (l *Lifecycle) openHost(s *spec.Spec) (_ *hostFiles, err error) {
	h := &hostFiles{confined: s.HostRoots != nil}
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	if p := spec.ImagePath(s.Image); p != "" {
		if h.image, err = h.open(s, "image", p, !strings.HasPrefix(s.Image, "docker-archive:")); err != nil {
			return nil, err
		}
		snaps := filepath.Join(l.cfg.DataDir, "snapshots")
		ours := spec.Within(snaps, p)
		if real, err := filepath.EvalSymlinks(snaps); err == nil && !ours {
			ours = spec.Within(real, p)
		}
		h.tenantTree = h.confined && strings.HasPrefix(s.Image, "/") && !ours
	}
	if s.Workspace != "" {
		if h.ws, err = h.open(s, "workspace", s.Workspace, true); err != nil {
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

// open opens p for field: a directory, or a regular file. A tenant's
// refusals all read alike: missing, unreadable, of the wrong type or
// leading out of its roots.
func (h *hostFiles) open(s *spec.Spec, field, p string, dir bool) (*os.File, error) {
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

// CheckHostPaths opens the host paths of s as Create would, and closes
// them: a spec kept for later is refused now, not at its use.
func (l *Lifecycle) CheckHostPaths(s *spec.Spec) error {
	h, err := l.openHost(s)
	if err != nil {
		return err
	}
	h.close()
	return nil
}

// path is where this process reaches f ("" when f is nil).
func path(f *os.File) string {
	if f == nil {
		return ""
	}
	return hostpath.FDPath(f)
}

// checkout makes the workspace of s's repo, through h; it stops when ctx
// ends (the kill switch, a tenant's deletion).
func (l *Lifecycle) checkout(ctx context.Context, s *spec.Spec, h *hostFiles, id string) (string, func(), error) {
	if h.confined {
		return checkout.FromRepoBeneath(ctx, h.repo, s.Repo, s.Commit, l.cfg.DataDir+"/tmp", id)
	}
	return checkout.FromRepo(ctx, s.Repo, s.Commit, l.cfg.DataDir+"/tmp", id)
}

func (h *hostFiles) close() {
	for _, f := range []*os.File{h.image, h.ws, h.repo} {
		if f != nil {
			f.Close()
		}
	}
}
