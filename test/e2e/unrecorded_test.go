package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A one-shot run whose start its audit log cannot take never starts its
// command, on either wall (the gVisor wall builds the bundle while the
// record is written, and starts runsc only once it is).
func TestRunUnrecordedNeverStarts(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		dir := t.TempDir()
		if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=64k,mode=700"); err != nil {
			t.Skipf("cannot mount a small tmpfs for the log here: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
		// Full: the log's file can be made, not written.
		filler, err := os.Create(filepath.Join(dir, "filler"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = filler.Write(make([]byte, 128<<10))
		filler.Close()
		r := w.run(t, "--audit", filepath.Join(dir, "run.audit"), "--", "sh", "-c", "echo RAN")
		if r.code != 125 || strings.Contains(r.stdout, "RAN") || !strings.Contains(r.stderr, "the audit log") {
			t.Fatalf("a run its log cannot record: %s", r)
		}
	})
}
