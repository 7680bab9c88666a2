package image

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// zeros is n zero bytes, read without holding them.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n)
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// A tenant's docker-archive (in its root) names a config of 64 MiB (it
// could be gigabytes): go-containerregistry reads a config and
// manifest.json whole into memory. The archive is refused from its tar
// headers, before either is read.
func TestArchiveHugeConfigIsRefusedUnread(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	man := []byte(`[{"Config":"c.json","RepoTags":["x:1"],"Layers":[]}]`)
	_ = tw.WriteHeader(&tar.Header{Name: "manifest.json", Mode: 0o644, Size: int64(len(man)), Typeflag: tar.TypeReg})
	_, _ = tw.Write(man)
	const big = 64 << 20
	_ = tw.WriteHeader(&tar.Header{Name: "c.json", Mode: 0o644, Size: big, Typeflag: tar.TypeReg})
	if _, err := io.Copy(tw, &zeros{big}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	at, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer at.Close()
	s := tenantStore(t, nil)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = s.ResolveAt(context.Background(), "docker-archive:/srv/t/a.tar", at, nil)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("an archive with a 64 MiB config: %v, want refused", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Errorf("refusing it allocated %d MiB", n>>20)
	}
}
