package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image/unpack"
)

// What a tenant's image name may make the daemon do on the host: pull only
// from a registry the operator listed, over connections the egress address
// guard allows (Store.Dial), and read an OCI layout only through contained
// opens. What it learns back is a summary: never a registry's answer body,
// never whether a host file exists.

// registryAllowed says whether the operator listed r's registry.
func (s *Store) registryAllowed(r name.Reference) error {
	reg := r.Context().RegistryStr()
	for _, l := range s.Registries {
		if n, err := name.NewRegistry(l); err == nil && n.RegistryStr() == reg {
			return nil
		}
	}
	listed := "none are listed"
	if len(s.Registries) > 0 {
		listed = "the operator lists " + strings.Join(s.Registries, ", ")
	}
	return summarised{errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("--image %s: tenants pull only from the registries the operator lists (airlock serve --registry HOST[:PORT]); %s", r.Name(), listed))}
}

// transport dials registries through s.Dial, with no proxy.
func (s *Store) transport() http.RoundTripper {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = s.Dial
	return t
}

// summarised is an error already stripped of what a registry said.
type summarised struct{ error }

func (e summarised) Unwrap() error { return e.error }

// summarise says what went wrong with a pull without repeating the
// registry's answer: its status code at most.
func (s *Store) summarise(ref string, err error) error {
	var done summarised
	if errors.As(err, &done) {
		return err
	}
	s.log.Info("image pull failed", "image", ref, "err", err)
	var te *transport.Error
	switch {
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return summarised{errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("--image %s: the registry's address is one airlock never dials (loopback, private, link-local or metadata)", ref))}
	case errors.As(err, &te):
		class := errdefs.ErrUnavailable
		if te.StatusCode == http.StatusNotFound || te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden {
			class = errdefs.ErrNotFound
		}
		return summarised{errdefs.New(class, fmt.Sprintf("--image %s: the registry answered HTTP %d", ref, te.StatusCode))}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return summarised{errdefs.New(errdefs.ErrTimeout, fmt.Sprintf("--image %s: the pull did not finish in time", ref))}
	case errors.Is(err, unpack.ErrHostile):
		return summarised{errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("--image %s: the registry served an image airlock refuses to unpack", ref))}
	}
	return summarised{errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("--image %s: the registry could not be reached or answered with something other than an image", ref))}
}

// containedOpen opens rel beneath dir: no link at all, no magic link, no
// other mount.
func containedOpen(dir *os.File, rel string, flags int) (*os.File, error) {
	fd, err := unix.Openat2(int(dir.Fd()), rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// safeName is a layout's blob directory or file name.
func safeName(n string) bool {
	if n == "" || len(n) > 200 {
		return false
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '+' || c == '.') {
			return false
		}
	}
	return n != "." && n != ".."
}

// copyLayout copies the OCI layout at (a directory a tenant chose) into a
// private directory of the cache: oci-layout, index.json and blobs/ALG/HEX,
// regular files only, no link followed, up to MaxBytes in all.
func (s *Store) copyLayout(at *os.File) (string, error) {
	dir, err := os.MkdirTemp(s.dir, ".layout-")
	if err != nil {
		return "", err
	}
	left := s.MaxBytes
	cp := func(rel string) error {
		src, err := containedOpen(at, rel, unix.O_RDONLY)
		if err != nil {
			return err
		}
		defer src.Close()
		if fi, err := src.Stat(); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file", rel)
		}
		if err := os.MkdirAll(filepath.Join(dir, path.Dir(rel)), 0o700); err != nil {
			return err
		}
		dst, err := os.OpenFile(filepath.Join(dir, rel), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		n, err := io.Copy(dst, io.LimitReader(src, left+1))
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
		if left -= n; left < 0 {
			return fmt.Errorf("%w: the layout is larger than the image cache", errdefs.ErrTooLarge)
		}
		return err
	}
	list := func(rel string) ([]string, error) {
		d, err := containedOpen(at, rel, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		return d.Readdirnames(-1)
	}
	err = func() error {
		for _, f := range []string{"oci-layout", "index.json"} {
			if err := cp(f); err != nil {
				return err
			}
		}
		algs, err := list("blobs")
		if err != nil {
			return err
		}
		for _, a := range algs {
			if !safeName(a) {
				return fmt.Errorf("blobs/%q: not a digest algorithm", a)
			}
			blobs, err := list("blobs/" + a)
			if err != nil {
				return err
			}
			for _, b := range blobs {
				if !safeName(b) {
					return fmt.Errorf("blobs/%s/%q: not a digest", a, b)
				}
				if err := cp("blobs/" + a + "/" + b); err != nil {
					return err
				}
			}
		}
		return nil
	}()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}
