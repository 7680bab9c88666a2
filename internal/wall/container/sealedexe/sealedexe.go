// Package sealedexe keeps the copy of airlock-init (cmd/airlock-init) that
// a sandbox's init is executed from: a file nothing can write, so that
// /proc/1/exe inside a sandbox never names the host's binary (the
// CVE-2019-5736 class). It is the container wall's
// (internal/wall/container). It imports x/sys only.
package sealedexe

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Exe is a copy of airlock-init that nothing can write. The copy is a
// root-only, read-only, immutable file under the state directory (a
// tmpfs), made once per airlock-init binary and reused by every later
// start: copying the binary on every `airlock run` was that command's
// largest single cost. On a filesystem without the immutable attribute
// the copy falls back to a sealed memfd, made per process.
type Exe struct {
	dir  string // stateDir/exe
	src  func() (*os.File, error)
	once sync.Once
	name string // the cached copy's, once made
	f    *os.File
	err  error
}

// New is the copy kept under dir ("": a sealed memfd only) of the binary
// src opens (a descriptor it keeps: the copy reads it with ReadAt and
// never closes it); nothing is opened before the first Get.
func New(dir string, src func() (*os.File, error)) *Exe { return &Exe{dir: dir, src: src} }

// Get opens (making it first if needed) the copy, once per Exe, on a
// descriptor of at least MinFD.
func (s *Exe) Get() (*os.File, error) {
	s.once.Do(func() {
		src, err := s.src()
		if err != nil {
			s.err = err
			return
		}
		s.f, s.name, s.err = seal(s.dir, src)
	})
	return s.f, s.err
}

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h (chattr +i).
const fsImmutableFL = 0x10

// MinFD is far above the descriptors any child is given: the copy's
// descriptor is at least this.
const MinFD = 100

func seal(dir string, src *os.File) (_ *os.File, name string, err error) {
	var f *os.File
	if dir != "" {
		f, name, err = cachedCopy(src, dir)
	}
	if f == nil {
		if f, err = memfdCopy(src); err != nil {
			return nil, "", err
		}
	}
	// The child execs /proc/self/fd/N after os/exec has dup2'ed ExtraFiles
	// onto fds 3, 4, ...; N must lie above them or the child would exec
	// whatever landed on it.
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, MinFD)
	f.Close()
	if err != nil {
		return nil, "", fmt.Errorf("fcntl(F_DUPFD_CLOEXEC): %w", err)
	}
	return os.NewFile(uintptr(fd), "airlock-init-sealed"), name, nil
}

// copyPrefix begins a cached copy's name. Copies of the whole airlock
// binary, from before airlock-init, began "airlock-": Reap takes those too.
const copyPrefix = "airlock-init-"

// identity names a binary by what changes when it is replaced.
func identity(src *os.File) (string, int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return "", 0, err
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%d:%d:%d:%d.%d:%d.%d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec))
	return copyPrefix + hex.EncodeToString(h[:8]), st.Size, nil
}

// cachedCopy opens (making it first if needed) the immutable copy of src
// under dir, and names it. It returns nil where the filesystem cannot make
// a file immutable.
func cachedCopy(src *os.File, dir string) (*os.File, string, error) {
	name, size, err := identity(src)
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	p := filepath.Join(dir, name)
	if f, err := openImmutable(p, size); err == nil {
		return f, name, nil
	}
	tmp, err := os.CreateTemp(dir, ".new-")
	if err != nil {
		return nil, "", err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := io.Copy(tmp, io.NewSectionReader(src, 0, size)); err != nil {
		return nil, "", fmt.Errorf("copy binary: %w", err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		return nil, "", err
	}
	// Rename first (an immutable file cannot be renamed), then seal the
	// inode through the descriptor. Another airlock's finished copy makes
	// the rename fail (EPERM): that copy is used.
	if err := os.Rename(tmp.Name(), p); err == nil {
		if err := setImmutable(tmp, true); err != nil {
			_ = os.Remove(p)
			return nil, "", nil // no immutable files here: use a memfd
		}
	} else if !errors.Is(err, os.ErrPermission) {
		return nil, "", err
	}
	f, err := openImmutable(p, size)
	return f, name, err
}

// openImmutable opens p if it is a root-owned, read-only, immutable
// regular file of the given size, and nothing else.
func openImmutable(p string, size int64) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	flags, ferr := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 ||
		st.Mode&0o222 != 0 || st.Size != size || ferr != nil || flags&fsImmutableFL == 0 {
		f.Close()
		return nil, fmt.Errorf("%s is not an immutable copy of the binary", p)
	}
	return f, nil
}

// memfdCopy copies src into a sealed memfd.
func memfdCopy(src *os.File) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return nil, err
	}
	mfd, err := unix.MemfdCreate("airlock-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(mfd), "airlock-init-memfd")
	if _, err := io.Copy(f, io.NewSectionReader(src, 0, st.Size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("copy binary to memfd: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("fcntl(F_ADD_SEALS): %w", err)
	}
	return f, nil
}

// staleCopy is when a temporary copy of the binary is taken for the
// remains of a killed process.
const staleCopy = 10 * time.Minute

// Reap removes from the directory the copies of other binaries (a host
// that upgraded airlock) than the one Get made (all of them when it made
// none). A running airlock that uses one holds it open.
func (s *Exe) Reap() {
	if s.dir == "" {
		return
	}
	_, _ = s.Get()
	dir, cur := s.dir, s.name
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		// A copy whose maker was killed mid-way stays as a temporary
		// file; one being made now is seconds old.
		if strings.HasPrefix(e.Name(), ".new-") {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleCopy {
				_ = os.Remove(filepath.Join(dir, e.Name()))
			}
			continue
		}
		if e.Name() == cur || !strings.HasPrefix(e.Name(), "airlock-") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if f, err := os.Open(p); err == nil {
			_ = setImmutable(f, false)
			f.Close()
		}
		_ = os.Remove(p)
	}
}

// setImmutable sets or clears the immutable attribute, keeping the file's
// other attributes (ext4 refuses to drop its extents flag).
func setImmutable(f *os.File, on bool) error {
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags)
}
