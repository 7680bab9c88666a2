package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image/rootfs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle/hostfiles"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/workspace"
	"github.com/airlock-sandbox/airlock/internal/workspace/safefs"
	"golang.org/x/sys/unix"
)

// Sandbox is one sandbox on the host: the wall's sandbox and what the host
// holds for it (its image, host paths, workspace, network).
type Sandbox struct {
	id string
	w  wall.Sandbox
	// wall and wallVersion name the wall it is on (wall.Wall).
	wall, wallVersion string
	layout            *rootfs.Layout
	host              *hostfiles.Files // the spec's host paths, open while the sandbox lives
	wsDir             string           // the workspace's host directory ("" for none)
	socket            string           // the agent's socket (long-lived)
	net               *sandboxnet.Net
	image             string // the spec's image
	degraded          []string
	writable          bool
	dataDir           string
	// release gives back what the host holds beside the wall's sandbox.
	release func() error

	mu          sync.Mutex // serialises freezes
	destroyOnce sync.Once
	releaseOnce sync.Once
	destroyErr  error
}

// Usage is the kernel's accounting for one sandbox.
type Usage struct {
	CPU                   time.Duration
	Memory, MemoryPeak    int64
	OOMKills, PidsLimited int64
}

// ID is the sandbox's id.
func (sb *Sandbox) ID() string { return sb.id }

// Socket is the host path of a long-lived sandbox's agent socket.
func (sb *Sandbox) Socket() string { return sb.socket }

// InitPid is the host pid of the sandbox's first process.
func (sb *Sandbox) InitPid() int { return sb.w.InitPid() }

// Done is closed when the sandbox's first process has exited.
func (sb *Sandbox) Done() <-chan struct{} { return sb.w.Done() }

// Wait blocks until a one-shot sandbox's command has exited.
func (sb *Sandbox) Wait() wall.Exit { return sb.w.Wait() }

// Signal forwards sig to a one-shot sandbox's command.
func (sb *Sandbox) Signal(sig unix.Signal) error { return sb.w.Signal(sig) }

// Kill ends every process of the sandbox at once.
func (sb *Sandbox) Kill() { sb.w.Kill() }

// PTY is a one-shot sandbox's terminal (-t), nil otherwise.
func (sb *Sandbox) PTY() *os.File { return sb.w.Layers().PTY }

// Pause freezes every process of the sandbox.
func (sb *Sandbox) Pause() error { sb.mu.Lock(); defer sb.mu.Unlock(); return sb.w.Freeze() }

// Resume thaws it.
func (sb *Sandbox) Resume() error { sb.mu.Lock(); defer sb.mu.Unlock(); return sb.w.Thaw() }

// Usage is the kernel's accounting for the sandbox.
func (sb *Sandbox) Usage() Usage {
	st := sb.w.Stats()
	return Usage{CPU: st.CPUTime, MemoryPeak: st.MemoryPeak, Memory: sb.w.MemoryCurrent(), OOMKills: st.OOMKills, PidsLimited: st.PidsLimited}
}

// LimitEvents are the sandbox's OOM kills and refused forks so far (Usage's
// OOMKills and PidsLimited, read alone).
func (sb *Sandbox) LimitEvents() (oomKills, pidsLimited int64) { return sb.w.LimitEvents() }

// CPU is the CPU time the sandbox used so far (Usage's CPU, read alone).
func (sb *Sandbox) CPU() time.Duration { return sb.w.CPUTime() }

// ImageDigest is the content digest of the sandbox's image ("" for the
// host's).
func (sb *Sandbox) ImageDigest() string { return sb.layout.Digest }

// Wall names the wall the sandbox is on ("container", "gvisor").
func (sb *Sandbox) Wall() string { return sb.wall }

// WallVersion is the version of the wall's runtime ("" for airlock's own
// container wall; runsc's for gvisor).
func (sb *Sandbox) WallVersion() string { return sb.wallVersion }

// Degraded lists the controls the sandbox runs without.
func (sb *Sandbox) Degraded() []string { return sb.degraded }

// ScratchFull reports whether the sandbox's writable space is (nearly)
// full: its writes got ENOSPC.
func (sb *Sandbox) ScratchFull() bool {
	f := sb.w.Layers().WorkspaceUpper
	if f == nil {
		return false
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return false
	}
	return st.Bavail*uint64(st.Bsize) < 64<<10
}

// frozen runs fn with the sandbox frozen (as it was, if paused already), so
// that what the host reads is one consistent state no process changes. On
// a dead sandbox it runs fn at once: nothing runs to be frozen, and the
// destroy record never waits on another reader (a slow download).
func (sb *Sandbox) frozen(fn func() error) error {
	select {
	case <-sb.w.Done():
		return fn()
	default:
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	select {
	case <-sb.w.Done():
		return fn() // nothing runs any more: nothing to freeze
	default:
	}
	if !sb.w.Frozen() {
		if err := sb.w.Freeze(); err != nil {
			return err
		}
		defer func() { _ = sb.w.Thaw() }()
	}
	return fn()
}

// ChangeSet reads what changed in /workspace (on the frozen sandbox, or
// the dead one), within ctx's time.
func (sb *Sandbox) ChangeSet(ctx context.Context) (ch *workspace.Set, err error) {
	l := sb.w.Layers()
	err = sb.frozen(func() error {
		ch, err = workspace.Changes(ctx, sb.wsDir, l.WorkspaceUpper, l.Workspace)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("workspace changes: %w", err)
	}
	return ch, nil
}

// Diff streams the unified diff of /workspace since creation, at most
// about workspace.MaxDiffBytes (past it files are named, not diffed).
func (sb *Sandbox) Diff(ctx context.Context, w io.Writer) error {
	return sb.frozen(func() error {
		l := sb.w.Layers()
		ch, err := workspace.Changes(ctx, sb.wsDir, l.WorkspaceUpper, l.Workspace)
		if err != nil {
			return fmt.Errorf("workspace changes: %w", err)
		}
		return ch.WriteDiff(w, workspace.MaxDiffBytes)
	})
}

// Changes lists what changed in /workspace (on the frozen sandbox) and
// writes the patch, at most maxPatch bytes, to w, within ctx's time.
func (sb *Sandbox) Changes(ctx context.Context, w io.Writer, maxPatch int64) (out *workspace.Report, err error) {
	err = sb.frozen(func() error {
		l := sb.w.Layers()
		ch, err := workspace.Changes(ctx, sb.wsDir, l.WorkspaceUpper, l.Workspace)
		if err != nil {
			return err
		}
		out = ch.Report()
		return ch.WriteDiff(w, maxPatch)
	})
	return out, err
}

// Archive streams a tar of /workspace/rel, read from the host by the
// safe-access rules (workspace.Tar).
func (sb *Sandbox) Archive(ctx context.Context, rel string, maxBytes int64, start func(skipped []string) io.Writer) error {
	err := sb.frozen(func() error {
		return workspace.Tar(ctx, sb.w.Layers().Workspace, rel, maxBytes, start)
	})
	switch {
	case errors.Is(err, os.ErrNotExist):
		err = fmt.Errorf("%w: /workspace/%s", errdefs.ErrNotFound, rel)
	case errors.Is(err, safefs.ErrTooLarge):
		err = errdefs.New(errdefs.ErrTooLarge, err.Error()+": download a smaller directory")
	}
	return err
}

// Destroy kills every process of the sandbox and removes what the wall
// held; the network goes with it. The workspace stays readable (Changes)
// until Release.
func (sb *Sandbox) Destroy() error {
	sb.destroyOnce.Do(func() {
		sb.destroyErr = sb.w.Destroy()
		if sb.net != nil {
			sb.net.Close()
		}
	})
	return sb.destroyErr
}

// Egress sums up a proxy-mode sandbox's network activity once it is
// destroyed (nil without a network).
func (sb *Sandbox) Egress() *sandboxnet.Result {
	if sb.net == nil {
		return nil
	}
	return sb.net.Close()
}

// Release gives back what a destroyed sandbox still holds: the layers'
// descriptors, the image, the host paths, a repository checkout.
func (sb *Sandbox) Release() {
	sb.releaseOnce.Do(func() {
		sb.w.CloseFiles()
		_ = sb.release() // its steps cannot fail
	})
}
