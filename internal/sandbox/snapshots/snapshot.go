// Package snapshots is what a tenant keeps beyond its sandboxes' lives:
// snapshots (saved from a frozen sandbox, listed, deleted, their files
// removed once nothing uses them, a create's "snapshot:<id>" image
// resolved to them) and its MCP sessions' default spec.
package snapshots

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Keeper is the service's calls on snapshots and MCP specs, on its Core.
type Keeper struct{ *core.Core }

// New makes the calls on snapshots and MCP specs of c's tenants.
func New(c *core.Core) *Keeper { return &Keeper{c} }

// MaxSnapshotBytes caps one snapshot's file content.
const MaxSnapshotBytes = 8 << 30

// Snapshot saves sandbox id's filesystem state (on the frozen sandbox) as
// an image its tenant can create sandboxes from. The copy reports its
// bytes to ctx's progress sink; a ctx that ends during the copy stops it
// and leaves no snapshot.
func (s *Keeper) Snapshot(ctx context.Context, t *tenant.Principal, id string, req *api.CreateSnapshot) (*api.Snapshot, error) {
	if len(req.Name) > 128 {
		return nil, errdefs.Invalid("name: at most 128 bytes")
	}
	b, err := s.Use(t, id)
	if err != nil {
		return nil, err
	}
	if t.Admin {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, "snapshots belong to tenants: use the tenant's key")
	}
	limit := int64(MaxSnapshotBytes)
	var used int64
	if q := t.Quotas.MaxSnapshotBytes; q > 0 {
		mine, err := s.Cfg.Store.Snapshots(ctx, t.ID)
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
	if req.Memory && b.Spec.Wall() != "gvisor" {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("a snapshot with memory needs --isolation gvisor: sandbox %s is on the %s wall (snapshot its files without memory)", id, b.Spec.Wall()))
	}
	files, err := b.Inst.Snapshot(ctx, limit, req.Memory)
	if errors.Is(err, errdefs.ErrTooLarge) && t.Quotas.MaxSnapshotBytes > 0 {
		err = errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("quota: this snapshot would take tenant %s's snapshots past %s", t.Tenant, spec.FormatSize(t.Quotas.MaxSnapshotBytes)))
	}
	if err != nil {
		s.Cfg.Log.Info("snapshot not saved", "sandbox", id, "tenant", t.ID, "err", err)
		return nil, err
	}
	// The files are whole and in place: they are recorded (and audited)
	// even if the caller has gone meanwhile, or they would be kept with no
	// record to find or delete them by.
	ctx = context.WithoutCancel(ctx)
	rec := store.Snapshot{ID: snapshotID(t.ID, files.ID), Tenant: t.ID, Content: files.ID, Name: req.Name, Sandbox: id, Base: files.Base, HasRoot: files.Root, Bytes: files.Bytes, Created: s.Cfg.Now()}
	if err := s.Cfg.Store.PutSnapshot(ctx, rec); err != nil {
		return nil, err
	}
	if err := t.UndoIfDeleted(func() {
		if stillUsed, err := s.Cfg.Store.DeleteSnapshot(ctx, t.ID, rec.ID); err == nil && !stillUsed {
			s.RemoveFiles(rec.Content)
		}
	}); err != nil {
		return nil, err
	}
	if err := s.Cfg.Audit.Commit(ctx, b.WhoFor(t), record.SandboxSnapshot{
		Snapshot: rec.ID, Content: files.ID, Name: req.Name, Base: files.Base, Root: files.Root, Bytes: files.Bytes,
		Memory: files.MemoryBytes, Skipped: record.Names(files.Skipped), Workspace: record.ReadWorkspace(b.Inst, b.Rec.ID, s.Cfg.PatchDir),
	}); err != nil {
		return nil, err
	}
	s.Cfg.Log.Info("snapshot saved", "id", rec.ID, "content", files.ID, "sandbox", id, "tenant", t.ID, "bytes", files.Bytes)
	out := snapshotOf(rec)
	out.Skipped = files.Skipped
	out.Memory, out.MemoryBytes, out.CheckpointMillis = files.MemoryBytes > 0, files.MemoryBytes, files.CheckpointTime.Milliseconds()
	return out, nil
}

// snapshotID is the id tenant tid sees for a snapshot of content: the
// same content saved by two tenants has two ids, and neither can name, or
// probe for, the other's.
func snapshotID(tid, content string) string {
	h := sha256.Sum256([]byte("airlock snapshot\x00" + tid + "\x00" + content))
	return hex.EncodeToString(h[:12])
}

func snapshotOf(r store.Snapshot) *api.Snapshot {
	return &api.Snapshot{ID: r.ID, Name: r.Name, Sandbox: r.Sandbox, Base: r.Base, Root: r.HasRoot, Bytes: r.Bytes, Created: r.Created}
}

// Snapshots lists the caller's snapshots (every tenant's for the admin).
func (s *Keeper) Snapshots(ctx context.Context, t *tenant.Principal) ([]*api.Snapshot, error) {
	tenant := t.ID
	if t.Admin {
		tenant = ""
	}
	recs, err := s.Cfg.Store.Snapshots(ctx, tenant)
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
// records its content and no live sandbox runs from it. Ownership is
// checked first: another tenant's snapshot is not found, exactly as a
// missing one, and no answer names anything of another tenant's.
func (s *Keeper) DeleteSnapshot(ctx context.Context, t *tenant.Principal, sid string) error {
	if t.Admin {
		return errdefs.New(errdefs.ErrPermissionDenied, "snapshots belong to tenants: use the tenant's key")
	}
	rec, err := s.Cfg.Store.SnapshotOf(ctx, t.ID, sid)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no snapshot "+core.QuoteID(sid))
	}
	if err != nil {
		return err
	}
	if b := s.snapshotUser(rec.Content, t.ID); b != nil {
		return errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("snapshot %s is in use by your sandbox %s: destroy it first", sid, b.Rec.ID))
	}
	stillUsed, err := s.Cfg.Store.DeleteSnapshot(ctx, t.ID, sid)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no snapshot "+core.QuoteID(sid))
	}
	if err != nil {
		return err
	}
	if !stillUsed {
		s.RemoveFiles(rec.Content)
	}
	return nil
}

// snapshotUser is a live sandbox of tenant id tid ("": of any tenant)
// made from the snapshot files of content, or nil.
func (s *Keeper) snapshotUser(content, tid string) *core.Box {
	root, ws, err := s.Cfg.Backend.SnapshotPaths(content)
	if err != nil {
		return nil
	}
	s.Mu.Lock()
	defer s.Mu.Unlock()
	for _, b := range s.Boxes {
		if (tid == "" || b.Rec.Tenant == tid) && ((root != "" && b.Spec.Image == root) || (ws != "" && b.Spec.Workspace == ws)) {
			return b
		}
	}
	return nil
}

// RemoveFiles deletes the files of content, which no tenant
// records any more, unless a live sandbox still runs from them.
func (s *Keeper) RemoveFiles(content string) {
	if s.snapshotUser(content, "") != nil {
		return
	}
	if err := s.Cfg.Backend.RemoveSnapshot(content); err != nil {
		s.Cfg.Log.Error("remove snapshot files", "content", content, "err", err)
	}
}

// FromSnapshot turns image "snapshot:<id>" into the snapshot's files: its
// root (or the image it was taken over) and its workspace.
func (s *Keeper) FromSnapshot(ctx context.Context, t *tenant.Principal, sp *spec.Spec) error {
	sid, ok := strings.CutPrefix(sp.Image, "snapshot:")
	if !ok {
		return nil
	}
	if sp.Workspace != "" || sp.Repo != "" {
		return errdefs.Invalid("a sandbox made from a snapshot takes its /workspace from the snapshot: drop workspace and repo")
	}
	r, err := s.Cfg.Store.SnapshotOf(ctx, t.ID, sid)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no snapshot "+core.QuoteID(sid))
	}
	if err != nil {
		return err
	}
	root, ws, err := s.Cfg.Backend.SnapshotPaths(r.Content)
	if err != nil {
		// Its files are gone: say so without the host's paths.
		s.Cfg.Log.Error("snapshot files", "snapshot", sid, "content", r.Content, "err", err)
		return errdefs.New(errdefs.ErrNotFound, "snapshot "+core.QuoteID(sid)+": its files are missing on the host")
	}
	sp.Image, sp.Workspace = r.Base, ws
	if s.Cfg.Backend.SnapshotHasMemory(r.Content) {
		// Restored running: only gVisor can, from its own checkpoint (a
		// stronger wall than any the request may name: never a downgrade),
		// with the network the request asks for (the checkpoint holds no
		// network stack: the restore builds one on its own namespace).
		sp.Isolation, sp.Restore = "gvisor", r.Content
	}
	if root != "" {
		sp.Image = root
	}
	if sp.HostRoots != nil { // the snapshot's own files are the daemon's to open
		for _, d := range []string{ws, root} {
			if d != "" {
				sp.HostRoots = append(sp.HostRoots, d)
			}
		}
	}
	return sp.ValidateLongLived()
}
