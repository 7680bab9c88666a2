package container

import (
	"os"
	"testing"
)

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
