package image

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

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

// transport dials registries through s.Dial (the host's own dialer when
// unset), with no proxy; fetched, when set, counts the bytes of every
// answer body (for progress).
func (s *Store) transport(fetched *atomic.Int64) http.RoundTripper {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	if s.Dial != nil {
		t.DialContext = s.Dial
	}
	if fetched == nil {
		return t
	}
	return counting{t, fetched}
}

// counting is a transport that counts the bytes of the bodies it reads.
type counting struct {
	http.RoundTripper
	n *atomic.Int64
}

func (c counting) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.RoundTripper.RoundTrip(r)
	if err == nil && resp.Body != nil {
		resp.Body = &countedBody{resp.Body, c.n}
	}
	return resp, err
}

type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// where names what a pull fetches and from where, as a person reads it:
// "docker.io/library/python:3.12 (index.docker.io)".
func where(r name.Reference) string {
	reg := r.Context().RegistryStr()
	shown := reg
	if reg == name.DefaultRegistry {
		shown = "docker.io"
	}
	sep := ":"
	if _, ok := r.(name.Digest); ok {
		sep = "@"
	}
	return fmt.Sprintf("%s/%s%s%s (%s)", shown, r.Context().RepositoryStr(), sep, r.Identifier(), reg)
}

// summarised is an error already stripped of what a registry said.
type summarised struct{ error }

func (e summarised) Unwrap() error { return e.error }

// pullError says what went wrong with pulling ref from r's registry, in a
// class that tells a typo (not found), a refusal (permission denied) and a
// network that failed (unavailable, timeout) apart. A tenant's answer is a
// summary: never the registry's answer body, its status code and error
// code at most. An error the pull did not cause is returned as it is to
// the host's user, and summarised for a tenant.
func (s *Store) pullError(ref string, r name.Reference, err error) error {
	var done summarised
	if errors.As(err, &done) {
		return err
	}
	s.log.Info("image pull failed", "image", ref, "err", err)
	if !s.Tenants && errors.Is(err, unpack.ErrHostile) {
		return err // the host's user is told why
	}
	class, msg := classifyPull(r, err)
	if class == nil {
		if !s.Tenants {
			return err
		}
		class, msg = errdefs.ErrUnavailable, fmt.Sprintf("%s could not be reached or answered with something other than an image", r.Context().RegistryStr())
	}
	if class == errdefs.ErrNotFound || class == errdefs.ErrPermissionDenied && !errors.Is(err, errdefs.ErrPermissionDenied) {
		msg += s.suggest(ref, r)
	}
	msg = fmt.Sprintf("--image %s: %s", ref, msg)
	var te *tls.CertificateVerificationError
	if !s.Tenants && errors.As(err, &te) {
		msg += " (" + te.Err.Error() + ")"
	}
	return summarised{errdefs.New(class, msg)}
}

// classifyPull is the class of a failed pull, and what to tell of it; nil
// for an error that is none of a registry's or the network's.
func classifyPull(r name.Reference, err error) (class error, msg string) {
	reg := r.Context().RegistryStr()
	var (
		te  *transport.Error
		dns *net.DNSError
		ne  net.Error
	)
	switch {
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return errdefs.ErrPermissionDenied, fmt.Sprintf("the address of %s is one airlock never dials (loopback, private, link-local or metadata)", reg)
	case errors.Is(err, unpack.ErrHostile):
		return errdefs.ErrInvalidArgument, fmt.Sprintf("%s served an image airlock refuses to unpack", reg)
	case errors.As(err, &te):
		return classifyStatus(r, te)
	case errors.As(err, &dns) && dns.IsNotFound:
		return errdefs.ErrNotFound, fmt.Sprintf("the registry host %s does not exist (DNS: no such host)", dns.Name)
	case errors.As(err, &dns):
		return errdefs.ErrUnavailable, fmt.Sprintf("the registry host %s could not be looked up (DNS failed: no answer, or a resolver error); check the network", dns.Name)
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return errdefs.ErrTimeout, fmt.Sprintf("%s did not answer in time", reg)
	case errors.Is(err, context.Canceled):
		return errdefs.ErrTimeout, fmt.Sprintf("the pull from %s was stopped before it finished", reg)
	case errors.Is(err, syscall.ECONNREFUSED):
		return errdefs.ErrUnavailable, fmt.Sprintf("%s refused the connection (nothing listens there)", reg)
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return errdefs.ErrUnavailable, fmt.Sprintf("%s is unreachable from this host (no route: check the network)", reg)
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.ErrUnavailable, fmt.Sprintf("%s dropped the connection", reg)
	case isTLS(err):
		return errdefs.ErrUnavailable, fmt.Sprintf("the TLS handshake with %s failed (its certificate is not one this host trusts for that name, or it does not speak TLS)", reg)
	}
	return nil, ""
}

// classifyStatus tells what a registry's answer means. Its error code is
// one of a fixed vocabulary, named by us; nothing else of the body is told.
func classifyStatus(r name.Reference, te *transport.Error) (error, string) {
	reg := r.Context().RegistryStr()
	has := func(c transport.ErrorCode) bool {
		for _, d := range te.Errors {
			if d.Code == c {
				return true
			}
		}
		return false
	}
	switch st := te.StatusCode; {
	case st == http.StatusNotFound && has(transport.ManifestUnknownErrorCode):
		sep, what := ":", "tag"
		if _, ok := r.(name.Digest); ok {
			sep, what = "@", "digest"
		}
		return errdefs.ErrNotFound, fmt.Sprintf("%s has no %s%s%s (HTTP 404, manifest unknown: no such %s)", reg, r.Context().RepositoryStr(), sep, r.Identifier(), what)
	case st == http.StatusNotFound && has(transport.NameUnknownErrorCode):
		return errdefs.ErrNotFound, fmt.Sprintf("%s has no repository %s (HTTP 404, name unknown)", reg, r.Context().RepositoryStr())
	case st == http.StatusNotFound:
		return errdefs.ErrNotFound, fmt.Sprintf("%s has no such image (HTTP 404)", reg)
	case st == http.StatusUnauthorized:
		return errdefs.ErrPermissionDenied, fmt.Sprintf("%s refused to serve it without credentials (HTTP 401): the repository does not exist, or is private (airlock pulls anonymously)", reg)
	case st == http.StatusForbidden:
		return errdefs.ErrPermissionDenied, fmt.Sprintf("%s denied access to it (HTTP 403)", reg)
	case st == http.StatusTooManyRequests:
		return errdefs.ErrUnavailable, fmt.Sprintf("%s is limiting this host's pulls (HTTP 429): try again later", reg)
	case st >= 500:
		return errdefs.ErrUnavailable, fmt.Sprintf("%s failed to answer (HTTP %d)", reg, st)
	default:
		return errdefs.ErrUnavailable, fmt.Sprintf("%s answered HTTP %d", reg, st)
	}
}

// isTLS says whether err is a failed TLS handshake.
func isTLS(err error) bool {
	var (
		cv *tls.CertificateVerificationError
		rh tls.RecordHeaderError
		al tls.AlertError
		ua x509.UnknownAuthorityError
		hn x509.HostnameError
		ci x509.CertificateInvalidError
	)
	return errors.As(err, &cv) || errors.As(err, &rh) || errors.As(err, &al) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci)
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
