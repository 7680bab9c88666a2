package image

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image/rootfs"
)

// Store resolves image names and keeps the cache of unpacked OCI images.
type Store struct {
	dir string
	log *slog.Logger
	// MaxBytes caps the cache; least recently used images are evicted.
	MaxBytes int64
	// Tenants makes the store serve names tenants chose (airlock serve):
	// registry references only to Registries, dialled through Dial; OCI
	// layouts read through contained opens only; errors carry neither a
	// registry's answer nor a host file's details. Unset (airlock run and
	// mcp), any registry is pulled from with the host's network.
	Tenants    bool
	Registries []string
	Dial       func(ctx context.Context, network, addr string) (net.Conn, error)
}

// DefaultCacheBytes is the cache cap unless configured otherwise.
const DefaultCacheBytes = 20 << 30

// NewStore opens (creating) the cache directory dir.
func NewStore(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	return &Store{dir: dir, log: log, MaxBytes: DefaultCacheBytes}, nil
}

// Resolve turns an image name into a Layout. warn receives a one-line
// warning (a registry that failed, and the cached copy used instead);
// ctx's progress sink (internal/progress) hears what is pulled from where,
// and the pull's and unpack's progress.
func (s *Store) Resolve(ctx context.Context, name string, warn func(string)) (*rootfs.Layout, error) {
	return s.ResolveAt(ctx, name, nil, warn)
}

// ResolveAt is Resolve with the host path name stands for (a rootfs
// directory, an oci: layout or a docker-archive: file) already opened, as
// at: it is read only through at, never by its name. at nil opens the name.
func (s *Store) ResolveAt(ctx context.Context, name string, at *os.File, warn func(string)) (*rootfs.Layout, error) {
	if s.Tenants && at == nil && (strings.HasPrefix(name, "/") || strings.HasPrefix(name, "oci:") || strings.HasPrefix(name, "docker-archive:")) {
		return nil, fmt.Errorf("%w: image %s: a tenant's image path is read only once opened beneath its root", errdefs.ErrInternal, name)
	}
	switch {
	case name == "" || name == "host":
		return rootfs.Host(filepath.Join(filepath.Dir(s.dir), "hostetc"))
	case strings.HasPrefix(name, "/"):
		p := name
		if at != nil {
			p = fdPath(at)
		}
		l, err := rootfs.Dir(p)
		if err != nil {
			return nil, s.hide(name, err)
		}
		l.Name = name
		return l, nil
	default:
		return s.resolveOCI(ctx, name, at, warn)
	}
}

// hide keeps what a tenant learns of a host file to its name.
func (s *Store) hide(name string, err error) error {
	if !s.Tenants || err == nil {
		return err
	}
	s.log.Info("image refused", "image", name, "err", err)
	return errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("--image %s: not an image this tenant can use (missing, unreadable, invalid and outside the tenant's roots all answer alike)", name))
}

func fdPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }
