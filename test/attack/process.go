package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Attacks on processes and privileges: other processes, init, setuid,
// namespaces, system calls, the memory and pids caps.

// hostProcs: no host process is visible; ARGS are host pids that must
// not be signalled.
func hostProcs(args []string) {
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, e.Name())
		}
	}
	if len(pids) > 6 {
		vulnerable("sees %d processes: %v", len(pids), pids)
	} else {
		blocked("sees only %v", pids)
	}
	for _, a := range args { // host pids
		pid, _ := strconv.Atoi(a)
		expectErr("kill host pid "+a, unix.Kill(pid, 0))
	}
}

// ptrace: init cannot be traced, nor its environment, binary or
// descriptors read.
func ptrace(_ []string) {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0, 0, 0, 0)
	expectErr("ptrace attach pid 1", errnoErr(e))
	_, _, e = unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0, 0, 0, 0)
	expectErr("ptrace traceme", errnoErr(e))
	_, err := os.ReadFile("/proc/1/environ")
	expectErr("read /proc/1/environ", err)
	_, err = os.Readlink("/proc/1/exe")
	expectErr("readlink /proc/1/exe", err)
	// Even where the fd numbers can be listed (root inside), none of
	// init's descriptors (its sync socket, its leases) may be opened.
	for fd := 0; fd < 16; fd++ {
		p := "/proc/1/fd/" + strconv.Itoa(fd)
		f, err := os.Open(p)
		if f != nil {
			f.Close()
		}
		if err == nil {
			vulnerable("opened %s", p)
		}
	}
	blocked("init's descriptors cannot be opened")
}

// setuid: a setuid-root copy of this program must not raise privileges.
func setuid(_ []string) {
	self, _ := os.ReadFile("/proc/self/exe")
	if err := os.WriteFile("/tmp/suid", self, 0o755); err != nil {
		vulnerable("setup: %v", err)
		return
	}
	_ = os.Chown("/tmp/suid", 0, 0)
	_ = os.Chmod("/tmp/suid", 0o4755|os.ModeSetuid)
	out, err := exec.Command("/tmp/suid", "whoami").CombinedOutput()
	got := strings.TrimSpace(string(out))
	if err == nil && got == "0" {
		vulnerable("setuid binary ran with euid 0")
	} else {
		blocked("setuid binary ran with euid %s (%v)", got, err)
	}
	for _, p := range []string{"/usr/bin/su", "/usr/bin/passwd", "/usr/bin/newgrp"} {
		if _, err := os.Stat(p); err == nil {
			out, _ := exec.Command(p, "--help").CombinedOutput()
			_ = out
		}
	}
}

// whoami prints the effective uid.
func whoami(_ []string) {
	fmt.Println(os.Geteuid())
}

// userns: no new namespace can be made or entered; clone3 is ENOSYS.
func userns(_ []string) {
	expectErr("unshare(CLONE_NEWUSER)", unix.Unshare(unix.CLONE_NEWUSER))
	expectErr("unshare(CLONE_NEWNS)", unix.Unshare(unix.CLONE_NEWNS))
	pid, _, e := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	if e == 0 && pid == 0 {
		// The child, where the clone worked: it leaves at once (a copy
		// of this process would report everything twice).
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	expectErr("clone(CLONE_NEWUSER)", errnoErr(e))
	_, _, e = unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	if e != unix.ENOSYS {
		vulnerable("clone3 answered %v, want ENOSYS", e)
	} else {
		blocked("clone3: ENOSYS")
	}
	expectErr("setns", unix.Setns(0, 0))
}

// keyctl: the kernel interfaces seccomp refuses stay refused.
func keyctl(_ []string) {
	_, _, e := unix.Syscall6(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd), 0, 0, 0, 0)
	expectErr("keyctl", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_ADD_KEY, 0, 0, 0)
	expectErr("add_key", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_BPF, 0, 0, 0)
	expectErr("bpf", errnoErr(e))
	_, _, e = unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0, 0, 0, 0)
	expectErr("perf_event_open", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
	expectErr("userfaultfd", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
	expectErr("io_uring_setup", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_FINIT_MODULE, 0, 0, 0)
	expectErr("finit_module", errnoErr(e))
}

// tiocsti: nothing can be pushed into the terminal's input.
func tiocsti(_ []string) {
	c := byte('x')
	_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	expectErr("ioctl(TIOCSTI)", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_IOCTL, 0, 0xdead00000000|unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	expectErr("ioctl(TIOCSTI with high bits)", errnoErr(e))
	if _, err := unix.IoctlGetTermios(0, unix.TCGETS); err != nil {
		vulnerable("stdin is not the sandbox's terminal: %v", err)
	}
}

// i386Syscall: getpid through the i386 ABI. The container wall's filter
// kills the process; a kernel without the i386 ABI (gVisor's Sentry)
// answers ENOSYS; a pid back means the call was served.
func i386Syscall(_ []string) {
	r := int80()
	if r == -int64(unix.ENOSYS) {
		blocked("i386 syscall answered ENOSYS")
		return
	}
	vulnerable("i386 syscall returned %d (this process is pid %d)", r, os.Getpid())
}

// caps prints the capability, no_new_privs and seccomp lines of
// /proc/self/status.
func caps(_ []string) {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Cap") || strings.HasPrefix(l, "NoNewPrivs") || strings.HasPrefix(l, "Seccomp:") {
			fmt.Println(l)
		}
	}
}

// membomb allocates until the memory limit stops it.
func membomb(_ []string) {
	var hold [][]byte
	for {
		b := make([]byte, 64<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		hold = append(hold, b)
	}
}

// forkbomb starts processes until the pids limit stops it.
func forkbomb(_ []string) {
	var n int
	for i := 0; i < 5000; i++ {
		cmd := exec.Command("/workspace/attack", "sleep")
		if err := cmd.Start(); err != nil {
			break
		}
		n++
	}
	fmt.Printf("started %d children\n", n)
	if n >= 5000 {
		vulnerable("no pids limit")
	} else {
		blocked("pids limit stopped the fork bomb after %d", n)
	}
}

// sleep sleeps an hour (forkbomb's children).
func sleep(_ []string) {
	time.Sleep(time.Hour)
}
