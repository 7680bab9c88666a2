package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/sandbox/snapshots"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// A fork makes N new sandboxes from one checkpoint of a running one:
//
//  1. the count is checked (1..api.MaxForks), the source's wall may still
//     be used by its tenant, and the tenant's quotas admit N more
//     sandboxes like the source (all N, or the fork is refused and
//     nothing is made);
//  2. the source is saved once: on the gVisor wall its memory with its
//     files (a runsc checkpoint, the source paused for it and running on
//     after), on the container wall its files only;
//  3. the N copies are made at once from that save, each a sandbox of
//     its own (id, cgroup, agent socket, and on the container wall its
//     own network namespace and broker tokens): a gVisor copy is restored
//     running, a container copy starts afresh on the files;
//  4. if any copy fails, the ones made are destroyed (all or nothing);
//  5. the memory checkpoint is removed once the restores are done, and
//     the files when no copy runs from them any more (forkFilesDone).
//
// The save is the fork's own: no snapshot is listed or counted against
// the tenant's snapshot bytes (it is bounded by MaxSnapshotBytes), and one
// sandbox.forked record on the source names the copies.

// forkCount checks a fork's count.
func forkCount(n int) error {
	if n < 1 || n > api.MaxForks {
		return errdefs.Invalid(fmt.Sprintf("count: from 1 to %d copies, not %d", api.MaxForks, n))
	}
	return nil
}

// Fork makes req.Count copies of sandbox id (see above).
func (s *Service) Fork(ctx context.Context, t *tenant.Principal, id string, req *api.CreateFork) (*api.Fork, error) {
	if err := forkCount(req.Count); err != nil {
		return nil, err
	}
	if t.Admin {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, "the admin key manages tenants; fork sandboxes with a tenant's key")
	}
	b, err := s.Use(t, id)
	if err != nil {
		return nil, err
	}
	b.Mu.Lock()
	src, expires, idle, meta, trig := b.Spec, b.Rec.Expires, b.Rec.IdleTimeout, b.Rec.Metadata, b.Rec.Trigger
	b.Mu.Unlock()
	memory := src.Wall() == "gvisor"
	// The tenant may have been held to a stronger wall since.
	if err := spec.HeldTo(src.Wall(), t.Isolation); err != nil {
		return nil, err
	}
	ids := make([]string, req.Count)
	for i := range ids {
		ids[i] = core.NewID()
	}
	ctx, pcs, err := s.admit(ctx, t, ids, &src)
	if err != nil {
		s.Cfg.Metrics.CreatesRefused.Inc()
		return nil, err
	}
	defer func() {
		for _, pc := range pcs {
			s.settle(pc)
		}
	}()
	files, err := b.Inst.Snapshot(ctx, snapshots.MaxSnapshotBytes, memory)
	if err != nil {
		return nil, fmt.Errorf("fork: the checkpoint of %s: %w", id, err)
	}
	s.forkStarts(files.ID)
	defer s.forkEnds(files.ID)
	root, ws, err := s.Cfg.Backend.SnapshotPaths(files.ID)
	if err != nil {
		return nil, err
	}
	out := &api.Fork{Source: id, Memory: memory, Bytes: files.Bytes, MemoryBytes: files.MemoryBytes, CheckpointMillis: files.CheckpointTime.Milliseconds()}
	bo := birth{expires: expires, idle: idle}
	// The copies are the source's: its creator's metadata and trigger.
	_ = json.Unmarshal([]byte(meta), &bo.metadata)
	_ = json.Unmarshal([]byte(trig), &bo.trigger)
	boxes, took, err := s.launchAll(ctx, t, pcs, func() *spec.Spec { return forkSpec(src, files, root, ws, memory) }, bo)
	if memory {
		// Restored (or failed): nothing reads the memory image again.
		if rerr := s.Cfg.Backend.RemoveCheckpoint(files.ID); rerr != nil {
			s.Cfg.Log.Error("remove a fork's checkpoint", "content", files.ID, "err", rerr)
		}
	}
	if err != nil {
		return nil, err
	}
	if err := s.Cfg.Audit.Commit(context.WithoutCancel(ctx), b.WhoFor(t), record.SandboxForked{
		Sandboxes: ids, Memory: memory, Content: files.ID, Bytes: files.Bytes, MemoryBytes: files.MemoryBytes,
	}); err != nil {
		for _, nb := range boxes {
			s.end(nb, "fork undone: its record could not be written")
		}
		return nil, err
	}
	for i, nb := range boxes {
		out.Sandboxes = append(out.Sandboxes, nb.Describe(true))
		out.CreateMillis = append(out.CreateMillis, took[i].Milliseconds())
	}
	s.Cfg.Log.Info("sandbox forked", "id", id, "tenant", t.ID, "copies", ids, "memory", memory, "checkpoint_ms", out.CheckpointMillis)
	return out, nil
}

// launchAll makes the sandboxes of creates pcs at once, each from its own
// spec (mk), and answers them all, or an error and none: those made are
// destroyed when any other fails.
func (s *Service) launchAll(ctx context.Context, t *tenant.Principal, pcs []*pendingCreate, mk func() *spec.Spec, bo birth) ([]*core.Box, []time.Duration, error) {
	boxes := make([]*core.Box, len(pcs))
	took := make([]time.Duration, len(pcs))
	errs := make([]error, len(pcs))
	var wg sync.WaitGroup
	for i, pc := range pcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			boxes[i], errs[i] = s.launch(ctx, t, pc, mk(), bo)
			took[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		return boxes, took, nil
	}
	var undo sync.WaitGroup
	for _, nb := range boxes {
		if nb != nil {
			undo.Add(1)
			go func() { defer undo.Done(); s.end(nb, "fork undone: another copy could not be made") }()
		}
	}
	undo.Wait()
	// The first error says why (the others are often the same).
	for _, e := range errs {
		if e != nil {
			return nil, nil, fmt.Errorf("fork: %d of %d copies could not be made, none is kept: %w", countErrs(errs), len(pcs), e)
		}
	}
	return nil, nil, err
}

func countErrs(errs []error) int {
	n := 0
	for _, e := range errs {
		if e != nil {
			n++
		}
	}
	return n
}

// forkSpec is a copy's spec: the source's, on the fork's files (its root
// when one was saved, else the source's image; its workspace), restored
// from its memory when there is one. What the broker minted for the
// source (its grants' placeholders) is not the copy's: its own are minted
// at its create.
func forkSpec(src spec.Spec, files *lifecycle.SnapshotFiles, root, ws string, memory bool) *spec.Spec {
	sp := src
	sp.Env = slices.Clone(src.Env)
	sp.Grants = slices.Clone(src.Grants)
	for i := range sp.Grants {
		g := &sp.Grants[i]
		if g.Token != "" {
			sp.Env = slices.DeleteFunc(sp.Env, func(kv string) bool { return kv == g.Env+"="+g.Token })
			g.Token = ""
		}
	}
	sp.Image, sp.Workspace, sp.Repo = files.Base, ws, ""
	if root != "" {
		sp.Image = root
	}
	if src.HostRoots != nil { // the fork's own files are the daemon's to open
		sp.HostRoots = slices.Clone(src.HostRoots)
		for _, d := range []string{ws, root} {
			if d != "" {
				sp.HostRoots = append(sp.HostRoots, d)
			}
		}
	}
	sp.Restore, sp.Fork = "", files.ID
	if memory {
		sp.Restore = files.ID
	}
	return &sp
}

// forkStarts marks content's files as in use by a fork in flight (its
// copies are not all live yet); forkEnds unmarks them, and removes them
// if nothing runs from them.
func (s *Service) forkStarts(content string) {
	s.Mu.Lock()
	s.forking[content]++
	s.Mu.Unlock()
}

func (s *Service) forkEnds(content string) {
	s.Mu.Lock()
	if s.forking[content]--; s.forking[content] <= 0 {
		delete(s.forking, content)
	}
	s.Mu.Unlock()
	s.forkFilesDone(content)
}

// forkFilesDone removes a fork's files (content) once no fork is making
// copies from them, no snapshot records them (a container fork's files
// can be a snapshot's too: equal content is saved once) and no live
// sandbox runs from them (RemoveFiles).
func (s *Service) forkFilesDone(content string) {
	s.Mu.Lock()
	busy := s.forking[content] > 0
	s.Mu.Unlock()
	if busy {
		return
	}
	recs, err := s.Cfg.Store.Snapshots(context.Background(), "")
	if err != nil {
		s.Cfg.Log.Error("fork files: list snapshots", "err", err)
		return
	}
	for _, r := range recs {
		if r.Content == content {
			return
		}
	}
	s.RemoveFiles(content)
}
