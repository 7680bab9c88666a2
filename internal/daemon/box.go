package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/linux/landlock"
	"github.com/airlock-sandbox/airlock/internal/netns"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/workspace"
)

// Box is one long-lived sandbox (airlock serve): init serves the agent on
// a socket under the state directory instead of running one command.
type Box struct {
	e        *Engine
	sb       wall.Sandbox
	layout   *image.Layout
	host     *hostFiles // the spec's host paths, open while the box lives
	wsDir    string
	socket   string
	net      func() *EgressResult
	cleanup  func()
	image    string // the spec's image
	degraded []string
	writable bool

	mu          sync.Mutex // serialises freezes
	closeOnce   sync.Once
	releaseOnce sync.Once
	closeErr    error
}

var _ sandbox.Instance = (*Box)(nil)

// agentSocket is where sandbox id's agent listens on the host.
func (e *Engine) agentSocket(id string) string {
	return filepath.Join(e.cfg.StateDir, "agents", id+".sock")
}

// boxNProc leaves init room for its own threads below the pids limit.
func boxNProc(pids int64) uint64 {
	if pids > 64 {
		return uint64(pids - 32)
	}
	return 0
}

// Start creates long-lived sandbox id from s (validated with
// ValidateLongLived). It implements sandbox.Backend.
func (e *Engine) Start(ctx context.Context, id string, s *spec.Spec) (_ sandbox.Instance, err error) {
	if err := s.ValidateLongLived(); err != nil {
		return nil, err
	}
	landlockOn := true
	if abi := landlock.ABI(); abi < landlock.MinABI {
		if !s.Degraded("landlock") {
			return nil, errdefs.Unavailable(fmt.Sprintf("Landlock is unavailable (kernel ABI %d, need %d); allow_degraded [\"landlock\"] runs without it", abi, landlock.MinABI))
		}
		landlockOn = false
	}
	host, err := e.openHost(s)
	if err != nil {
		return nil, err
	}
	layout, err := e.resolveImage(ctx, s, host)
	if err != nil {
		host.close()
		return nil, err
	}
	b := &Box{e: e, layout: layout, host: host, socket: e.agentSocket(id), image: s.Image, writable: s.WritableRootfs}
	if !landlockOn {
		b.degraded = []string{"landlock"}
	}
	defer func() {
		if err != nil {
			b.release()
		}
	}()
	reservation, err := e.rt.Reserve(id)
	if err != nil {
		return nil, err
	}
	defer reservation.Release()
	b.wsDir = path(host.ws)
	if s.Repo != "" {
		dir, cleanup, err := e.checkout(ctx, s, host, id)
		if err != nil {
			return nil, err
		}
		b.wsDir, b.cleanup = dir, cleanup
	}
	o := e.options(s, layout, id)
	o.Workspace = b.wsDir
	o.Landlock = landlockOn
	o.AgentSocket = b.socket
	o.DieWithCreator = e.cfg.SandboxesDieWithUs
	o.NProc = boxNProc(s.Limits.Pids)
	// Each command chooses its user; root inside gets the small set.
	o.KeepCaps = rootCaps
	if s.NetMode() == "proxy" {
		if b.net, err = e.network(s, id, o, io.Discard, e.cfg.OnEgress); err != nil {
			return nil, err
		}
	}
	if b.sb, err = e.rt.Create(reservation, o); err != nil {
		return nil, err
	}
	return b, nil
}

// Adopt takes over long-lived sandbox id, made by an earlier daemon, whose
// init has host pid pid. A sandbox that cannot be adopted is destroyed
// (whatever of it is left) and an error says why.
func (e *Engine) Adopt(ctx context.Context, id string, s *spec.Spec, pid int) (sandbox.Instance, error) {
	sb, err := e.rt.Adopt(id, pid)
	if err != nil {
		return nil, err
	}
	var net func() *EgressResult
	if s.NetMode() == "proxy" {
		// The proxy lived in the old daemon: start it again on the same
		// veth; the sandbox's connections through the old one were cut.
		if net, err = e.adoptNetwork(s, id, pid); err != nil {
			_ = sb.Destroy()
			sb.CloseFiles()
			return nil, fmt.Errorf("sandbox %s: its network: %w; destroyed", id, err)
		}
	}
	host, err := e.openHost(s)
	var layout *image.Layout
	if err == nil {
		if layout, err = e.resolveImage(ctx, s, host); err != nil {
			host.close()
		}
	}
	if err != nil {
		_ = sb.Destroy()
		sb.CloseFiles()
		if net != nil {
			net()
		}
		return nil, fmt.Errorf("sandbox %s: its image or workspace: %w; destroyed", id, err)
	}
	wsDir := path(host.ws)
	if s.Repo != "" {
		wsDir = filepath.Join(e.cfg.DataDir, "tmp", id)
	}
	b := &Box{e: e, sb: sb, layout: layout, host: host, wsDir: wsDir, socket: e.agentSocket(id), net: net, image: s.Image, writable: s.WritableRootfs}
	if s.Repo != "" {
		b.cleanup = func() { _ = os.RemoveAll(wsDir) }
	}
	return b, nil
}

// Discard ends what is left of sandbox id that could not be adopted
// (sandbox.Backend).
func (e *Engine) Discard(id string) error {
	err := e.rt.Discard(id)
	_ = os.Remove(e.agentSocket(id))
	netns.Reap(filepath.Join(e.cfg.StateDir, "nets"))
	if err2 := workspace.GCRepos(e.cfg.DataDir+"/tmp", e.rt.Live); err2 != nil {
		err = errors.Join(err, err2)
	}
	return err
}

// LongLived lists the long-lived sandboxes of this state directory: those
// with an agent socket (sandbox.Backend).
func (e *Engine) LongLived() []string {
	ents, _ := os.ReadDir(filepath.Join(e.cfg.StateDir, "agents"))
	var ids []string
	for _, en := range ents {
		if id, ok := strings.CutSuffix(en.Name(), ".sock"); ok && e.rt.Live(id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// Socket is the host path of the sandbox's agent socket.
func (b *Box) Socket() string { return b.socket }

// InitPid is init's host pid.
func (b *Box) InitPid() int { return b.sb.InitPid() }

// Done is closed when the sandbox's init has exited.
func (b *Box) Done() <-chan struct{} { return b.sb.Done() }

// OOM is closed when the OOM killer fired in the sandbox.
func (b *Box) OOM() <-chan struct{} { return b.sb.OOM() }

// Pause freezes every process of the sandbox.
func (b *Box) Pause() error { b.mu.Lock(); defer b.mu.Unlock(); return b.sb.Freeze() }

// Resume thaws it.
func (b *Box) Resume() error { b.mu.Lock(); defer b.mu.Unlock(); return b.sb.Thaw() }

// Usage is the kernel's accounting for the sandbox.
func (b *Box) Usage() sandbox.Usage {
	st := b.sb.Stats()
	return sandbox.Usage{CPU: st.CPUTime, MemoryPeak: st.MemoryPeak, Memory: b.sb.MemoryCurrent(), OOMKills: st.OOMKills, PidsLimited: st.PidsLimited}
}

// frozen runs fn with the sandbox frozen (as it was, if paused already), so
// that what the host reads is one consistent state no process changes. On
// a dead sandbox it runs fn at once: nothing runs to be frozen, and the
// destroy record never waits on another reader (a slow download).
func (b *Box) frozen(fn func() error) error {
	select {
	case <-b.sb.Done():
		return fn()
	default:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.sb.Done():
		return fn() // nothing runs any more: nothing to freeze
	default:
	}
	was := b.sb.Frozen()
	if !was {
		if err := b.sb.Freeze(); err != nil {
			return err
		}
		defer func() { _ = b.sb.Thaw() }()
	}
	return fn()
}

// Diff streams the unified diff of /workspace since creation, at most
// about workspace.MaxDiffBytes (past it files are named, not diffed).
func (b *Box) Diff(ctx context.Context, w io.Writer) error {
	return b.frozen(func() error {
		ch, err := workspace.Changes(ctx, b.wsDir, b.sb.Layers().WorkspaceUpper, b.sb.Layers().Workspace)
		if err != nil {
			return fmt.Errorf("workspace changes: %w", err)
		}
		return ch.WriteDiff(w, workspace.MaxDiffBytes)
	})
}

// Changes lists what changed in /workspace (on the frozen sandbox) and
// writes the patch to w, within ctx's time.
func (b *Box) Changes(ctx context.Context, w io.Writer) (*sandbox.WorkspaceChanges, error) {
	out := &sandbox.WorkspaceChanges{}
	err := b.frozen(func() error {
		ch, err := workspace.Changes(ctx, b.wsDir, b.sb.Layers().WorkspaceUpper, b.sb.Layers().Workspace)
		if err != nil {
			return err
		}
		for _, c := range ch.Changes {
			out.Changes = append(out.Changes, sandbox.Change{Path: c.Path, Kind: string(c.Kind), Type: c.Type, Size: c.Size, SHA256: ch.Digest(c)})
		}
		for _, u := range ch.Unread {
			out.Unread = append(out.Unread, u.String())
		}
		out.Truncated = ch.Truncated
		return ch.WriteDiff(w, sandbox.MaxPatchBytes)
	})
	return out, err
}

// ImageDigest is the content digest of the sandbox's image ("" for the
// host's).
func (b *Box) ImageDigest() string { return b.layout.Digest }

// Degraded lists the controls the sandbox runs without.
func (b *Box) Degraded() []string { return b.degraded }

// Archive streams a tar of /workspace/rel, read from the host by the
// safe-access rules (workspace.Tar).
func (b *Box) Archive(ctx context.Context, rel string, maxBytes int64, start func(skipped []string) io.Writer) error {
	err := b.frozen(func() error {
		return workspace.Tar(ctx, b.sb.Layers().Workspace, rel, maxBytes, start)
	})
	switch {
	case errors.Is(err, os.ErrNotExist):
		err = fmt.Errorf("%w: /workspace/%s", errdefs.ErrNotFound, rel)
	case errors.Is(err, workspace.ErrTooLarge):
		err = errdefs.New(errdefs.ErrTooLarge, err.Error()+": download a smaller directory")
	}
	return err
}

// Destroy kills every process of the sandbox and removes all it held.
// The workspace stays readable (Changes) until Release.
func (b *Box) Destroy() error {
	b.closeOnce.Do(func() {
		b.closeErr = b.sb.Destroy()
		if b.net != nil {
			b.net()
			b.net = nil
		}
	})
	return b.closeErr
}

// Release gives back what a destroyed box still holds: the workspace's
// descriptors, the image, a repository checkout.
func (b *Box) Release() {
	b.releaseOnce.Do(b.release)
}

// release gives back what the box holds beside the runtime sandbox.
func (b *Box) release() {
	if b.sb != nil {
		b.sb.CloseFiles()
	}
	if b.net != nil {
		b.net()
	}
	if b.layout != nil {
		b.layout.Done()
	}
	if b.host != nil {
		b.host.close()
	}
	if b.cleanup != nil {
		b.cleanup()
	}
	_ = os.Remove(b.socket)
}
