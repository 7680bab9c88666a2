package uidlease

import (
	"os"
	"testing"
)

func TestLeaseLocksExclude(t *testing.T) {
	dir := t.TempDir()
	u := &Pool{Dir: dir, First: First, Size: Size, Slots: 3}
	var got []*Range
	seen := map[uint32]bool{}
	for i := 0; i < 3; i++ {
		r, err := u.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Base] {
			t.Fatalf("range %d leased twice", r.Base)
		}
		seen[r.Base] = true
		got = append(got, r)
	}
	if _, err := u.Acquire(); err == nil {
		t.Fatal("a fourth lease out of three slots")
	}
	got[1].Lock.Release()
	r, err := u.Acquire()
	if err != nil || r.Base != got[1].Base {
		t.Fatalf("released range not reused: %v %v", r, err)
	}
	for _, g := range append(got, r) {
		g.Lock.Release()
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("lease files left: %v", ents)
	}
}
