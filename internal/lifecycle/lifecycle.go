// Package lifecycle is the one path by which a sandbox is made, used and
// destroyed, for `airlock run`, `airlock serve` and `airlock mcp` alike:
// a validated spec is checked against the wall's controls (Landlock), its
// host paths are opened (beneath a tenant's roots; internal/lifecycle/hostfiles),
// its image resolved, its id reserved, its workspace checked out or copied, its
// network brought up (internal/sandboxnet), and the prepared root, limits
// and namespace are handed to a wall (internal/wall) to start. Teardown is
// the reverse, in one place (Sandbox.Destroy, Sandbox.Release). A
// long-lived sandbox serves the agent; a one-shot one runs its command
// with the caller's streams (internal/run). Nothing here knows tenants,
// records or the API: callers above (internal/sandbox, internal/run) do.
package lifecycle

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/sandboxnet"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/workspace/checkout"
)

// Config is the host's side of every sandbox.
type Config struct {
	StateDir string // default /run/airlock
	DataDir  string // default /var/lib/airlock
	Log      *slog.Logger
	// Warn receives one-line warnings meant for the user (stderr).
	Warn func(string)
	// Net configures proxy-mode sandboxes' networks (its StateDir and
	// logging are filled from here).
	Net sandboxnet.Config
	// ImageCacheBytes caps the OCI image cache (least recently used images
	// are evicted past it); 0: image.DefaultCacheBytes.
	ImageCacheBytes int64
	// SandboxesDieWithUs makes long-lived sandboxes die with this process
	// (airlock mcp's embedded service, which no later daemon adopts from).
	SandboxesDieWithUs bool
	// TenantImages makes images tenants' names (airlock serve): registry
	// pulls only from Registries, dialled through the egress address
	// guard; errors that say nothing of host files or registries' answers.
	// Unset (airlock run, airlock mcp), any registry is pulled from.
	TenantImages bool
	Registries   []string
}

// Lifecycle makes sandboxes on the walls it is given, each on the one its
// spec names (spec.Spec.Wall).
type Lifecycle struct {
	cfg    Config
	walls  []wall.Wall
	images *image.Store
}

// New prepares the image store for sandboxes on walls (at least one; each
// named once).
func New(cfg Config, walls ...wall.Wall) (*Lifecycle, error) {
	seen := map[string]bool{}
	for _, w := range walls {
		if seen[w.Name()] {
			return nil, fmt.Errorf("lifecycle: wall %s given twice", w.Name())
		}
		seen[w.Name()] = true
	}
	if len(walls) == 0 {
		return nil, fmt.Errorf("lifecycle: no wall")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = "/run/airlock"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "/var/lib/airlock"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Warn == nil {
		cfg.Warn = func(string) {}
	}
	cfg.Net.StateDir, cfg.Net.Log, cfg.Net.Warn = cfg.StateDir, cfg.Log, cfg.Warn
	images, err := image.NewStore(cfg.DataDir+"/images", cfg.Log)
	if err != nil {
		return nil, err
	}
	if cfg.ImageCacheBytes > 0 {
		images.MaxBytes = cfg.ImageCacheBytes
	}
	if cfg.TenantImages {
		images.Tenants, images.Registries = true, cfg.Registries
		images.Dial = cfg.Net.RegistryDial()
	}
	return &Lifecycle{cfg: cfg, walls: walls, images: images}, nil
}

// wallOf is the wall named name; a spec naming a wall this process lacks
// is refused, never made on another.
func (l *Lifecycle) wallOf(name string) (wall.Wall, error) {
	for _, w := range l.walls {
		if w.Name() == name {
			return w, nil
		}
	}
	return nil, errdefs.Unavailable(fmt.Sprintf("--isolation %s: this airlock has no such wall", name))
}

// live reports whether sandbox id is held by a live process, on any wall.
func (l *Lifecycle) live(id string) bool {
	for _, w := range l.walls {
		if w.Live(id) {
			return true
		}
	}
	return false
}

// NewID returns a fresh sandbox id.
func NewID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Images is the image store.
func (l *Lifecycle) Images() *image.Store { return l.images }

// GC removes what dead sandboxes left behind, on every wall.
func (l *Lifecycle) GC() ([]string, error) {
	var ids []string
	var err error
	for _, w := range l.walls {
		wids, werr := w.GC()
		ids, err = append(ids, wids...), errors.Join(err, werr)
	}
	if err2 := checkout.GCRepos(l.cfg.DataDir+"/tmp", l.live); err2 != nil {
		err = errors.Join(err, err2)
	}
	err = errors.Join(err, sandboxnet.Reap(l.cfg.StateDir))
	l.gcSnapshotStages()
	// A long-lived sandbox's agent socket, once its sandbox is gone (its
	// creator died without a word).
	socks, _ := filepath.Glob(filepath.Join(l.cfg.StateDir, "agents", "*.sock"))
	marks, _ := filepath.Glob(filepath.Join(l.cfg.StateDir, "agents", "*"+creatingSuffix))
	for _, s := range slices.Concat(socks, marks) {
		if id := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(s), ".sock"), creatingSuffix); !l.live(id) {
			_ = os.Remove(s)
		}
	}
	return ids, err
}

// Discard ends what is left of sandbox id that could not be adopted.
func (l *Lifecycle) Discard(id string) error {
	var err error
	for _, w := range l.walls {
		err = errors.Join(err, w.Discard(id))
	}
	_ = os.Remove(l.agentSocket(id))
	_ = os.Remove(l.creatingMark(id))
	err = errors.Join(err, sandboxnet.Reap(l.cfg.StateDir))
	if err2 := checkout.GCRepos(l.cfg.DataDir+"/tmp", l.live); err2 != nil {
		err = errors.Join(err, err2)
	}
	return err
}

// LongLived lists the long-lived sandboxes of this state directory: those
// with an agent socket, or being made (creatingMark), and a live holder.
func (l *Lifecycle) LongLived() []string {
	ents, _ := os.ReadDir(filepath.Join(l.cfg.StateDir, "agents"))
	var ids []string
	seen := map[string]bool{}
	for _, en := range ents {
		id, ok := strings.CutSuffix(en.Name(), ".sock")
		if !ok {
			id, ok = strings.CutSuffix(en.Name(), creatingSuffix)
		}
		if ok && !seen[id] && l.live(id) {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// creatingSuffix names the mark of a long-lived sandbox being made.
const creatingSuffix = ".creating"

// creatingMark is the file that says long-lived sandbox id is being made
// (its agent's socket is not there yet).
func (l *Lifecycle) creatingMark(id string) string {
	return filepath.Join(l.cfg.StateDir, "agents", id+creatingSuffix)
}

// agentSocket is where sandbox id's agent listens on the host.
func (l *Lifecycle) agentSocket(id string) string {
	return filepath.Join(l.cfg.StateDir, "agents", id+".sock")
}
