package main

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Host-kernel exploit primitives: the system calls most kernel escapes of
// recent years started from. Each is called with arguments that make a
// working object on a kernel that serves it; the case reports what
// happened and leaves the verdict to the caller (on the container wall
// seccomp must refuse them; on the gVisor wall the Sentry answers, which
// only the host can tell apart from the host kernel answering).

// primitives prints one line per call: "PRIMITIVE name made" or
// "PRIMITIVE name refused ERRNO".
func primitives(_ []string) {
	report := func(name string, fd uintptr, e unix.Errno) {
		if e != 0 {
			fmt.Printf("PRIMITIVE %s refused %s\n", name, unix.ErrnoName(e))
			return
		}
		unix.Close(int(fd))
		fmt.Printf("PRIMITIVE %s made\n", name)
	}
	// A ring of one entry.
	var params [120]byte // struct io_uring_params, zeroed
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
	report("io_uring_setup", fd, e)

	fd, _, e = unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	report("userfaultfd", fd, e)

	// A software counter of this process's own CPU time (allowed to an
	// unprivileged process at any perf_event_paranoid below 3).
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_TASK_CLOCK,
		Bits:   unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, _, e = unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, uintptr(unsafe.Pointer(&attr)), 0, ^uintptr(0), ^uintptr(0), unix.PERF_FLAG_FD_CLOEXEC, 0)
	report("perf_event_open", fd, e)

	// BPF_PROG_LOAD of the smallest socket filter: r0 = 0; exit.
	insns := [2]uint64{
		0xb7, // BPF_ALU64|BPF_MOV|BPF_K, dst r0, imm 0
		0x95, // BPF_JMP|BPF_EXIT
	}
	license := []byte("GPL\x00")
	var progAttr struct {
		progType, insnCnt uint32
		insns, license    uint64
	}
	progAttr.progType = unix.BPF_PROG_TYPE_SOCKET_FILTER
	progAttr.insnCnt = uint32(len(insns))
	progAttr.insns = uint64(uintptr(unsafe.Pointer(&insns[0])))
	progAttr.license = uint64(uintptr(unsafe.Pointer(&license[0])))
	fd, _, e = unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, uintptr(unsafe.Pointer(&progAttr)), unsafe.Sizeof(progAttr))
	report("bpf(BPF_PROG_LOAD)", fd, e)
}
