package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle/hostfiles"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/workspace/hostcopy"
)

// A sandbox's /workspace is an overlay over a lower layer nobody changes
// while it runs: a --repo checkout or a copy of the --workspace directory,
// both written by airlock into DATA_DIR/tmp/<id> (removed by destroy, and
// by gc or adoption's discard once the sandbox is dead), or a snapshot's
// workspace, which airlock wrote once and keeps while a sandbox uses it.
// The host's own directory is never the lower layer: changing a lower
// layer under a mounted overlay is undefined, and the change set read
// against it would no longer be "since creation".

// privateWorkspace reports whether s's /workspace is over a tree of
// DATA_DIR/tmp (workspaceDir).
func (l *Lifecycle) privateWorkspace(s *spec.Spec) bool {
	return s.Repo != "" || l.copiesWorkspace(s)
}

// copiesWorkspace reports whether s's workspace directory is copied at
// create: every host directory but a snapshot's.
func (l *Lifecycle) copiesWorkspace(s *spec.Spec) bool {
	return s.Workspace != "" && !hostfiles.InSnapshots(filepath.Join(l.cfg.DataDir, "snapshots"), s.Workspace)
}

// workspaceDir is where sandbox id's private workspace tree is.
func (l *Lifecycle) workspaceDir(id string) string {
	return filepath.Join(l.cfg.DataDir, "tmp", id)
}

// copyWorkspace copies the workspace directory src (named name by the
// spec) into workspaceDir(id), within hostcopy's caps, saying how far it
// got every few seconds; remove deletes the copy.
func (l *Lifecycle) copyWorkspace(ctx context.Context, src *os.File, name, id string) (dir string, remove func(), err error) {
	dir = l.workspaceDir(id)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", nil, err
	}
	last := time.Now()
	res, err := hostcopy.Copy(ctx, src, dir, hostcopy.Options{Progress: func(r hostcopy.Result) {
		if time.Since(last) >= 2*time.Second {
			last = time.Now()
			l.cfg.Warn(fmt.Sprintf("copying the workspace: %d entries, %s so far", r.Entries, spec.FormatSize(r.Bytes)))
		}
	}})
	if err != nil {
		return "", nil, fmt.Errorf("--workspace %s: %w", name, err)
	}
	for _, s := range res.Skipped {
		l.cfg.Warn("workspace: not copied (a special file): " + s)
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}
