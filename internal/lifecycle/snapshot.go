package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/progress"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
	"github.com/airlock-sandbox/airlock/internal/workspace/snapshot"
)

// Snapshots live under DATA_DIR/snapshots/<id>: root/ (a whole root
// filesystem: the sandbox's image with its writable layer applied, files
// shared with the image by hard links) and workspace/ (the contents of its
// /workspace). Ownership inside is container-relative (uid 0 is root
// inside), like an unpacked image, so any sandbox can use it. The id is
// the digest of what was written.

// snapshotID is compiled at first use, not at every start of airlock.
var snapshotID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{24}$`) })

func snapshotDir(dataDir, id string) string {
	return filepath.Join(dataDir, "snapshots", id)
}

// SnapshotPaths says where snapshot id's root and workspace are ("" for a
// root it does not have).
func (l *Lifecycle) SnapshotPaths(id string) (root, ws string, err error) {
	if !snapshotID().MatchString(id) {
		return "", "", errdefs.Invalid(fmt.Sprintf("snapshot id %q", id))
	}
	dir := snapshotDir(l.cfg.DataDir, id)
	// Real paths: they become host roots of the sandbox's spec, which are
	// opened without following links (a data directory behind a link).
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	if _, err := os.Stat(filepath.Join(dir, "workspace")); err != nil {
		return "", "", fmt.Errorf("%w: snapshot %s: %v", errdefs.ErrNotFound, id, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "root")); err == nil {
		root = filepath.Join(dir, "root")
	}
	return root, filepath.Join(dir, "workspace"), nil
}

// RemoveSnapshot deletes snapshot id's files.
func (l *Lifecycle) RemoveSnapshot(id string) error {
	if !snapshotID().MatchString(id) {
		return errdefs.Invalid(fmt.Sprintf("snapshot id %q", id))
	}
	return os.RemoveAll(snapshotDir(l.cfg.DataDir, id))
}

// SnapshotFiles is what a snapshot saved on the host.
type SnapshotFiles struct {
	ID      string // digest of the content
	Base    string // the sandbox's image
	Root    bool   // a whole root filesystem was saved (else: Base is the root)
	Bytes   int64  // file content written (with the checkpoint's, if any)
	Skipped []string
	// MemoryBytes is the checkpoint's size on disk (0: files only), and
	// CheckpointTime how long the sandbox was held for it.
	MemoryBytes    int64
	CheckpointTime time.Duration
}

// snapshotMemory is the checkpoint's directory in a snapshot's.
const snapshotMemory = "memory"

// SnapshotHasMemory reports whether snapshot id holds a sandbox's memory.
func (l *Lifecycle) SnapshotHasMemory(id string) bool {
	if !snapshotID().MatchString(id) {
		return false
	}
	st, err := os.Lstat(filepath.Join(snapshotDir(l.cfg.DataDir, id), snapshotMemory))
	return err == nil && st.IsDir()
}

// dirBytes is the size of the regular files under dir.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}

// Snapshot saves the sandbox's filesystem state, on the frozen sandbox:
// for a whole-root image, the image with the sandbox's writable root layer
// applied; and /workspace. A host-image sandbox has no root of its own to
// save (its /usr is the host's): its snapshot is the host image plus
// /workspace, and with --writable-rootfs its root changes cannot be kept,
// which is refused.
//
// The copy reports its bytes to ctx's progress sink (Op "snapshot", the
// sandbox's id), and stops where ctx ends: nothing of it is left then.
// Once the copy is whole it is kept (under its content digest), whatever
// ctx says: the caller records it.
//
// With memory, the sandbox's memory is saved with its files (a gVisor
// sandbox's checkpoint, wall.Checkpointer, in memory/ beside root/ and
// workspace/): both are taken while it is paused, and it runs on after.
// Such a snapshot is never shared with another save (its memory is its
// own), and its Bytes count the checkpoint's too.
func (sb *Sandbox) Snapshot(ctx context.Context, maxBytes int64, memory bool) (_ *SnapshotFiles, err error) {
	var cp wall.Checkpointer
	if memory {
		var ok bool
		if cp, ok = sb.w.(wall.Checkpointer); !ok {
			return nil, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("a snapshot with memory needs the gvisor wall: this sandbox is on the %s wall (its files alone can be saved)", sb.wall))
		}
	}
	// The host image's "/" tree is only its /etc template; its /usr is the
	// host's own.
	full := sb.layout.Name != "host" && len(sb.layout.Trees) > 0 && sb.layout.Trees[0].Target == "/"
	if full && sb.host != nil && sb.host.TenantTree {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "a sandbox of a tenant's own rootfs directory cannot be saved whole (its files are the tenant's on the host, not the daemon's to link): use an oci: or docker-archive: image, which the daemon unpacks into its cache")
	}
	if !full && sb.writable {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "a writable host-image sandbox's root changes cannot become an image (its /usr is the host's): snapshot a sandbox of an OCI or directory image, or one without writable_rootfs")
	}
	parent := filepath.Join(sb.dataDir, "snapshots")
	if err := os.MkdirAll(parent, 0o711); err != nil {
		return nil, err
	}
	// The stage is named by its sandbox, so that gc can tell one a dead
	// daemon left (its sandbox gone) from one being written.
	tmp, err := os.MkdirTemp(parent, snapshotStage+sb.id+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o711); err != nil {
		return nil, err
	}
	out := &SnapshotFiles{Base: sb.image}
	h := sha256.New()
	digest := sb.layout.Digest
	if digest == "" && strings.HasPrefix(sb.image, parent+"/") {
		digest = sb.image // an earlier snapshot's root: named by its content
	}
	snapshotBase(h, sb.image, digest, full, tmp)
	if memory {
		fmt.Fprintf(h, "memory\x00%s\x00", tmp) // never shared
	}
	rep := &snapshotReporter{ctx: ctx, id: sb.id, start: time.Now()}
	var count func(int64)
	if progress.Enabled(ctx) {
		count = rep.add
		rep.report()
		defer progress.Report(ctx, progress.Event{Op: "snapshot", Subject: sb.id, Done: true})
	}
	save := func() error {
		base, err := sb.w.UIDBase()
		if err != nil {
			return err
		}
		// What the sandbox wrote is owned by its uid range: shift it back.
		inside := func(id uint32) uint32 {
			if id >= base && id < base+65536 {
				return id - base
			}
			return 65534 // nobody: not the sandbox's to give
		}
		owner := func(u, g uint32) (uint32, uint32) { return inside(u), inside(g) }
		if full {
			root := filepath.Join(tmp, "root")
			if err := os.Mkdir(root, 0o755); err != nil {
				return err
			}
			if err := snapshot.LinkTree(ctx, sb.layout.Trees[0].HostPath, root); err != nil {
				return fmt.Errorf("snapshot: the image: %w", err)
			}
			w, err := snapshot.NewWriter(root, h, maxBytes, count)
			if err != nil {
				return err
			}
			skipped, err := w.ApplyUpper(ctx, sb.w.Layers().RootUpper, owner)
			w.Close()
			if err != nil {
				return fmt.Errorf("snapshot: the root layer: %w", err)
			}
			out.Skipped = append(out.Skipped, skipped...)
			out.Bytes += w.Written()
			out.Root = true
		}
		ws := filepath.Join(tmp, "workspace")
		if err := os.Mkdir(ws, 0o755); err != nil {
			return err
		}
		fmt.Fprint(h, "workspace\x00")
		w, err := snapshot.NewWriter(ws, h, maxBytes, count)
		if err != nil {
			return err
		}
		// The workspace of a sandbox made from the snapshot belongs to its
		// user: the host directory's owner (root here) is mapped to it.
		skipped, err := w.CopyTree(ctx, sb.w.Layers().Workspace, func(uint32, uint32) (uint32, uint32) { return 0, 0 })
		w.Close()
		if err != nil {
			return fmt.Errorf("snapshot: /workspace: %w", err)
		}
		out.Skipped = append(out.Skipped, skipped...)
		out.Bytes += w.Written()
		return nil
	}
	if memory {
		t0 := time.Now()
		sb.mu.Lock()
		err = cp.Checkpoint(filepath.Join(tmp, snapshotMemory), sb.socket, save)
		sb.mu.Unlock()
		out.CheckpointTime = time.Since(t0)
		if err == nil {
			// The sandbox's memory: the host's root alone reads it.
			if err = os.Chmod(filepath.Join(tmp, snapshotMemory), 0o700); err == nil {
				out.MemoryBytes, err = dirBytes(filepath.Join(tmp, snapshotMemory))
			}
			out.Bytes += out.MemoryBytes
			if maxBytes > 0 && out.Bytes > maxBytes {
				err = fmt.Errorf("%w: the snapshot with its memory holds %d bytes", safefs.ErrTooLarge, out.Bytes)
			}
		}
	} else {
		err = sb.frozen(save)
	}
	if errors.Is(err, safefs.ErrTooLarge) {
		return nil, errdefs.New(errdefs.ErrTooLarge, err.Error())
	}
	if err == nil {
		err = ctx.Err() // the caller went as the copy ended: it goes too
	}
	if err != nil {
		return nil, err
	}
	out.ID = hex.EncodeToString(h.Sum(nil))[:24]
	dir := snapshotDir(sb.dataDir, out.ID)
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "workspace")); serr != nil {
			return nil, err
		}
		// The same content was saved before: keep that copy.
	}
	progress.Report(ctx, progress.Event{Op: "snapshot", Subject: sb.id, Stays: true, Message: fmt.Sprintf("saved %s: %s MiB, in %s", sb.id, progress.MiB(out.Bytes), time.Since(rep.start).Round(time.Millisecond))})
	return out, nil
}

// snapshotReporter reports a snapshot's bytes copied: at its start, then
// at most every snapshotReportEvery.
type snapshotReporter struct {
	ctx    context.Context
	id     string
	start  time.Time
	last   time.Time
	copied int64
}

const snapshotReportEvery = 200 * time.Millisecond

func (r *snapshotReporter) add(n int64) {
	r.copied += n
	if time.Since(r.last) >= snapshotReportEvery {
		r.report()
	}
}

func (r *snapshotReporter) report() {
	r.last = time.Now()
	progress.Report(r.ctx, progress.Event{Op: "snapshot", Subject: r.id, Bytes: r.copied})
}

// snapshotBase starts a snapshot's content digest with what its root was
// copied from. The digest names the snapshot's files, and a snapshot of
// equal digest keeps the files saved first, whoever saved them: so a root
// copied from an image counts by the image's content digest, not its name
// (a registry tag, an oci: path, resolved anew at each create, can stand
// for other content at another time, or for another tenant); a root
// copied from an image without one (a directory) is never shared (unique:
// a name of this save's own).
func snapshotBase(h io.Writer, image, digest string, full bool, unique string) {
	fmt.Fprintf(h, "base\x00%s\x00", image)
	switch {
	case !full: // no root saved: the image is resolved again at each create
	case digest != "":
		fmt.Fprintf(h, "digest\x00%s\x00", digest)
	default:
		fmt.Fprintf(h, "unique\x00%s\x00", unique)
	}
}

// snapshotStage begins the name of the directory a snapshot is written in
// (then its sandbox's id, a dash and a random suffix) before it is moved
// into place.
const snapshotStage = ".new-"

// gcSnapshotStages removes the stages of snapshots whose sandbox is gone:
// what a daemon killed mid-snapshot left, which no record names.
func (l *Lifecycle) gcSnapshotStages() {
	dir := filepath.Join(l.cfg.DataDir, "snapshots")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), snapshotStage)
		id, _, named := strings.Cut(rest, "-")
		if !ok || !e.IsDir() || !named || id == "" || l.live(id) {
			continue
		}
		l.cfg.Log.Info("gc: removing a snapshot stage its sandbox left", "sandbox", id)
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}
