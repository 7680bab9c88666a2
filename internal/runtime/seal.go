package runtime

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// sealedExe is an in-memory, sealed copy of the running airlock binary. The
// sandbox's init is executed from it, so /proc/1/exe inside a sandbox names
// a file nothing can write: not the host's airlock (CVE-2019-5736 class).
// One copy serves every sandbox this process creates.
type sealedExe struct {
	once sync.Once
	f    *os.File
	err  error
}

func (s *sealedExe) get() (*os.File, error) {
	s.once.Do(func() { s.f, s.err = seal() })
	return s.f, s.err
}

// minExeFD is far above the descriptors any child is given.
const minExeFD = 100

func seal() (*os.File, error) {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("open /proc/self/exe: %w", err)
	}
	defer src.Close()
	mfd, err := unix.MemfdCreate("airlock", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	// The child execs /proc/self/fd/N after os/exec has dup2'ed ExtraFiles
	// onto fds 3, 4, ...; N must lie above them or the child would exec
	// whatever landed on it.
	fd, err := unix.FcntlInt(uintptr(mfd), unix.F_DUPFD_CLOEXEC, minExeFD)
	unix.Close(mfd)
	if err != nil {
		return nil, fmt.Errorf("fcntl(F_DUPFD_CLOEXEC): %w", err)
	}
	f := os.NewFile(uintptr(fd), "airlock-sealed")
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("copy binary to memfd: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("fcntl(F_ADD_SEALS): %w", err)
	}
	return f, nil
}
