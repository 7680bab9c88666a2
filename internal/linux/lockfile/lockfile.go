// Package lockfile is an flock-held file that vanishes with its holder:
// the kernel drops the lock when the last descriptor closes, whoever held
// it. Leases (uid ranges, subnets) and liveness marks are built on it. Only
// x/sys is imported.
package lockfile

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Lock is a held lock file.
type Lock struct {
	File *os.File
	path string
}

// TryLock creates (or opens) path and takes an exclusive lock without
// blocking. It returns (nil, nil) when another holder has it. A holder that
// releases the file unlinks it while still locked, so after locking we
// check that the path still names our inode; otherwise we lost a race with
// a release and try again.
func TryLock(path string) (*Lock, error) {
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
			return &Lock{File: f, path: path}, nil
		}
		f.Close()
	}
	return nil, nil
}

// Release unlinks the file while holding the lock, then drops the lock.
func (l *Lock) Release() {
	if l == nil {
		return
	}
	_ = os.Remove(l.path)
	l.File.Close()
}

// Reap removes the lock files in dir that nobody holds.
func Reap(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if l, err := TryLock(dir + "/" + e.Name()); err == nil && l != nil {
			l.Release()
		}
	}
}
