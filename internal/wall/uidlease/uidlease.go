// Package uidlease hands out private host uid/gid ranges, one per live
// sandbox of either wall: a range is leased by an flock on its slot's file
// in a state directory's uids directory, so that it is free again the
// moment its holder (airlock, a sandbox's init, or runsc run) is gone, and
// two sandboxes, on the same wall or not, never share a host id. It
// imports internal/linux/lockfile only.
package uidlease

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
)

// The ranges of a state directory: Slots ranges of Size ids from First.
const (
	Dir   = "uids"  // under the state directory
	First = 1 << 30 // far above /etc/subuid's usual ranges
	Size  = 65536
	Slots = 16384
)

// Range is a sandbox's private host uid/gid range, leased while Lock is
// held.
type Range struct {
	Base uint32
	Size uint32
	Lock *lockfile.Lock
}

// Pool hands out non-overlapping ranges of host ids, one per live
// sandbox, leased with flock under Dir so they vanish with the holder.
type Pool struct {
	Dir   string
	First uint32
	Size  uint32
	Slots uint32
}

// Of is the pool of state directory stateDir, which both walls lease from.
func Of(stateDir string) *Pool {
	return &Pool{Dir: filepath.Join(stateDir, Dir), First: First, Size: Size, Slots: Slots}
}

// Acquire leases a free range, starting the search at a random slot.
func (u *Pool) Acquire() (*Range, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	start := binary.LittleEndian.Uint32(b[:]) % u.Slots
	for i := uint32(0); i < u.Slots; i++ {
		slot := (start + i) % u.Slots
		l, err := lockfile.TryLock(filepath.Join(u.Dir, strconv.FormatUint(uint64(slot), 10)+".lock"))
		if err != nil {
			return nil, err
		}
		if l != nil {
			return &Range{Base: u.First + slot*u.Size, Size: u.Size, Lock: l}, nil
		}
	}
	return nil, fmt.Errorf("all %d uid ranges are leased", u.Slots)
}

// Reap removes the files of ranges nobody holds (their holders died
// without unlinking them).
func (u *Pool) Reap() { lockfile.Reap(u.Dir) }
