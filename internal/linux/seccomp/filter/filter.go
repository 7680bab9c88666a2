// Package filter carries a compiled seccomp program from the host to the
// sandbox and installs it there: its encoding (the kernel's struct
// sock_filter), its decoding and its load. It is what init needs of
// seccomp, and no more: the policy and its compiler (internal/linux/seccomp,
// with go-seccomp-bpf's syscall tables, ~160 KiB of live heap) stay on the
// host, out of the binary every sandbox runs.
package filter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Encode serialises a program as the kernel lays out struct sock_filter,
// for the trip to the sandbox's init.
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
