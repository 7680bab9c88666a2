package image

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image/rootfs"
	"github.com/airlock-sandbox/airlock/internal/image/unpack"
	"github.com/airlock-sandbox/airlock/internal/progress"
)

// Cache layout: <dir>/<config digest hex>/{rootfs/, meta.json, use.lock}.
// An image is identified by its config digest (the image ID), so the same
// content pulled from a registry, an OCI layout or a docker-archive is
// unpacked once. Sandboxes hold use.lock shared while they run; eviction
// and `image rm` take it exclusively and skip images in use.

// Meta describes a cached image.
type Meta struct {
	ID       string    `json:"id"`
	Names    []string  `json:"names"`
	Size     int64     `json:"size"`
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used"`
	Env      []string  `json:"env,omitempty"`
	WorkDir  string    `json:"workdir,omitempty"`
}

// MaxConfigBytes caps an image's config blob, read whole into memory;
// MaxLayers caps its layers (each a fetch and an unpack).
const (
	maxLayerTrailer = 1 << 20
	MaxConfigBytes  = 16 << 20
	MaxLayers       = 1024
)

var platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// open opens image ref, reading its host path through at when that is set;
// fetched counts the bytes a registry sends for it. done removes what it
// copied.
func (s *Store) open(ctx context.Context, ref string, at *os.File, fetched *atomic.Int64) (img v1.Image, done func(), err error) {
	done = func() {}
	switch {
	case strings.HasPrefix(ref, "oci:"):
		p := strings.TrimPrefix(ref, "oci:")
		switch {
		case at != nil && s.Tenants:
			// A tenant's layout is copied out through contained opens: no
			// link in it reaches a host file.
			if p, err = s.copyLayout(at); err != nil {
				return nil, done, s.hide(ref, err)
			}
			done = func() { _ = os.RemoveAll(p) }
		case at != nil:
			p = fdPath(at)
		}
		img, err = openLayout(p)
		if err != nil {
			done()
			return nil, func() {}, s.hide(ref, err)
		}
		return img, done, nil
	case strings.HasPrefix(ref, "docker-archive:"):
		p := strings.TrimPrefix(ref, "docker-archive:")
		if at != nil {
			p = fdPath(at)
		}
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			return nil, done, s.hide(ref, fmt.Errorf("%w: --image %s: not a readable file", errdefs.ErrNotFound, ref))
		}
		if err := checkArchive(p); err != nil {
			return nil, done, s.hide(ref, err)
		}
		img, err := tarball.ImageFromPath(p, nil)
		if err != nil {
			return nil, done, s.hide(ref, unpack.Hostile("docker-archive %s: %v", strings.TrimPrefix(ref, "docker-archive:"), err))
		}
		return img, done, nil
	default:
		r, err := name.ParseReference(ref)
		if err != nil {
			return nil, done, errdefs.Invalid(fmt.Sprintf("--image %q: %v", ref, err))
		}
		if s.Tenants {
			if err := s.registryAllowed(r); err != nil {
				return nil, done, err
			}
		}
		// Say what is pulled from where before the first packet: a typo
		// shows here.
		progress.Report(ctx, progress.Event{Op: "pull", Subject: ref, Message: "pulling " + where(r)})
		s.log.Info("image pull", "image", ref, "registry", r.Context().RegistryStr())
		img, err := remote.Image(r, remote.WithContext(ctx), remote.WithPlatform(platform), remote.WithTransport(s.transport(fetched)))
		if err != nil {
			return nil, done, s.pullError(ref, r, err)
		}
		return img, done, nil
	}
}

func openLayout(p string) (v1.Image, error) {
	lp, err := layout.FromPath(p)
	if err != nil {
		return nil, fmt.Errorf("%w: --image oci:%s: %v", errdefs.ErrNotFound, p, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, unpack.Hostile("OCI layout %s: %v", p, err)
	}
	for depth := 0; depth < 4; depth++ {
		m, err := idx.IndexManifest()
		if err != nil {
			return nil, unpack.Hostile("OCI layout %s: %v", p, err)
		}
		var pick *v1.Descriptor
		for i := range m.Manifests {
			d := &m.Manifests[i]
			if len(m.Manifests) == 1 || d.Platform != nil && d.Platform.OS == platform.OS && d.Platform.Architecture == platform.Architecture {
				pick = d
				break
			}
		}
		if pick == nil {
			return nil, errdefs.Invalid(fmt.Sprintf("OCI layout %s holds %d images and none is linux/amd64", p, len(m.Manifests)))
		}
		if pick.MediaType.IsIndex() {
			if idx, err = idx.ImageIndex(pick.Digest); err != nil {
				return nil, unpack.Hostile("OCI layout %s: %v", p, err)
			}
			continue
		}
		img, err := idx.Image(pick.Digest)
		if err != nil {
			return nil, unpack.Hostile("OCI layout %s: %v", p, err)
		}
		return img, nil
	}
	return nil, unpack.Hostile("OCI layout %s: indexes nested too deep", p)
}

func (s *Store) resolveOCI(ctx context.Context, ref string, at *os.File, warn func(string)) (*rootfs.Layout, error) {
	if progress.Enabled(ctx) {
		// What was drawn goes at the end; a refusal before any report
		// draws nothing and ends nothing.
		outer, reported := ctx, false
		ctx = progress.With(ctx, func(e progress.Event) { reported = true; progress.Report(outer, e) })
		defer func() {
			if reported {
				progress.Report(outer, progress.Event{Op: "pull", Subject: ref, Done: true})
			}
		}()
	}
	if strings.HasPrefix(ref, "oci:") || strings.HasPrefix(ref, "docker-archive:") {
		return s.resolveOCIAt(ctx, ref, at, nil, warn)
	}
	var fetched atomic.Int64
	l, err := s.resolveOCIAt(ctx, ref, at, &fetched, warn)
	if r, perr := name.ParseReference(ref); err != nil && perr == nil {
		return nil, s.pullError(ref, r, err)
	}
	return l, err
}

// resolveOCIAt resolves ref; fetched is nil for an image read from the
// host, and counts a registry's bytes else.
func (s *Store) resolveOCIAt(ctx context.Context, ref string, at *os.File, fetched *atomic.Int64, warn func(string)) (*rootfs.Layout, error) {
	img, done, err := s.open(ctx, ref, at, fetched)
	if err != nil {
		if errors.Is(err, errdefs.ErrPermissionDenied) {
			return nil, err
		}
		// Offline: a registry reference already in the cache still works.
		if m, ok := s.byName(ref); ok && fetched != nil {
			if warn != nil {
				warn(fmt.Sprintf("%v; using the cached %s", err, ref))
			}
			return s.use(m, ref)
		}
		return nil, err
	}
	defer done()
	// go-containerregistry reads a config blob whole into memory, as far
	// as its manifest declares: a manifest declaring gigabytes would end
	// the daemon. Check what it declares first.
	man, err := img.Manifest()
	if err != nil {
		return nil, unpack.Hostile("%s: manifest: %v", ref, err)
	}
	if man.Config.Size > MaxConfigBytes || man.Config.Size < 0 {
		return nil, unpack.Hostile("%s: its config declares %d bytes (at most %d)", ref, man.Config.Size, MaxConfigBytes)
	}
	if len(man.Layers) > MaxLayers {
		return nil, unpack.Hostile("%s: %d layers (at most %d)", ref, len(man.Layers), MaxLayers)
	}
	id, err := img.ConfigName()
	if err != nil {
		return nil, unpack.Hostile("%s: no config digest: %v", ref, err)
	}
	// The cache is keyed by config digest, and shared by every tenant: the
	// config must be the one its digest names, and (in unpack) every layer
	// the one the config names, or one tenant's layout could fill the
	// cache entry of a public image another tenant pulls.
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, unpack.Hostile("%s: config: %v", ref, err)
	}
	if sum := sha256.Sum256(raw); id.Algorithm != "sha256" || hex.EncodeToString(sum[:]) != id.Hex {
		return nil, unpack.Hostile("%s: its config is not the one its digest %s names", ref, id)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, unpack.Hostile("%s: config: %v", ref, err)
	}
	if cf.OS != "" && cf.OS != "linux" || cf.Architecture != "" && cf.Architecture != "amd64" {
		return nil, errdefs.Invalid(fmt.Sprintf("--image %s is %s/%s; this host runs linux/amd64", ref, cf.OS, cf.Architecture))
	}
	dir := filepath.Join(s.dir, id.Hex)
	if m, err := readMeta(dir); err == nil {
		return s.use(m, ref)
	}
	unlock, err := lockPath(filepath.Join(s.dir, ".unpack.lock"), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if m, err := readMeta(dir); err == nil { // another run unpacked it meanwhile
		return s.use(m, ref)
	}
	m, err := s.unpack(ctx, img, man, id.Hex, ref, cf, fetched)
	if err != nil {
		return nil, err
	}
	s.evict(id.Hex)
	return s.use(m, ref)
}

func (s *Store) unpack(ctx context.Context, img v1.Image, man *v1.Manifest, id, ref string, cf *v1.ConfigFile, fetched *atomic.Int64) (*Meta, error) {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(s.dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	if err := os.MkdirAll(filepath.Join(tmp, "rootfs"), 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	layers, err := img.Layers()
	if err != nil {
		return nil, unpack.Hostile("%s: layers: %v", ref, err)
	}
	rep := &reporter{ctx: ctx, ref: ref, fetched: fetched, layers: len(layers), start: time.Now()}
	var count func(int64)
	if progress.Enabled(ctx) {
		count = rep.add
	}
	u, err := unpack.New(filepath.Join(tmp, "rootfs"), s.MaxBytes, count)
	if err != nil {
		return nil, err
	}
	defer u.Close()
	if len(cf.RootFS.DiffIDs) != len(layers) || len(man.Layers) != len(layers) {
		return nil, unpack.Hostile("%s: %d layers, and its config names %d", ref, len(layers), len(cf.RootFS.DiffIDs))
	}
	for i, l := range layers {
		rep.next(man.Layers[i].Size)
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, fmt.Errorf("%s layer %d/%d: %w", ref, i+1, len(layers), err)
		}
		// Hash what is unpacked, and the rest of the stream after the
		// archive's end (padding, within a bound), against the config.
		h := sha256.New()
		tee := io.TeeReader(rc, h)
		err = u.ApplyLayer(ctx, tee)
		if err == nil {
			var n int64
			if n, err = io.Copy(io.Discard, io.LimitReader(tee, maxLayerTrailer+1)); err == nil && n > maxLayerTrailer {
				err = unpack.Hostile("more than %d bytes after the archive's end", maxLayerTrailer)
			}
		}
		rc.Close()
		if want := cf.RootFS.DiffIDs[i]; err == nil && (want.Algorithm != "sha256" || hex.EncodeToString(h.Sum(nil)) != want.Hex) {
			err = unpack.Hostile("it is not the layer its config names (%s)", want)
		}
		if err != nil {
			return nil, fmt.Errorf("%s layer %d/%d: %w", ref, i+1, len(layers), err)
		}
	}
	progress.Report(ctx, progress.Event{Op: "unpack", Subject: ref, Stays: true, Message: fmt.Sprintf("unpacked %s: %d layers, %s MiB, in %s", ref, len(layers), progress.MiB(u.Written()), time.Since(rep.start).Round(time.Millisecond))})
	// The root directory itself is the sandbox's /: root-owned, 0755.
	if err := os.Chmod(filepath.Join(tmp, "rootfs"), 0o755); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	m := &Meta{ID: id, Names: []string{ref}, Size: u.Written(), Created: now, LastUsed: now, Env: cf.Config.Env, WorkDir: cf.Config.WorkingDir}
	if err := writeMeta(tmp, m); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "use.lock"), nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, id)); err != nil {
		return nil, err
	}
	return m, nil
}

// use records ref as a name of m, marks it used, and returns its layout,
// holding its use lock until Release.
func (s *Store) use(m *Meta, ref string) (*rootfs.Layout, error) {
	dir := filepath.Join(s.dir, m.ID)
	release, err := lockPath(filepath.Join(dir, "use.lock"), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(m.Names, ref) {
		m.Names = append(m.Names, ref)
	}
	m.LastUsed = time.Now().UTC()
	_ = writeMeta(dir, m)
	root := filepath.Join(dir, "rootfs")
	return &rootfs.Layout{
		Name: ref, Digest: "sha256:" + m.ID,
		Trees:   []rootfs.Tree{{HostPath: root, Target: "/"}},
		Passwd:  rootfs.ReadSmall(root, "etc/passwd"),
		Group:   rootfs.ReadSmall(root, "etc/group"),
		Env:     m.Env,
		Release: release,
	}, nil
}

func readMeta(dir string) (*Meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, err
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

func writeMeta(dir string, m *Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".meta.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "meta.json"))
}

// lockPath takes an flock (LOCK_SH or LOCK_EX) on path, blocking.
func lockPath(p string, how int) (func(), error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}

// List returns the cached images, most recently used first.
func (s *Store) List() ([]Meta, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []Meta
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if m, err := readMeta(filepath.Join(s.dir, e.Name())); err == nil {
			out = append(out, *m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastUsed.After(out[j].LastUsed) })
	return out, nil
}

func (s *Store) byName(ref string) (*Meta, bool) {
	all, _ := s.List()
	for i := range all {
		if slices.Contains(all[i].Names, ref) {
			return &all[i], true
		}
	}
	return nil, false
}

// ErrInUse is returned when removing an image a sandbox is using.
var ErrInUse = errors.New("image is in use by a running sandbox")

// Remove deletes a cached image named by name, ID or ID prefix (at least
// 12 hex digits). It refuses an image in use.
func (s *Store) Remove(ref string) (*Meta, error) {
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	var hit []Meta
	for _, m := range all {
		id := strings.TrimPrefix(ref, "sha256:")
		if slices.Contains(m.Names, ref) || len(id) >= 12 && strings.HasPrefix(m.ID, id) {
			hit = append(hit, m)
		}
	}
	switch len(hit) {
	case 0:
		return nil, fmt.Errorf("%w: no cached image %q", errdefs.ErrNotFound, ref)
	case 1:
	default:
		return nil, errdefs.Invalid(fmt.Sprintf("%q matches %d images; give more of the ID", ref, len(hit)))
	}
	return &hit[0], s.removeID(hit[0].ID)
}

func (s *Store) removeID(id string) error {
	dir := filepath.Join(s.dir, id)
	f, err := os.OpenFile(filepath.Join(dir, "use.lock"), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("%s: %w", id[:12], ErrInUse)
	}
	// Move aside first so no new sandbox finds it half-deleted.
	gone := filepath.Join(s.dir, ".rm-"+id)
	if err := os.Rename(dir, gone); err != nil {
		return err
	}
	return os.RemoveAll(gone)
}

// evict removes least recently used images until the cache fits MaxBytes,
// keeping keep and any image in use.
func (s *Store) evict(keep string) {
	all, err := s.List()
	if err != nil {
		return
	}
	var total int64
	for _, m := range all {
		total += m.Size
	}
	for i := len(all) - 1; i >= 0 && total > s.MaxBytes; i-- {
		if all[i].ID == keep {
			continue
		}
		if err := s.removeID(all[i].ID); err == nil {
			total -= all[i].Size
			s.log.Info("image evicted", "id", all[i].ID, "names", all[i].Names, "size", all[i].Size)
		}
	}
}

// maxArchiveEntries caps the entries of a docker-archive file (its layers
// and descriptions: a few per layer).
const maxArchiveEntries = 100000

// checkArchive reads the headers of docker-archive p and refuses it when
// its manifest.json or an image config it names is larger than
// MaxConfigBytes: go-containerregistry reads both whole into memory, and a
// tenant's archive (in its root) could hold gigabytes there.
func checkArchive(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	sizes := map[string]int64{}
	var manifest []byte
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		if n >= maxArchiveEntries {
			return unpack.Hostile("docker-archive: more than %d entries", maxArchiveEntries)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return unpack.Hostile("docker-archive: %v", err)
		}
		name := path.Clean(hdr.Name)
		sizes[name] = hdr.Size
		if name == "manifest.json" {
			if hdr.Size > MaxConfigBytes {
				return unpack.Hostile("docker-archive: manifest.json of %d bytes (at most %d)", hdr.Size, MaxConfigBytes)
			}
			if manifest, err = io.ReadAll(io.LimitReader(tr, MaxConfigBytes)); err != nil {
				return unpack.Hostile("docker-archive: %v", err)
			}
		}
	}
	var m []struct{ Config string }
	if err := json.Unmarshal(manifest, &m); err != nil {
		return unpack.Hostile("docker-archive: manifest.json: %v", err)
	}
	for _, d := range m {
		if sizes[path.Clean(d.Config)] > MaxConfigBytes {
			return unpack.Hostile("docker-archive: config %s of %d bytes (at most %d)", d.Config, sizes[path.Clean(d.Config)], MaxConfigBytes)
		}
	}
	return nil
}

// reporter reports an unpack's progress: a registry's bytes of each layer
// against the size its manifest declares, or (for an image read from the
// host) the bytes written; at most every reportEvery, and at each layer's
// start.
type reporter struct {
	ctx     context.Context
	ref     string
	fetched *atomic.Int64 // nil: read from the host
	layers  int
	start   time.Time
	last    time.Time

	layer   int
	base    int64 // fetched when the layer started
	size    int64 // the layer's declared size
	written int64
}

const reportEvery = 200 * time.Millisecond

func (r *reporter) next(size int64) {
	r.layer++
	r.size = size
	if r.fetched != nil {
		r.base = r.fetched.Load()
	}
	r.report()
}

func (r *reporter) add(n int64) {
	r.written += n
	if now := time.Now(); now.Sub(r.last) >= reportEvery {
		r.last = now
		r.report()
	}
}

func (r *reporter) report() {
	e := progress.Event{Op: "unpack", Subject: r.ref, Layer: r.layer, Layers: r.layers, Bytes: r.written}
	if r.fetched != nil {
		e.Op, e.Bytes, e.Total = "pull", r.fetched.Load()-r.base, r.size
	}
	progress.Report(r.ctx, e)
}
