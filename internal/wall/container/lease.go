package container

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
)

// UIDRange is a sandbox's private host uid/gid range.
type UIDRange struct {
	Base uint32
	Size uint32
	lock *lockfile.Lock
}

// uidLeases hands out non-overlapping ranges of host ids, one per live
// sandbox, leased with flock under dir so they vanish with the holder.
type uidLeases struct {
	dir   string
	first uint32
	size  uint32
	slots uint32
}

func (u *uidLeases) acquire() (*UIDRange, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	start := binary.LittleEndian.Uint32(b[:]) % u.slots
	for i := uint32(0); i < u.slots; i++ {
		slot := (start + i) % u.slots
		l, err := lockfile.TryLock(filepath.Join(u.dir, strconv.FormatUint(uint64(slot), 10)+".lock"))
		if err != nil {
			return nil, err
		}
		if l != nil {
			return &UIDRange{Base: u.first + slot*u.size, Size: u.size, lock: l}, nil
		}
	}
	return nil, fmt.Errorf("all %d uid ranges are leased", u.slots)
}
