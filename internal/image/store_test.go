package image

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

func ociLayout(t *testing.T, img v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(p, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return "oci:" + p
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unpacking with image ownership needs root")
	}
	s, err := NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for i := 0; i < 3; i++ {
		img, err := random.Image(300<<10, 1)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ociLayout(t, img))
	}
	s.MaxBytes = 700 << 10 // room for two
	ctx := context.Background()

	a, err := s.Resolve(ctx, refs[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	// a is in use: a third image must not evict it.
	for _, r := range refs[1:] {
		l, err := s.Resolve(ctx, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.Done()
	}
	list, _ := s.List()
	if !has(list, a.Digest) {
		t.Fatal("evicted an image in use")
	}
	if len(list) != 2 {
		t.Fatalf("%d images cached, want 2 (cap for two)", len(list))
	}
	a.Done()
	if _, err := s.Remove(refs[0]); err != nil {
		t.Fatalf("remove after use: %v", err)
	}
	if _, err := s.Remove(refs[0]); err == nil {
		t.Fatal("removed twice")
	}
}

func has(list []Meta, digest string) bool {
	for _, m := range list {
		if "sha256:"+m.ID == digest {
			return true
		}
	}
	return false
}

func TestRemoveRefusesImageInUse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unpacking with image ownership needs root")
	}
	s, _ := NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	img, _ := random.Image(1024, 1)
	ref := ociLayout(t, img)
	l, err := s.Resolve(context.Background(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ref); err == nil {
		t.Fatal("removed an image in use")
	}
	l.Done()
	if _, err := s.Remove(ref); err != nil {
		t.Fatal(err)
	}
}
