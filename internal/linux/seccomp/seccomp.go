// Package seccomp builds and loads airlock's syscall filter. The policy is
// data: Docker's default profile (moby/profiles/seccomp) resolved for the
// capabilities a sandbox may hold, plus the Denied table below, plus a
// prologue that kills any syscall made through another architecture's ABI
// (i386, x32) and refuses the TIOCSTI/TIOCLINUX ioctls. It is compiled to
// classic BPF (compile.go; syscall numbers from go-seccomp-bpf's tables)
// ahead of time: internal/linux/seccomp/filter holds the program (kept
// current by TestProgramIsCurrent), which airlock sends to a sandbox's
// init and init loads. No binary links this package.
package seccomp

import (
	"fmt"
	"runtime"
	"slices"

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
const defaultAction = uint32(bpfpolicy.ActionErrno) | uint32(unix.EPERM)

const (
	tiocsti   = 0x5412
	tioclinux = 0x541C
)

// Build compiles the filter for this architecture (x86_64 only).
func Build() ([]unix.SockFilter, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("seccomp: architecture %s is not supported", runtime.GOARCH)
	}
	rules, err := Rules()
	if err != nil {
		return nil, err
	}
	body, err := compile(rules, defaultAction)
	if err != nil {
		return nil, err
	}
	prog := append(prologue(), body...)
	if len(prog) > 4096 {
		return nil, fmt.Errorf("seccomp: program of %d instructions exceeds the kernel's 4096", len(prog))
	}
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
		/* 3 */ loadNR(),
		/* 4 */ bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: uint32(arch.X32.SeccompMask), SkipFalse: 1},
		/* 5 */ kill,
		/* 6 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_IOCTL, SkipFalse: 6}, // to 13
		/* 7 */ loadLo(1),
		/* 8 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: tiocsti, SkipTrue: 3}, // to 12
		/* 9 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: tioclinux, SkipTrue: 2}, // to 12
		/* 10 */ loadNR(), // the rules expect the syscall number
		/* 11 */ bpf.Jump{Skip: 1},
		/* 12 */ eperm,
		// 13: the rules
	}
}

// MinKernel is the kernel the profile is resolved for: the oldest airlock
// runs on (its idmapped mounts need 5.12). The profile's kernel conditions
// all lie at or below it (TestProfileKernelConditions), so the filter is
// the same on every kernel airlock runs on and is compiled ahead of time
// (internal/linux/seccomp/filter).
var MinKernel = moby.KernelVersion{Kernel: 5, Major: 12}

// Rules resolves Docker's default profile for ProfileCaps on MinKernel
// and x86_64, in order: Denied and ENOSYS first, then the
// profile's rules as it lists them.
func Rules() ([]rule, error) {
	names := arch.X86_64.SyscallNames
	var rules []rule
	add := func(n string, conds []cond, action uint32) {
		if nr, ok := names[n]; ok {
			rules = append(rules, rule{nr: uint32(nr), conds: conds, action: action})
		}
	}
	errno := func(e unix.Errno) uint32 { return uint32(bpfpolicy.ActionErrno) | uint32(e) }
	var skip []string
	for _, d := range Denied {
		for _, n := range d.Names {
			add(n, nil, errno(unix.EPERM))
			skip = append(skip, n)
		}
	}
	for _, n := range ENOSYS {
		add(n, nil, errno(unix.ENOSYS))
		skip = append(skip, n)
	}
	prof := moby.DefaultProfile()
	if prof.DefaultAction != specs.ActErrno || prof.DefaultErrnoRet != nil && *prof.DefaultErrnoRet != uint(unix.EPERM) {
		return nil, fmt.Errorf("seccomp: unexpected profile default %s", prof.DefaultAction)
	}
	for _, sc := range prof.Syscalls {
		if !applies(sc, MinKernel) {
			continue
		}
		var action uint32
		switch sc.Action {
		case specs.ActAllow:
			action = uint32(bpfpolicy.ActionAllow)
		case specs.ActErrno:
			e := uint(unix.EPERM)
			if sc.ErrnoRet != nil {
				e = *sc.ErrnoRet
			}
			action = errno(unix.Errno(e))
		default:
			return nil, fmt.Errorf("seccomp: profile action %s not supported", sc.Action)
		}
		conds, err := conditions(sc.Args)
		if err != nil {
			return nil, err
		}
		for _, n := range sc.Names {
			if !slices.Contains(skip, n) {
				add(n, conds, action)
			}
		}
	}
	return rules, nil
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

// operators maps the profile's comparisons to compile.go's.
var operators = map[specs.LinuxSeccompOperator]string{
	specs.OpEqualTo: "eq", specs.OpNotEqual: "ne", specs.OpLessThan: "lt",
	specs.OpLessEqual: "le", specs.OpGreaterThan: "gt", specs.OpGreaterEqual: "ge",
}

func conditions(args []specs.LinuxSeccompArg) ([]cond, error) {
	var out []cond
	for _, a := range args {
		c := cond{arg: uint32(a.Index), value: a.Value}
		if a.Index > 5 {
			return nil, fmt.Errorf("seccomp: argument index %d", a.Index)
		}
		switch op, ok := operators[a.Op]; {
		case ok:
			c.op = op
		case a.Op == specs.OpMaskedEqual:
			// (arg & Value) == ValueTwo; Docker uses it only with ValueTwo 0
			// ("none of these flag bits").
			if a.ValueTwo != 0 {
				return nil, fmt.Errorf("seccomp: masked compare with non-zero value %d not supported", a.ValueTwo)
			}
			c.op = "maskednone"
		default:
			return nil, fmt.Errorf("seccomp: operator %s not supported", a.Op)
		}
		out = append(out, c)
	}
	return out, nil
}
