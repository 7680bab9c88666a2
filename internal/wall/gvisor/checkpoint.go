package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/workspace/hostcopy"
	"golang.org/x/sys/unix"
)

// Checkpoint and restore (wall.Checkpointer). A checkpoint directory
// holds:
//
//	image/     runsc checkpoint's image of the sandbox's memory and kernel
//	scratch/   tmp/ and home/: the sandbox's /tmp and home as they were
//	spec.json  the bundle's spec (restoreMismatch compares a restore's)
//
// The sandbox's root and /workspace layers are the caller's to save (in
// files, called while the sandbox is paused, after gVisor has written back
// what it held of them): a restore must find exactly the files its memory
// was saved with, so nothing runs between the two.
//
// gVisor cannot save a socket backed by a host socket: the agent's, and
// the host's connections to it, are closed first (gvisor-hook close) and
// the agent listens again after (gvisor-hook listen), under a fresh name
// in its directory, moved out to the agent's socket path as at the start.
// The host's calls in flight on the agent (a streamed exec's output, an
// attach, a watch) are cut; the commands themselves run on.

// Names in a checkpoint directory.
const (
	checkpointImage   = "image"
	checkpointScratch = "scratch"
)

// hookTimeout bounds one gvisor-hook call.
const hookTimeout = time.Minute

func (sb *Sandbox) runscCmd(ctx context.Context, args ...string) error {
	all := append([]string{"--root", filepath.Join(sb.w.dir, runscRoot)}, args...)
	cmd := exec.CommandContext(ctx, sb.w.runsc, all...)
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc %s: %v: %s", args[0], err, runscError(strings.TrimSpace(string(out))))
	}
	return nil
}

// hook runs gvisor-hook inside the sandbox, as root.
func (sb *Sandbox) hook(req ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), hookTimeout)
	defer cancel()
	return sb.runscCmd(ctx, append([]string{"exec", "--user", "0:0", sb.id, initExe, "gvisor-hook"}, req...)...)
}

// relisten asks the agent to listen again and moves its socket to path.
func (sb *Sandbox) relisten(path string) error {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "agent-" + hex.EncodeToString(b) + ".sock"
	if err := sb.hook("listen", name); err != nil {
		return fmt.Errorf("%w: the agent did not listen again: %v", errdefs.ErrUnavailable, err)
	}
	return moveSocket(filepath.Join(sb.w.bundle(sb.id), "agent", name), path)
}

// Checkpoint saves the running sandbox's memory and its /tmp and home into
// dir (a new directory), calls files while it is paused, and lets it run
// on, its agent listening again at agentSocket.
func (sb *Sandbox) Checkpoint(dir, agentSocket string, files func() error) (err error) {
	if !sb.agent {
		return errdefs.Invalid("only a long-lived gvisor sandbox can be checkpointed")
	}
	select {
	case <-sb.exited:
		return errdefs.New(errdefs.ErrFailedPrecondition, "the sandbox has ended")
	default:
	}
	if sb.cg.Frozen() {
		return errdefs.New(errdefs.ErrFailedPrecondition, "the sandbox is paused: resume it first")
	}
	ctx := context.Background()
	if err := sb.hook("close"); err != nil {
		_ = sb.relisten(agentSocket)
		return fmt.Errorf("%w: the agent would not close its socket: %v", errdefs.ErrUnavailable, err)
	}
	defer func() {
		if lerr := sb.relisten(agentSocket); lerr != nil && err == nil {
			err = lerr
		}
	}()
	if err := sb.runscCmd(ctx, "pause", sb.id); err != nil {
		return err
	}
	defer func() {
		if rerr := sb.runscCmd(ctx, "resume", sb.id); rerr != nil && err == nil {
			err = rerr
		}
	}()
	// Paused, the kernel stays paused once saved (--leave-running resumes
	// only what the checkpoint paused), and it has written its cached file
	// data back to the layers.
	if err := sb.runscCmd(ctx, "checkpoint", "--image-path", filepath.Join(dir, checkpointImage), "--leave-running", sb.id); err != nil {
		return err
	}
	spec, err := os.ReadFile(filepath.Join(sb.w.bundle(sb.id), "config.json"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, checkpointSpec), spec, 0o600); err != nil {
		return err
	}
	scratch := filepath.Join(dir, checkpointScratch)
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return err
	}
	for _, d := range []string{"tmp", "home"} {
		if err := sb.w.copyTree(filepath.Join(sb.scratchView(), d), filepath.Join(scratch, d)); err != nil {
			return fmt.Errorf("checkpoint: /%s: %w", d, err)
		}
	}
	return files()
}

// restored waits for runsc restore to have the sandbox running again,
// then has its agent listen at path. The restored agent listens on nothing
// until asked (it was saved closed); runsc exec fails until the container
// runs.
func (sb *Sandbox) restored(path string) error {
	deadline := time.Now().Add(agentStart)
	for {
		err := sb.relisten(path)
		if err == nil {
			return nil
		}
		select {
		case <-sb.exited:
			return fmt.Errorf("%w: the restored gvisor sandbox ended: %s", errdefs.ErrUnavailable, saidIn(sb.w.bundle(sb.id), err))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: the restored gvisor sandbox did not start its agent within %s: %v", errdefs.ErrUnavailable, agentStart, err)
		}
	}
}

// scratchView is the sandbox's scratch as the host reaches it: through
// the mount namespace runsc lives in.
func (sb *Sandbox) scratchView() string {
	return fmt.Sprintf("/proc/%d/root%s", sb.pid, filepath.Join(sb.w.bundle(sb.id), "scratch"))
}

// copyTree copies the directory src, which the sandbox wrote, to dst
// (new) through internal/workspace/hostcopy: read as hostile (no link
// followed, no mount crossed, within its depth, entry and byte caps),
// owners, modes without set-id bits, times and hard links kept, special
// files (fifos, sockets) left out and logged.
func (w *Wall) copyTree(src, dst string) error {
	f, err := os.OpenFile(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	res, err := hostcopy.Copy(context.Background(), f, dst, hostcopy.Options{})
	if err != nil {
		return err
	}
	if len(res.Skipped) > 0 {
		w.log.Info("special files left out of a checkpoint's copy", "dir", filepath.Base(dst), "skipped", res.Skipped)
	}
	return nil
}

var _ wall.Checkpointer = (*Sandbox)(nil)

// shiftIDs gives the tree at dir, copied from the checkpoint of a sandbox
// that had another range of host ids, this sandbox's ids: the same id
// inside, another range outside. The checkpoint's range is read from dir's
// own owner, which prepare made the range's root (/tmp) or its sandbox
// user (home); an id outside that range becomes the range's nobody. No
// link is followed.
func shiftIDs(dir string, ids idRange) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	inside := uint32(0)
	if filepath.Base(dir) == "home" {
		inside = wall.SandboxUID
	}
	if st.Uid < inside {
		return fmt.Errorf("its owner %d is no sandbox's", st.Uid)
	}
	old := st.Uid - inside
	shift := func(id uint32) int {
		if id >= old && id-old < ids.Size {
			return int(ids.Base + (id - old))
		}
		return int(ids.Base + 65534)
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		return unix.Lchown(p, shift(st.Uid), shift(st.Gid))
	})
}

// checkpointSpec is the bundle's spec as it was checkpointed, in the
// checkpoint directory beside the image.
const checkpointSpec = "spec.json"

// restoreMismatch says how spec now, made for a restore, differs from
// saved, the checkpointed sandbox's, in what a restore must keep. runsc
// itself is told only to warn (--restore-spec-validation=warning), because
// a restored sandbox has host ids of its own; this check is the one that
// refuses, and it lets only what is per sandbox differ: the host side of
// the id maps (not the ids inside, nor the ranges' sizes), the host paths
// (the root's, the mounts' sources, the network namespace's), the
// environment and hostname (runsc allows both too), gvisor-init's
// configuration after its name (read at its start only: the restored
// init runs on from memory), and tmpfs sizes (a restored tmpfs is in the
// saved memory, at the size it had). Everything else — the mounts and
// their options, the root's read-only flag, the user, working directory,
// capabilities, rlimits, no_new_privs, the namespaces and sysctls — must
// be as checkpointed.
func restoreMismatch(saved, now *ociSpec) error {
	norm := func(s ociSpec) ociSpec {
		s.Root.Path, s.Hostname, s.Process.Env = "", "", nil
		if len(s.Process.Args) > 2 {
			s.Process.Args = s.Process.Args[:2]
		}
		ms := make([]ociMount, len(s.Mounts))
		for i, m := range s.Mounts {
			m.Source = ""
			if m.Type == "tmpfs" {
				m.Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool { return strings.HasPrefix(o, "size=") })
			}
			ms[i] = m
		}
		s.Mounts = ms
		ns := make([]ociNamespace, len(s.Linux.Namespaces))
		for i, n := range s.Linux.Namespaces {
			ns[i] = ociNamespace{Type: n.Type}
		}
		s.Linux.Namespaces = ns
		idm := func(in []ociIDMap) []ociIDMap {
			out := make([]ociIDMap, len(in))
			for i, m := range in {
				out[i] = ociIDMap{ContainerID: m.ContainerID, Size: m.Size}
			}
			return out
		}
		s.Linux.UIDMappings, s.Linux.GIDMappings = idm(s.Linux.UIDMappings), idm(s.Linux.GIDMappings)
		return s
	}
	a, b := norm(*saved), norm(*now)
	for _, f := range []struct {
		what     string
		old, new any
	}{
		{"the OCI version", a.Version, b.Version},
		{"the root", a.Root, b.Root},
		{"the mounts", a.Mounts, b.Mounts},
		{"the process", a.Process, b.Process},
		{"the namespaces, id maps or sysctls", a.Linux, b.Linux},
	} {
		if !reflect.DeepEqual(f.old, f.new) {
			return errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("the checkpoint cannot be restored here: %s differ from the checkpointed sandbox's (restore it with the settings it was saved with: the same wall, --writable-rootfs, trees, workspace, user and capabilities)", f.what))
		}
	}
	return nil
}

// savedSpec reads the spec a checkpoint in dir was saved with.
func savedSpec(dir string) (*ociSpec, error) {
	b, err := os.ReadFile(filepath.Join(dir, checkpointSpec))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "the checkpoint has no record of the sandbox it was saved from (an older airlock saved it): take a new one")
	}
	if err != nil {
		return nil, err
	}
	var s ociSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("checkpoint spec: %w", err)
	}
	return &s, nil
}
