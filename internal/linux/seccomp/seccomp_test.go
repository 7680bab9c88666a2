package seccomp

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/linux/seccomp/filter"
	bpfpolicy "github.com/elastic/go-seccomp-bpf"
	moby "github.com/moby/profiles/seccomp"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// run evaluates the compiled filter for one syscall in the BPF VM.
func run(t *testing.T, prog []unix.SockFilter, auditArch uint32, nr uint32, args ...uint64) uint32 {
	t.Helper()
	raw := make([]bpf.RawInstruction, len(prog))
	for i, f := range prog {
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("disassemble")
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	// struct seccomp_data: nr, arch, instruction_pointer, args[6]; the VM
	// loads big-endian, so build the packet so that 32-bit loads read the
	// native little-endian words the kernel would present.
	pkt := make([]byte, 64)
	put32 := func(off int, v uint32) {
		pkt[off], pkt[off+1], pkt[off+2], pkt[off+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	}
	put32(0, nr)
	put32(4, auditArch)
	for i, a := range args {
		put32(16+8*i, uint32(a)) // low word at the lower address (little endian)
		put32(16+8*i+4, uint32(a>>32))
	}
	ret, err := vm.Run(pkt)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

const x8664 = 0xC000003E

func TestFilterDecisions(t *testing.T) {
	prog, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	allow := uint32(bpfpolicy.ActionAllow)
	eperm := uint32(bpfpolicy.ActionErrno) | uint32(unix.EPERM)
	enosys := uint32(bpfpolicy.ActionErrno) | uint32(unix.ENOSYS)
	kill := uint32(bpfpolicy.ActionKillProcess)
	cases := []struct {
		name string
		arch uint32
		nr   uint32
		args []uint64
		want uint32
	}{
		{"read", x8664, unix.SYS_READ, nil, allow},
		{"execve", x8664, unix.SYS_EXECVE, nil, allow},
		{"plain clone", x8664, unix.SYS_CLONE, []uint64{uint64(unix.SIGCHLD)}, allow},
		{"clone NEWUSER", x8664, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER}, eperm},
		{"clone3", x8664, unix.SYS_CLONE3, nil, enosys},
		{"unshare", x8664, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, eperm},
		{"mount", x8664, unix.SYS_MOUNT, nil, eperm},
		{"keyctl", x8664, unix.SYS_KEYCTL, nil, eperm},
		{"bpf", x8664, unix.SYS_BPF, nil, eperm},
		{"perf_event_open", x8664, unix.SYS_PERF_EVENT_OPEN, nil, eperm},
		{"userfaultfd", x8664, unix.SYS_USERFAULTFD, nil, eperm},
		{"io_uring_setup", x8664, unix.SYS_IO_URING_SETUP, nil, eperm},
		{"finit_module", x8664, unix.SYS_FINIT_MODULE, nil, eperm},
		{"kexec_load", x8664, unix.SYS_KEXEC_LOAD, nil, eperm},
		{"ptrace", x8664, unix.SYS_PTRACE, nil, eperm},
		{"ioctl TCGETS", x8664, unix.SYS_IOCTL, []uint64{0, unix.TCGETS}, allow},
		{"ioctl TIOCSTI", x8664, unix.SYS_IOCTL, []uint64{0, tiocsti}, eperm},
		{"ioctl TIOCSTI high bits", x8664, unix.SYS_IOCTL, []uint64{0, 0xffffffff00000000 | tiocsti}, eperm},
		{"ioctl TIOCLINUX", x8664, unix.SYS_IOCTL, []uint64{0, tioclinux}, eperm},
		{"i386 abi", 0x40000003, 1, nil, kill},
		{"x32 abi", x8664, 0x40000000 | unix.SYS_READ, nil, kill},
		{"unknown syscall", x8664, 1000, nil, eperm},
		{"socket AF_UNIX", x8664, unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, allow},
		{"socket AF_INET6", x8664, unix.SYS_SOCKET, []uint64{unix.AF_INET6}, allow},
		{"socket AF_NETLINK", x8664, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK}, allow},
		{"socket AF_NETLINK high bits", x8664, unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_NETLINK}, eperm},
		{"personality(0)", x8664, unix.SYS_PERSONALITY, []uint64{0}, allow},
		{"personality(0xffffffff)", x8664, unix.SYS_PERSONALITY, []uint64{0xffffffff}, allow},
		// Regression: go-seccomp-bpf's assembler left the argument in the
		// accumulator after a failed condition, so personality(2) was
		// compared with later rules as if it were syscall 2 (open), allowed.
		{"personality(2) is not open", x8664, unix.SYS_PERSONALITY, []uint64{unix.SYS_OPEN}, eperm},
		{"personality(READ_IMPLIES_EXEC)", x8664, unix.SYS_PERSONALITY, []uint64{0x0400000}, eperm},
		{"clone NEWUSER high word", x8664, unix.SYS_CLONE, []uint64{1<<40 | uint64(unix.SIGCHLD)}, allow},
	}
	for _, c := range cases {
		if got := run(t, prog, c.arch, c.nr, c.args...); got != c.want {
			t.Errorf("%s: action %#x, want %#x", c.name, got, c.want)
		}
	}
}

func TestEncodeDecode(t *testing.T) {
	prog, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	got, err := filter.Decode(filter.Encode(prog))
	if err != nil || len(got) != len(prog) {
		t.Fatalf("Decode: %v, %d instructions, want %d", err, len(got), len(prog))
	}
	for i := range prog {
		if got[i] != prog[i] {
			t.Fatalf("instruction %d: %+v, want %+v", i, got[i], prog[i])
		}
	}
	for _, bad := range [][]byte{nil, make([]byte, 7), make([]byte, 8*5000)} {
		if _, err := filter.Decode(bad); err == nil {
			t.Errorf("Decode(%d bytes) succeeded", len(bad))
		}
	}
}

var update = flag.Bool("update", false, "rewrite filter/program.go with the program the tables compile to")

// The program airlock ships (filter.Program) is the one the tables compile
// to today; -update rewrites it.
func TestProgramIsCurrent(t *testing.T) {
	prog, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	want := filter.Encode(prog)
	if *update {
		var b bytes.Buffer
		b.WriteString("// Code generated by `go test ./internal/linux/seccomp -run TestProgramIsCurrent -update`. DO NOT EDIT.\n\n")
		b.WriteString("package filter\n\n")
		fmt.Fprintf(&b, "// program is the x86_64 filter: %d instructions, each a struct sock_filter.\nvar program = []byte{", len(prog))
		for i, c := range want {
			if i%16 == 0 {
				b.WriteString("\n\t")
			} else {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "0x%02x,", c)
		}
		b.WriteString("\n}\n")
		if err := os.WriteFile("filter/program.go", b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := filter.Program()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("filter/program.go holds %d bytes that are not what the tables compile to (%d bytes): run go test ./internal/linux/seccomp -run TestProgramIsCurrent -update", len(got), len(want))
	}
}

// The profile is resolved for MinKernel only: that is the program for every
// kernel airlock runs on as long as none of its conditions asks for a newer
// one.
func TestProfileKernelConditions(t *testing.T) {
	for _, sc := range moby.DefaultProfile().Syscalls {
		if inc := sc.Includes; inc != nil && inc.MinKernel != nil {
			if k := *inc.MinKernel; k.Kernel > MinKernel.Kernel || k.Kernel == MinKernel.Kernel && k.Major > MinKernel.Major {
				t.Errorf("%v: needs kernel %d.%d, above MinKernel %d.%d: the filter would differ by kernel", sc.Names, k.Kernel, k.Major, MinKernel.Kernel, MinKernel.Major)
			}
		}
	}
}

// reference decides a syscall straight from the rule table: the first rule
// whose number and conditions match wins.
func reference(rules []rule, nr uint32, args []uint64) uint32 {
	if nr == unix.SYS_IOCTL && len(args) > 1 && (uint32(args[1]) == tiocsti || uint32(args[1]) == tioclinux) {
		return uint32(bpfpolicy.ActionErrno) | uint32(unix.EPERM)
	}
	for _, r := range rules {
		if r.nr != nr {
			continue
		}
		ok := true
		for _, c := range r.conds {
			v := args[c.arg]
			switch c.op {
			case "eq":
				ok = ok && v == c.value
			case "ne":
				ok = ok && v != c.value
			case "lt":
				ok = ok && v < c.value
			case "le":
				ok = ok && v <= c.value
			case "gt":
				ok = ok && v > c.value
			case "ge":
				ok = ok && v >= c.value
			case "maskednone":
				ok = ok && v&c.value == 0
			}
		}
		if ok {
			return r.action
		}
	}
	return defaultAction
}

// FuzzFilterMatchesRules checks the compiled program against the rule table
// for arbitrary syscalls and arguments.
func FuzzFilterMatchesRules(f *testing.F) {
	for _, nr := range []uint32{unix.SYS_PERSONALITY, unix.SYS_SOCKET, unix.SYS_CLONE, unix.SYS_IOCTL, unix.SYS_OPEN} {
		f.Add(nr, uint64(2), uint64(0x5412), uint64(0))
	}
	prog, err := Build()
	if err != nil {
		f.Fatal(err)
	}
	rules, err := Rules()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, nr uint32, a0, a1, a2 uint64) {
		nr %= 600
		args := []uint64{a0, a1, a2, 0, 0, 0}
		if got, want := run(t, prog, x8664, nr, args...), reference(rules, nr, args); got != want {
			t.Fatalf("syscall %d args %#x %#x %#x: filter %#x, rules %#x", nr, a0, a1, a2, got, want)
		}
	})
}
