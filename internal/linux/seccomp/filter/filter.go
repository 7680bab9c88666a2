// Package filter is airlock's seccomp filter as the kernel takes it, and
// what loads it. The program is the one internal/linux/seccomp compiles
// from its policy tables, compiled ahead of time into program.go
// (TestProgramIsCurrent there fails when the tables compile to anything
// else, and rewrites it with -update), so that neither airlock nor
// airlock-init links Docker's profile, the syscall tables or the compiler,
// or compiles the filter on every start. Only x/sys is imported.
package filter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Program is the filter for this architecture (x86_64 only), encoded
// (Encode) for the trip to a sandbox's init.
func Program() ([]byte, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("seccomp: architecture %s is not supported", runtime.GOARCH)
	}
	return slices.Clone(program), nil
}

// Encode serialises a program as the kernel lays out struct sock_filter.
func Encode(prog []unix.SockFilter) []byte {
	b := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		b = binary.LittleEndian.AppendUint16(b, f.Code)
		b = append(b, f.Jt, f.Jf)
		b = binary.LittleEndian.AppendUint32(b, f.K)
	}
	return b
}

// Decode is Encode's inverse.
func Decode(b []byte) ([]unix.SockFilter, error) {
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > 4096 {
		return nil, fmt.Errorf("seccomp: program of %d bytes is malformed", len(b))
	}
	prog := make([]unix.SockFilter, len(b)/8)
	for i := range prog {
		r := b[8*i:]
		prog[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(r), Jt: r[2], Jf: r[3], K: binary.LittleEndian.Uint32(r[4:])}
	}
	return prog, nil
}

// Supported reports whether this kernel offers seccomp filters.
func Supported() bool {
	_, _, e := unix.Syscall(unix.SYS_PRCTL, unix.PR_GET_SECCOMP, 0, 0)
	return e != unix.EINVAL
}

// Load installs prog on every thread of the calling process (TSYNC). The
// caller has set no_new_privs or holds CAP_SYS_ADMIN in its user namespace.
func Load(prog []unix.SockFilter) error {
	if len(prog) == 0 {
		return errors.New("seccomp: empty program")
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if e != 0 {
		return fmt.Errorf("seccomp(SET_MODE_FILTER, TSYNC): %w", e)
	}
	return nil
}
