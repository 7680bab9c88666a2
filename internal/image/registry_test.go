package image

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

const remoteBody = "REMOTE-BODY-7f3a"

// fakeRegistry is a loopback HTTP server that counts calls and answers every
// one with status and a body that must never reach a tenant.
func fakeRegistry(t *testing.T, status int) (host string, calls *atomic.Int64) {
	calls = &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"errors":[{"code":"DENIED","message":%q}]}`, remoteBody)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), calls
}

func tenantStore(t *testing.T, dial func(context.Context, string, string) (net.Conn, error), registries ...string) *Store {
	s, err := NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.Tenants, s.Registries, s.Dial = true, registries, dial
	return s
}

// A tenant pulls only from a listed registry: anything else is refused
// before a connection is made.
func TestTenantPullsOnlyFromListedRegistries(t *testing.T) {
	host, calls := fakeRegistry(t, http.StatusOK)
	dial := (&net.Dialer{}).DialContext
	for _, listed := range [][]string{nil, {"docker.io"}, {"127.0.0.2:5000"}} {
		_, err := tenantStore(t, dial, listed...).Resolve(context.Background(), host+"/x:latest", nil)
		if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "--registry") {
			t.Errorf("listed %v: %v, want permission denied naming --registry", listed, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the unlisted registry was called %d times", n)
	}
}

// What a registry answers is summarised, never repeated: not its body,
// and a dial the guard refuses says so without a call.
func TestRegistryAnswersAreSummarised(t *testing.T) {
	host, calls := fakeRegistry(t, http.StatusNotFound)
	_, err := tenantStore(t, (&net.Dialer{}).DialContext, host).Resolve(context.Background(), host+"/x:latest", nil)
	if err == nil || strings.Contains(err.Error(), remoteBody) || strings.Contains(err.Error(), "DENIED") || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("a 404 with a body: %v", err)
	}
	if calls.Load() == 0 {
		t.Fatal("the listed registry was not called")
	}
	before := calls.Load()
	refuse := func(context.Context, string, string) (net.Conn, error) {
		return nil, fmt.Errorf("%w: 127.0.0.1 is loopback", errdefs.ErrPermissionDenied)
	}
	_, err = tenantStore(t, refuse, host).Resolve(context.Background(), host+"/x:latest", nil)
	if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "never dials") {
		t.Errorf("a refused dial: %v", err)
	}
	if calls.Load() != before {
		t.Error("a refused dial reached the registry")
	}
}

// A tenant's oci: layout is read through contained opens: a link in it
// to a host file is refused, and the answer is the same as for a missing
// layout or one that is not a layout at all.
func TestTenantLayoutLinksAreRefusedAlike(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte(`{"schemaVersion":2,"manifests":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	layouts := map[string]func(dir string) error{
		"index.json links out": func(dir string) error {
			if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
				return err
			}
			return os.Symlink(secret, filepath.Join(dir, "index.json"))
		},
		"empty": func(string) error { return nil },
		"not a layout": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "index.json"), []byte("garbage"), 0o644)
		},
		"blob links out": func(dir string) error {
			for name, body := range map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": `{"schemaVersion":2,"manifests":[]}`} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
					return err
				}
			}
			if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o755); err != nil {
				return err
			}
			return os.Symlink(secret, filepath.Join(dir, "blobs", "sha256", strings.Repeat("a", 64)))
		},
	}
	msgs := map[string]bool{}
	for name, make := range layouts {
		dir := t.TempDir()
		if err := make(dir); err != nil {
			t.Fatal(err)
		}
		at, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		s := tenantStore(t, nil)
		_, err = s.ResolveAt(context.Background(), "oci:/srv/t/img", at, nil)
		at.Close()
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("%s: %v, want permission denied", name, err)
			continue
		}
		msgs[err.Error()] = true
		if left, _ := filepath.Glob(filepath.Join(s.dir, ".layout-*")); len(left) > 0 {
			t.Errorf("%s: the copy was left behind: %v", name, left)
		}
	}
	if len(msgs) != 1 {
		t.Errorf("the refusals differ: %v", msgs)
	}
}

// A serving daemon never reads a tenant's image path by its name: only
// through what was opened beneath the tenant's root.
func TestTenantImagePathNeedsItsDescriptor(t *testing.T) {
	s := tenantStore(t, nil)
	for _, name := range []string{"/srv/t/rootfs", "oci:/srv/t/layout", "docker-archive:/srv/t/a.tar"} {
		if _, err := s.Resolve(context.Background(), name, nil); !errors.Is(err, errdefs.ErrInternal) {
			t.Errorf("%s by name: %v", name, err)
		}
	}
}

// A listed registry, reached by a dial the guard allows, serves tenants.
func TestListedRegistryServesTenants(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/acme/tool:1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	s := tenantStore(t, (&net.Dialer{}).DialContext, host)
	l, err := s.Resolve(context.Background(), ref.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Done()
	if want, _ := img.ConfigName(); l.Digest != want.String() {
		t.Errorf("digest %s, want %s", l.Digest, want)
	}
}
