package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestProbeTar(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "ok"), []byte("ok"), 0o644)
	os.WriteFile(filepath.Join(dir, "bad\xff\xfename"), []byte("x"), 0o644)
	os.Symlink("tar\xffget", filepath.Join(dir, "lnk"))
	os.WriteFile(filepath.Join(dir, "future"), []byte("x"), 0o644)
	ts := []unix.Timespec{{Sec: 1 << 40}, {Sec: 1 << 40}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "future"), ts, 0); err != nil {
		t.Log("utimes", err)
	}
	os.WriteFile(filepath.Join(dir, "past"), []byte("x"), 0o644)
	ts = []unix.Timespec{{Sec: -(1 << 40)}, {Sec: -(1 << 40)}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "past"), ts, 0); err != nil {
		t.Log("utimes", err)
	}
	unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644)
	root, _ := os.Open(dir)
	defer root.Close()
	var buf bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := Tar(ctx, root, "", 1<<20, func(s []string) io.Writer { t.Log("skipped", s); return &buf })
	t.Log("err", err)
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Log("next", err)
			break
		}
		t.Logf("%q %q %v", h.Name, h.Linkname, h.ModTime)
	}
}
