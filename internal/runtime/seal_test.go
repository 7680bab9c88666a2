package runtime

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Regression: the child execs /proc/self/fd/N after os/exec has dup2'ed its
// ExtraFiles onto 3, 4, ...; a low N was overwritten and the child exec'd a
// lease file ("permission denied", now and then).
func TestSealedExeAboveChildDescriptors(t *testing.T) {
	var s sealedExe
	f, err := s.get()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Fd() < minExeFD {
		t.Fatalf("sealed binary on fd %d, want >= %d", f.Fd(), minExeFD)
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

func TestLeaseLocksExclude(t *testing.T) {
	dir := t.TempDir()
	u := &uidLeases{dir: dir, first: firstUID, size: uidsPerSlot, slots: 3}
	var got []*UIDRange
	seen := map[uint32]bool{}
	for i := 0; i < 3; i++ {
		r, err := u.acquire()
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Base] {
			t.Fatalf("range %d leased twice", r.Base)
		}
		seen[r.Base] = true
		got = append(got, r)
	}
	if _, err := u.acquire(); err == nil {
		t.Fatal("a fourth lease out of three slots")
	}
	got[1].lock.Release()
	r, err := u.acquire()
	if err != nil || r.Base != got[1].Base {
		t.Fatalf("released range not reused: %v %v", r, err)
	}
	for _, g := range append(got, r) {
		g.lock.Release()
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("lease files left: %v", ents)
	}
}
