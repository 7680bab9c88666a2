// Package gvisor is the gVisor wall (internal/wall): a sandbox is an OCI
// container run by runsc, whose Sentry (gVisor's kernel, in Go, itself
// confined by namespaces and seccomp on the host) answers the sandbox's
// system calls, so that code in it never reaches the host kernel's whole
// syscall surface. The host side is airlock's: it checks runsc (the pinned
// version, root-owned), makes the sandbox's cgroup with its limits
// (internal/linux/cgroup: v2 or v1, detected), and builds the bundle in a
// mount namespace of its own made for the sandbox: a size-capped tmpfs
// holding the generated top layer and the writable layers (kernel
// overlayfs over the image's trees and the workspace), so that the host
// reads what the sandbox wrote through Layers exactly as for the container
// wall, and every mount goes when the sandbox's last process does. runsc
// runs --ignore-cgroups (it is born in the sandbox's cgroup),
// --overlay2=none (writes go to the host's layers), --network=none, or
// --network=sandbox in the network namespace the host made (proxy mode),
// whose veth gVisor's netstack takes over; on systrap. It pauses through
// runsc, never the cgroup freezer (pause.go says why). A long-lived
// sandbox's first process
// is airlock-init's gvisor-init serving the agent (longlived.go; the
// binary internal/wall/initexe found and checked), and is adopted
// again after a restart. The Sentry and the gofer never run as host root:
// runsc starts them in a user namespace (the bundle's) mapped to a host
// uid range leased for the sandbox from the pool the container wall
// leases from (internal/wall/uidlease), and the image's trees, the
// generated layer and the workspace are shown owned in that range. It
// imports internal/wall, internal/wall/uidlease, internal/wall/initexe,
// internal/linux/*, internal/errdefs, internal/cleanup, nsinit (for
// gvisor-init's wire type) and its rootfs (whose Write makes the generated
// layer's files, as on the container wall), and
// internal/workspace/hostcopy (to copy a checkpoint's /tmp and home, which
// the sandbox wrote), nothing above.
//
// A one-shot sandbox's terminal (-t) is runsc's console: its master comes
// over a root-only socket (console.go), and gvisor-init inside starts the
// command on a terminal of the Sentry's (nsinit's gvisortty.go).
package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/linux/cgroup"
	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/wall/initexe"
	"github.com/airlock-sandbox/airlock/internal/wall/uidlease"
	"golang.org/x/sys/unix"
)

// Paths under STATE_DIR/gvisor.
const (
	lockDir   = "sandboxes" // one lock file per live sandbox
	bundleDir = "bundles"   // one bundle directory per sandbox
	runscRoot = "runsc"     // runsc's own state (--root)
	// The identity of the runsc last found at the pinned version
	// (CheckCached).
	runscChecked = "runsc.checked"
)

// Wall makes gVisor sandboxes (wall.Wall).
type Wall struct {
	dir     string // STATE_DIR/gvisor
	log     *slog.Logger
	cgroups *cgroup.Host
	leases  *uidlease.Pool
	runsc   string
	init    *initexe.Init
}

// Scope is the cgroup parent of a state directory's gVisor sandboxes:
// "airlock-gvisor" for the default /run/airlock, "airlock-gvisor-<hash>"
// for another (apart from the container wall's, whose gc would otherwise
// take these for its own).
func Scope(stateDir string) string {
	if filepath.Clean(stateDir) == "/run/airlock" {
		return "airlock-gvisor"
	}
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return "airlock-gvisor-" + hex.EncodeToString(sum[:4])
}

// New prepares the wall under stateDir with the runsc at runscPath
// (DefaultRunsc when "") and airlock-init bin. A missing or wrong runsc or
// airlock-init does not fail New: the container wall goes on working (or
// not: it runs bin too), and every gvisor create fails saying why (Runsc,
// initexe).
func New(stateDir, runscPath string, bin *initexe.Init, log *slog.Logger) (*Wall, error) {
	if runscPath == "" {
		runscPath = DefaultRunsc
	}
	w := &Wall{dir: filepath.Join(stateDir, "gvisor"), log: log, runsc: runscPath, init: bin, leases: uidlease.Of(stateDir)}
	cg, err := cgroup.Detect()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	cg.Parent = Scope(stateDir)
	w.cgroups = cg
	// A sandbox's gofer opens its bundle's root as the sandbox's root (a
	// leased uid): the way there is traversable, not readable.
	for _, d := range []struct {
		p    string
		mode os.FileMode
	}{
		{stateDir, 0o711}, {w.dir, 0o711}, {filepath.Join(w.dir, bundleDir), 0o711},
		{filepath.Join(w.dir, lockDir), 0o700}, {filepath.Join(w.dir, runscRoot), 0o700}, {w.leases.Dir, 0o700},
	} {
		if err := os.MkdirAll(d.p, d.mode); err != nil {
			return nil, fmt.Errorf("create state directory: %w", err)
		}
		if err := os.Chmod(d.p, d.mode); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Runsc checks the configured runsc, at every use: a look at the file,
// which is not run again while the state directory remembers it as
// checked (the same file, unchanged), so that one replaced while a daemon
// runs is checked before it is used.
func (w *Wall) Runsc() Runsc {
	return CheckCached(w.runsc, filepath.Join(w.dir, runscChecked))
}

// Name is "gvisor".
func (w *Wall) Name() string { return "gvisor" }

// Version is runsc's version ("" when it cannot be used).
func (w *Wall) Version() string { return w.Runsc().Version }

// Missing is empty: Landlock is the container wall's; what gVisor needs
// and lacks fails the create.
func (w *Wall) Missing() []wall.Missing { return nil }

// Reservation holds a sandbox id's lock until the sandbox is destroyed.
type Reservation struct {
	id   string
	lock *lockfile.Lock
	used bool
}

// ID is the reserved id.
func (r *Reservation) ID() string { return r.id }

// Release gives the id up unless a sandbox was created with it.
func (r *Reservation) Release() {
	if !r.used {
		r.lock.Release()
		r.used = true
	}
}

func (w *Wall) lockPath(id string) string { return filepath.Join(w.dir, lockDir, id+".lock") }

// Reserve takes the lock of a new sandbox id.
func (w *Wall) Reserve(id string) (wall.Reservation, error) {
	l, err := lockfile.TryLock(w.lockPath(id))
	if err != nil {
		return nil, err
	}
	if l == nil {
		return nil, fmt.Errorf("sandbox id %s is in use", id)
	}
	return &Reservation{id: id, lock: l}, nil
}

// Live reports whether sandbox id's lock is held.
func (w *Wall) Live(id string) bool {
	l, err := lockfile.TryLock(w.lockPath(id))
	if err != nil || l == nil {
		return true
	}
	l.Release()
	return false
}

// GC removes what dead sandboxes left behind (their creator was killed):
// runsc's processes in the sandbox's cgroup, runsc's state, the bundle
// directory, the cgroup and the lock file. A live sandbox (its lock held)
// is never touched.
func (w *Wall) GC() (removed []string, err error) {
	seen := map[string]bool{}
	for _, d := range []string{lockDir, bundleDir} {
		ents, _ := os.ReadDir(filepath.Join(w.dir, d))
		for _, e := range ents {
			seen[strings.TrimSuffix(e.Name(), ".lock")] = true
		}
	}
	for _, id := range w.cgroups.List() {
		seen[id] = true
	}
	var errs []error
	// uid leases of dead holders (a runsc run killed with its sandbox).
	w.leases.Reap()
	for id := range seen {
		l, lerr := lockfile.TryLock(w.lockPath(id))
		if lerr != nil {
			errs = append(errs, lerr)
			continue
		}
		if l == nil {
			continue // alive
		}
		if err := w.remove(id, w.cgroups.Open(id)); err != nil {
			errs = append(errs, err)
		}
		l.Release()
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// remove kills every process of sandbox id's cgroup and removes runsc's
// state, the bundle and the cgroup. The caller holds the id's lock.
func (w *Wall) remove(id string, cg *cgroup.Cgroup) error {
	for _, p := range cg.Procs() {
		_ = unix.Kill(p, unix.SIGKILL)
	}
	var errs []error
	// runsc's record of the container (its processes are gone already),
	// left only when runsc run did not end on its own: its state files
	// are named "<id>_sandbox:<id>.state" (runsc/container/state_file.go).
	left, _ := filepath.Glob(filepath.Join(w.dir, runscRoot, id+"_sandbox:*"))
	if len(left) > 0 && w.Runsc().Err == nil {
		if out, err := exec.Command(w.runsc, "--root", filepath.Join(w.dir, runscRoot), "delete", "--force", id).CombinedOutput(); err != nil &&
			!strings.Contains(string(out), "does not exist") {
			w.log.Debug("runsc delete", "id", id, "err", err, "out", string(out))
		}
	}
	// What runsc delete did not remove, or had no state to remove by: its
	// lock file when runsc run was killed before it wrote the container's
	// state file, say, or the sandbox's control socket
	// ("runsc-<id>.sock") when runsc run was killed while it cleaned up
	// after its sandbox.
	left, _ = filepath.Glob(filepath.Join(w.dir, runscRoot, id+"_sandbox:*"))
	left = append(left, filepath.Join(w.dir, runscRoot, "runsc-"+id+".sock"))
	for _, f := range left {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// The bundle's mounts lived in the sandbox's own mount namespace: on
	// the host its directory is plain.
	if err := os.RemoveAll(filepath.Join(w.dir, bundleDir, id)); err != nil {
		errs = append(errs, err)
	}
	if err := cg.Remove(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

var _ wall.Wall = (*Wall)(nil)
