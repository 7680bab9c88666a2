package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// MaxSnapshotBytes caps one snapshot's file content.
const MaxSnapshotBytes = 8 << 30

// Snapshot saves sandbox id's filesystem state (on the frozen sandbox) as
// an image its tenant can create sandboxes from.
func (s *Service) Snapshot(ctx context.Context, t *Principal, id string, req *api.CreateSnapshot) (*api.Snapshot, error) {
	if len(req.Name) > 128 {
		return nil, errdefs.Invalid("name: at most 128 bytes")
	}
	b, err := s.use(t, id)
	if err != nil {
		return nil, err
	}
	if t.Admin {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, "snapshots belong to tenants: use the tenant's key")
	}
	limit := int64(MaxSnapshotBytes)
	var used int64
	if q := t.Quotas.MaxSnapshotBytes; q > 0 {
		mine, err := s.cfg.Store.Snapshots(ctx, t.Tenant)
		if err != nil {
			return nil, err
		}
		for _, sn := range mine {
			used += sn.Bytes
		}
		if used >= q {
			return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: tenant %s's snapshots hold %s of its %s: delete some first", t.Tenant, spec.FormatSize(used), spec.FormatSize(q)))
		}
		limit = min(limit, q-used)
	}
	files, err := b.inst.Snapshot(limit)
	if errors.Is(err, errdefs.ErrTooLarge) && t.Quotas.MaxSnapshotBytes > 0 {
		return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: this snapshot would take tenant %s's snapshots past %s", t.Tenant, spec.FormatSize(t.Quotas.MaxSnapshotBytes)))
	}
	if err != nil {
		return nil, err
	}
	rec := store.Snapshot{ID: files.ID, Tenant: t.Tenant, Name: req.Name, Sandbox: id, Base: files.Base, HasRoot: files.Root, Bytes: files.Bytes, Created: s.cfg.Now()}
	if err := s.cfg.Store.PutSnapshot(ctx, rec); err != nil {
		return nil, err
	}
	if err := s.commit(ctx, b.who(), "sandbox.snapshot", "observed", map[string]any{
		"snapshot": files.ID, "name": req.Name, "base": files.Base, "root": files.Root, "bytes": files.Bytes,
		"skipped": files.Skipped, "workspace": s.workspaceChanges(b),
	}); err != nil {
		return nil, err
	}
	s.cfg.Log.Info("snapshot saved", "id", files.ID, "sandbox", id, "tenant", t.Tenant, "bytes", files.Bytes)
	out := snapshotOf(rec)
	out.Skipped = files.Skipped
	return out, nil
}

func snapshotOf(r store.Snapshot) *api.Snapshot {
	return &api.Snapshot{ID: r.ID, Name: r.Name, Sandbox: r.Sandbox, Base: r.Base, Root: r.HasRoot, Bytes: r.Bytes, Created: r.Created}
}

// Snapshots lists the caller's snapshots (every tenant's for the admin).
func (s *Service) Snapshots(ctx context.Context, t *Principal) ([]*api.Snapshot, error) {
	tenant := t.Tenant
	if t.Admin {
		tenant = ""
	}
	recs, err := s.cfg.Store.Snapshots(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := []*api.Snapshot{}
	for _, r := range recs {
		out = append(out, snapshotOf(r))
	}
	return out, nil
}

// DeleteSnapshot forgets a tenant's snapshot; its files go when no tenant
// records it and no live sandbox runs from it.
func (s *Service) DeleteSnapshot(ctx context.Context, t *Principal, sid string) error {
	root, ws, err := s.cfg.Backend.SnapshotPaths(sid)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no snapshot "+quoteID(sid))
	}
	s.mu.Lock()
	for _, b := range s.boxes {
		if (root != "" && b.spec.Image == root) || (ws != "" && b.spec.Workspace == ws) {
			s.mu.Unlock()
			return errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("snapshot %s is in use by a sandbox (%s): destroy it first", sid, b.rec.ID))
		}
	}
	s.mu.Unlock()
	stillUsed, err := s.cfg.Store.DeleteSnapshot(ctx, t.Tenant, sid)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no snapshot "+quoteID(sid))
	}
	if err != nil {
		return err
	}
	if !stillUsed {
		return s.cfg.Backend.RemoveSnapshot(sid)
	}
	return nil
}

// fromSnapshot turns image "snapshot:<id>" into the snapshot's files: its
// root (or the image it was taken over) and its workspace.
func (s *Service) fromSnapshot(ctx context.Context, t *Principal, sp *spec.Spec) error {
	sid, ok := strings.CutPrefix(sp.Image, "snapshot:")
	if !ok {
		return nil
	}
	if sp.Workspace != "" || sp.Repo != "" {
		return errdefs.Invalid("a sandbox made from a snapshot takes its /workspace from the snapshot: drop workspace and repo")
	}
	recs, err := s.cfg.Store.Snapshots(ctx, t.Tenant)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.ID != sid {
			continue
		}
		root, ws, err := s.cfg.Backend.SnapshotPaths(sid)
		if err != nil {
			return err
		}
		sp.Image, sp.Workspace = r.Base, ws
		if root != "" {
			sp.Image = root
		}
		return sp.ValidateLongLived()
	}
	return errdefs.New(errdefs.ErrNotFound, "no snapshot "+quoteID(sid))
}
