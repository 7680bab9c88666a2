package sealedexe

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Regression: the child execs /proc/self/fd/N after os/exec has dup2'ed its
// ExtraFiles onto 3, 4, ...; a low N was overwritten and the child exec'd a
// lease file ("permission denied", now and then).
func TestSealedExeAboveChildDescriptors(t *testing.T) {
	f, err := New("", self).Get() // no directory: a sealed memfd
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Fd() < MinFD {
		t.Fatalf("sealed binary on fd %d, want >= %d", f.Fd(), MinFD)
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if seals&want != want {
		t.Fatalf("seals %#x, want %#x", seals, want)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("wrote to the sealed binary")
	}
	self, _ := os.Stat("/proc/self/exe")
	if fi, _ := f.Stat(); fi.Size() != self.Size() {
		t.Fatalf("sealed copy is %d bytes, binary %d", fi.Size(), self.Size())
	}
}

// The cached copy is made once, cannot be written even by root without
// first clearing its immutable flag, and is reused by the next start.
func TestCachedExeImmutableAndReused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root-owned immutable files need root")
	}
	dir := filepath.Join(t.TempDir(), "exe")
	e := New(dir, self)
	f, err := e.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Skipf("this filesystem cannot make files immutable (%v): memfd fallback", ents)
	}
	p := filepath.Join(dir, ents[0].Name())
	t.Cleanup(func() { reapAll(p) })
	if w, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
		w.Close()
		t.Fatal("opened the cached binary for writing")
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("wrote to the cached binary")
	}
	if f.Fd() < MinFD {
		t.Fatalf("on fd %d", f.Fd())
	}
	g, err := New(dir, self).Get()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var s1, s2 unix.Stat_t
	_ = unix.Fstat(int(f.Fd()), &s1)
	_ = unix.Fstat(int(g.Fd()), &s2)
	if s1.Ino != s2.Ino {
		t.Error("the second start copied the binary again")
	}
	// Regression guard: a file that is not an immutable copy is not used.
	other := filepath.Join(dir, "airlock-0000000000000000")
	_ = os.WriteFile(other, []byte("evil"), 0o555)
	if _, err := openImmutable(other, 4); err == nil {
		t.Error("a writable-flag file was taken for the copy")
	}
	// Regression: a copy whose maker was killed mid-way was left forever.
	stale, fresh := filepath.Join(dir, ".new-killed"), filepath.Join(dir, ".new-inprogress")
	_ = os.WriteFile(stale, []byte("part"), 0o600)
	_ = os.WriteFile(fresh, []byte("part"), 0o600)
	old := time.Now().Add(-2 * staleCopy)
	_ = os.Chtimes(stale, old, old)
	e.Reap()
	if _, err := os.Stat(p); err != nil {
		t.Error("gc removed the copy in use")
	}
	if _, err := os.Stat(other); err == nil {
		t.Error("gc left another binary's copy")
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("gc left a killed process's partial copy")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Error("gc removed a copy being made")
	}
	_ = os.Remove(fresh)
}

// self opens the test binary, the copies' source here.
func self() (*os.File, error) { return os.Open("/proc/self/exe") }

func reapAll(p string) {
	if f, err := os.Open(p); err == nil {
		_ = setImmutable(f, false)
		f.Close()
	}
	_ = os.Remove(p)
}
