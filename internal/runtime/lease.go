package runtime

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// lockFile is an flock-held file that vanishes with its holder: the kernel
// drops the lock when the last descriptor closes, whoever held it.
type lockFile struct {
	f    *os.File
	path string
}

// tryLock creates (or opens) path and takes an exclusive lock without
// blocking. It returns (nil, nil) when another holder has it. A holder that
// released the file unlinks it while still locked, so after locking we
// check that the path still names our inode; otherwise we lost a race with a
// release and the slot is retried.
func tryLock(path string) (*lockFile, error) {
	for attempt := 0; attempt < 8; attempt++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, nil
			}
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		var a, b unix.Stat_t
		if unix.Fstat(int(f.Fd()), &a) == nil && unix.Stat(path, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev {
			return &lockFile{f: f, path: path}, nil
		}
		f.Close()
	}
	return nil, nil
}

// release unlinks the file while holding the lock, then drops the lock.
func (l *lockFile) release() {
	if l == nil {
		return
	}
	_ = os.Remove(l.path)
	l.f.Close()
}

// UIDRange is a sandbox's private host uid/gid range.
type UIDRange struct {
	Base uint32
	Size uint32
	lock *lockFile
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
		l, err := tryLock(filepath.Join(u.dir, strconv.FormatUint(uint64(slot), 10)+".lock"))
		if err != nil {
			return nil, err
		}
		if l != nil {
			return &UIDRange{Base: u.first + slot*u.size, Size: u.size, lock: l}, nil
		}
	}
	return nil, fmt.Errorf("all %d uid ranges are leased", u.slots)
}
