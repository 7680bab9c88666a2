// Package seccomp builds and loads airlock's syscall filter. The policy is
// data: Docker's default profile (moby/profiles/seccomp) resolved for the
// capabilities a sandbox may hold, plus the Denied table below, plus a
// prologue that kills any syscall made through another architecture's ABI
// (i386, x32) and refuses the TIOCSTI/TIOCLINUX ioctls. It is compiled to
// classic BPF on the host and loaded inside the sandbox by nsinit.
package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	bpfpolicy "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	moby "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Denied lists syscalls refused with EPERM whatever Docker's profile says,
// each with the reason. Checked before the profile.
var Denied = []struct {
	Names  []string
	Reason string
}{
	{[]string{"unshare", "setns"}, "no new namespaces (user namespaces above all) from inside"},
	{[]string{"mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr"}, "the mount table is fixed at creation"},
	{[]string{"keyctl", "add_key", "request_key"}, "the kernel keyring is not namespaced"},
	{[]string{"bpf"}, "eBPF is a kernel attack surface"},
	{[]string{"perf_event_open"}, "perf events leak host information"},
	{[]string{"userfaultfd"}, "a staple of kernel race exploits"},
	{[]string{"io_uring_setup", "io_uring_enter", "io_uring_register"}, "io_uring bypasses seccomp for the operations it performs"},
	{[]string{"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load"}, "no kernel modules or kernels"},
	{[]string{"ptrace", "process_vm_readv", "process_vm_writev"}, "no debugging of other processes"},
}

// ENOSYS lists syscalls that answer ENOSYS so libc falls back to an older
// call whose arguments the filter can inspect (clone3's flags live in
// memory, clone's in a register).
var ENOSYS = []string{"clone3"}

// Caps the profile is resolved for: the capabilities `--user root` keeps.
var ProfileCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE",
}

// defaultAction answers every syscall the profile does not list.
const defaultAction = bpfpolicy.ActionErrno | bpfpolicy.Action(unix.EPERM)

const (
	tiocsti   = 0x5412
	tioclinux = 0x541C
)

// Build compiles the filter for this architecture (x86_64 only).
func Build() ([]unix.SockFilter, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("seccomp: architecture %s is not supported", runtime.GOARCH)
	}
	policy, err := Policy()
	if err != nil {
		return nil, err
	}
	body, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
	// go-seccomp-bpf only accepts a bare action as the default; the profile's
	// default is "errno EPERM", so the sentinel placed by Policy in the final
	// return is replaced here.
	last, ok := body[len(body)-1].(bpf.RetConstant)
	if !ok || last.Val != uint32(bpfpolicy.ActionTrap) {
		return nil, errors.New("seccomp: assembled program does not end in the default action")
	}
	body[len(body)-1] = bpf.RetConstant{Val: uint32(defaultAction)}
	prog := append(prologue(), body...)
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: bpf: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// prologue kills foreign-ABI syscalls and refuses terminal injection. The
// ioctl command is compared on its low 32 bits only, as the kernel reads it:
// high bits set by the caller must not slip a TIOCSTI past the filter.
func prologue() []bpf.Instruction {
	kill := bpf.RetConstant{Val: uint32(bpfpolicy.ActionKillProcess)}
	eperm := bpf.RetConstant{Val: uint32(bpfpolicy.ActionErrno) | uint32(unix.EPERM)}
	return []bpf.Instruction{
		/* 0 */ bpf.LoadAbsolute{Off: 4, Size: 4}, // arch
		/* 1 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(arch.X86_64.ID), SkipTrue: 1},
		/* 2 */ kill,
		/* 3 */ bpf.LoadAbsolute{Off: 0, Size: 4}, // nr
		/* 4 */ bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: uint32(arch.X32.SeccompMask), SkipFalse: 1},
		/* 5 */ kill,
		/* 6 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_IOCTL, SkipFalse: 4},
		/* 7 */ bpf.LoadAbsolute{Off: 16 + 8*1, Size: 4}, // args[1], low word (little endian)
		/* 8 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: tiocsti, SkipTrue: 1},
		/* 9 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: tioclinux, SkipFalse: 1},
		/* 10 */ eperm,
	}
}

// Policy resolves Docker's default profile for ProfileCaps on this kernel
// and this architecture, with Denied and ENOSYS placed first.
func Policy() (*bpfpolicy.Policy, error) {
	names := arch.X86_64.SyscallNames
	known := func(ns []string) []string {
		var out []string
		for _, n := range ns {
			if _, ok := names[n]; ok {
				out = append(out, n)
			}
		}
		return out
	}
	p := &bpfpolicy.Policy{DefaultAction: bpfpolicy.ActionTrap} // sentinel, see Build
	var denied []string
	for _, d := range Denied {
		denied = append(denied, known(d.Names)...)
	}
	p.Syscalls = append(p.Syscalls,
		bpfpolicy.SyscallGroup{Names: denied, Action: bpfpolicy.ActionErrno | bpfpolicy.Action(unix.EPERM)},
		bpfpolicy.SyscallGroup{Names: known(ENOSYS), Action: bpfpolicy.ActionErrno | bpfpolicy.Action(unix.ENOSYS)},
	)
	prof := moby.DefaultProfile()
	if prof.DefaultAction != specs.ActErrno || prof.DefaultErrnoRet != nil && *prof.DefaultErrnoRet != uint(unix.EPERM) {
		return nil, fmt.Errorf("seccomp: unexpected profile default %s", prof.DefaultAction)
	}
	release, err := kernelRelease()
	if err != nil {
		return nil, err
	}
	skip := append(slices.Clone(denied), ENOSYS...)
	for _, sc := range prof.Syscalls {
		if !applies(sc, release) {
			continue
		}
		var action bpfpolicy.Action
		switch sc.Action {
		case specs.ActAllow:
			action = bpfpolicy.ActionAllow
		case specs.ActErrno:
			errno := uint(unix.EPERM)
			if sc.ErrnoRet != nil {
				errno = *sc.ErrnoRet
			}
			action = bpfpolicy.ActionErrno | bpfpolicy.Action(errno)
		default:
			return nil, fmt.Errorf("seccomp: profile action %s not supported", sc.Action)
		}
		var ns []string
		for _, n := range known(sc.Names) {
			if !slices.Contains(skip, n) {
				ns = append(ns, n)
			}
		}
		if len(ns) == 0 {
			continue
		}
		g := bpfpolicy.SyscallGroup{Action: action}
		if len(sc.Args) == 0 {
			g.Names = ns
		} else {
			conds, err := conditions(sc.Args)
			if err != nil {
				return nil, err
			}
			for _, n := range ns {
				g.NamesWithCondtions = append(g.NamesWithCondtions, bpfpolicy.NameWithConditions{Name: n, Conditions: conds})
			}
		}
		p.Syscalls = append(p.Syscalls, g)
	}
	return p, nil
}

func applies(sc *moby.Syscall, release moby.KernelVersion) bool {
	if inc := sc.Includes; inc != nil {
		for _, c := range inc.Caps {
			if !slices.Contains(ProfileCaps, c) {
				return false
			}
		}
		if len(inc.Arches) > 0 && !slices.Contains(inc.Arches, "amd64") && !slices.Contains(inc.Arches, "x86_64") {
			return false
		}
		if inc.MinKernel != nil && (release.Kernel < inc.MinKernel.Kernel || release.Kernel == inc.MinKernel.Kernel && release.Major < inc.MinKernel.Major) {
			return false
		}
	}
	if exc := sc.Excludes; exc != nil {
		for _, c := range exc.Caps {
			if slices.Contains(ProfileCaps, c) {
				return false
			}
		}
		if slices.Contains(exc.Arches, "amd64") || slices.Contains(exc.Arches, "x86_64") {
			return false
		}
	}
	return true
}

func conditions(args []specs.LinuxSeccompArg) (bpfpolicy.ArgumentConditions, error) {
	var out bpfpolicy.ArgumentConditions
	for _, a := range args {
		c := bpfpolicy.Condition{Argument: uint32(a.Index), Value: a.Value}
		switch a.Op {
		case specs.OpEqualTo:
			c.Operation = bpfpolicy.Equal
		case specs.OpNotEqual:
			c.Operation = bpfpolicy.NotEqual
		case specs.OpLessThan:
			c.Operation = bpfpolicy.LessThan
		case specs.OpLessEqual:
			c.Operation = bpfpolicy.LessOrEqual
		case specs.OpGreaterThan:
			c.Operation = bpfpolicy.GreaterThan
		case specs.OpGreaterEqual:
			c.Operation = bpfpolicy.GreaterOrEqual
		case specs.OpMaskedEqual:
			// (arg & Value) == ValueTwo; Docker uses it only with ValueTwo 0
			// ("none of these flag bits").
			if a.ValueTwo != 0 {
				return nil, fmt.Errorf("seccomp: masked compare with non-zero value %d not supported", a.ValueTwo)
			}
			c.Operation = bpfpolicy.BitsNotSet
		default:
			return nil, fmt.Errorf("seccomp: operator %s not supported", a.Op)
		}
		out = append(out, c)
	}
	return out, nil
}

func kernelRelease() (moby.KernelVersion, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return moby.KernelVersion{}, fmt.Errorf("uname: %w", err)
	}
	var k moby.KernelVersion
	_, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &k.Kernel, &k.Major)
	return k, err
}

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
