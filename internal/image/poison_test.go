package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// One tenant's oci: layout claims a public image's config (its real bytes,
// so its digest is right) with layers of its own. The cache is keyed by
// config digest: had the layers been taken unchecked, another tenant
// pulling the public image from a listed registry would run the first
// tenant's files. A layer must be the one the config names (diff_ids).
func TestLayoutCannotPoisonTheCacheForARegistryImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unpacking with image ownership needs root (chown)")
	}
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/library/python:3")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}

	// The layout: the genuine config, a layer of the attacker's.
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	_ = tw.WriteHeader(&tar.Header{Name: "pwned", Typeflag: tar.TypeReg, Mode: 0o755, Size: 5})
	_, _ = tw.Write([]byte("evil\n"))
	_ = tw.Close()
	dir := t.TempDir()
	put := func(b []byte) (string, int) {
		sum := sha256.Sum256(b)
		h := hex.EncodeToString(sum[:])
		p := filepath.Join(dir, "blobs", "sha256", h)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return "sha256:" + h, len(b)
	}
	cd, cn := put(cfg)
	ld, ln := put(evil.Bytes())
	man := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":%q,"size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":%q,"size":%d}]}`, cd, cn, ld, ln))
	md, mn := put(man)
	idx := fmt.Sprintf(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":%q,"size":%d}]}`, md, mn)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), []byte(idx), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}

	s := tenantStore(t, (&net.Dialer{}).DialContext, host)
	at, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer at.Close()
	if l, err := s.ResolveAt(context.Background(), "oci:/srv/mallory/py", at, nil); err == nil {
		l.Done()
		t.Error("a layout whose layer is not the one its config names was unpacked")
	}
	l, err := s.Resolve(context.Background(), ref.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Done()
	if _, err := os.Stat(filepath.Join(l.Trees[0].HostPath, "pwned")); err == nil {
		t.Fatal("another tenant's pull of the registry image runs the layout's files")
	}
}
