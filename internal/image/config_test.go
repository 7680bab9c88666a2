package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// A listed registry (say a public one where anyone pushes) serves an image
// whose manifest declares a config blob of 8 GiB: the daemon used to read
// it whole into memory (go-containerregistry's io.ReadAll, bounded only by
// the declared size), an out-of-memory end of the daemon for every tenant.
// The declared size is refused before the blob is fetched.
func TestRegistryHugeConfigIsRefusedUnread(t *testing.T) {
	var served atomic.Int64
	const stopAt = 256 << 20 // the fake stops here, whatever the client does
	digest := "sha256:" + strings.Repeat("a", 64)
	manifest := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",`+
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":%d,"digest":%q},"layers":[]}`, int64(8<<30), digest)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/":
			w.WriteHeader(http.StatusOK)
		case strings.HasSuffix(r.URL.Path, "/manifests/latest"):
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.Header().Set("Content-Length", fmt.Sprint(len(manifest)))
			if r.Method != http.MethodHead {
				fmt.Fprint(w, manifest)
			}
		case strings.Contains(r.URL.Path, "/blobs/"):
			w.WriteHeader(http.StatusOK)
			buf := make([]byte, 1<<20)
			for served.Load() < stopAt {
				n, err := w.Write(buf)
				served.Add(int64(n))
				if err != nil {
					return
				}
			}
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	s := tenantStore(t, (&net.Dialer{}).DialContext, host)
	_, err := s.Resolve(context.Background(), host+"/x:latest", nil)
	if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a config declaring 8 GiB: %v, want refused as invalid", err)
	}
	if n := served.Load(); n > MaxConfigBytes+(1<<20) {
		t.Errorf("the daemon read %d bytes of a config declaring 8 GiB (cap %d)", n, MaxConfigBytes)
	}
}
