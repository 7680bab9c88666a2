package image

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Store resolves image names and keeps the cache of unpacked OCI images.
type Store struct {
	dir string
	log *slog.Logger
	// MaxBytes caps the cache; least recently used images are evicted.
	MaxBytes int64
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

// Resolve turns an image name into a Layout. progress receives one-line
// progress messages when the image must be fetched or unpacked.
func (s *Store) Resolve(ctx context.Context, name string, progress func(string)) (*Layout, error) {
	switch {
	case name == "" || name == "host":
		return Host(filepath.Join(filepath.Dir(s.dir), "hostetc"))
	case strings.HasPrefix(name, "/"):
		return Dir(name)
	default:
		return s.resolveOCI(ctx, name, progress)
	}
}

// Dir returns the layout of a root filesystem directory. Its files keep the
// ownership they have on the host (uid 0 appears as root inside).
func Dir(path string) (*Layout, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --image %s: %v", errdefs.ErrNotFound, path, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.Invalid(fmt.Sprintf("--image %s: not a directory", path))
	}
	l := &Layout{Name: path, Trees: []Tree{{HostPath: path, Target: "/"}}}
	l.Passwd = readSmall(path, "etc/passwd")
	l.Group = readSmall(path, "etc/group")
	return l, nil
}
