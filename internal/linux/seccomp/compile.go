package seccomp

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// The policy is compiled here rather than by go-seccomp-bpf's assembler:
// that one falls through to the next rule with an argument word, not the
// syscall number, in the accumulator after a failed argument check, so a
// later rule could match a syscall whose argument equals its number (for
// example personality(2) taken for open, syscall 2). Every rule below
// starts with the syscall number loaded, and a rule that loads arguments
// reloads the number before handing over. TestFilterDecisions pins this.

// rule is one syscall with an action, allowed only when all conds hold.
type rule struct {
	nr     uint32
	conds  []cond
	action uint32
}

// cond compares a 64-bit syscall argument.
type cond struct {
	arg   uint32
	op    string // eq, ne, lt, le, gt, ge, maskednone ((arg & value) == 0)
	value uint64
}

// asm is a forward-only assembler with labels.
type asm struct {
	insns  []bpf.Instruction
	fixups []fixup
	labels map[int]int
	next   int
}

type fixup struct {
	at          int
	true, false int // label ids, -1 for "next instruction"
}

func newAsm() *asm { return &asm{labels: map[int]int{}} }

func (a *asm) label() int             { a.next++; return a.next }
func (a *asm) mark(l int)             { a.labels[l] = len(a.insns) }
func (a *asm) emit(i bpf.Instruction) { a.insns = append(a.insns, i) }

// jump emits a conditional jump to labels t and f (-1: fall through).
func (a *asm) jump(cond bpf.JumpTest, val uint32, t, f int) {
	a.fixups = append(a.fixups, fixup{at: len(a.insns), true: t, false: f})
	a.insns = append(a.insns, bpf.JumpIf{Cond: cond, Val: val})
}

func (a *asm) resolve() ([]bpf.Instruction, error) {
	for _, fx := range a.fixups {
		j := a.insns[fx.at].(bpf.JumpIf)
		skip := func(l int) (uint8, error) {
			if l < 0 {
				return 0, nil
			}
			target, ok := a.labels[l]
			if !ok {
				return 0, fmt.Errorf("seccomp: unresolved label %d", l)
			}
			d := target - fx.at - 1
			if d < 0 || d > 255 {
				return 0, fmt.Errorf("seccomp: jump of %d instructions", d)
			}
			return uint8(d), nil
		}
		var err error
		if j.SkipTrue, err = skip(fx.true); err != nil {
			return nil, err
		}
		if j.SkipFalse, err = skip(fx.false); err != nil {
			return nil, err
		}
		a.insns[fx.at] = j
	}
	return a.insns, nil
}

const (
	offNR   = 0
	offArgs = 16
)

func loadNR() bpf.Instruction { return bpf.LoadAbsolute{Off: offNR, Size: 4} }

// little endian: the low word of args[i] comes first.
func loadLo(arg uint32) bpf.Instruction { return bpf.LoadAbsolute{Off: offArgs + 8*arg, Size: 4} }
func loadHi(arg uint32) bpf.Instruction { return bpf.LoadAbsolute{Off: offArgs + 8*arg + 4, Size: 4} }

// compile emits the rules in order, then the default action. The
// accumulator holds the syscall number on entry.
func compile(rules []rule, defaultAction uint32) ([]bpf.Instruction, error) {
	a := newAsm()
	// Unconditional rules with the same action are emitted in runs that
	// share one return, to keep the program short.
	for i := 0; i < len(rules); {
		r := rules[i]
		if len(r.conds) > 0 {
			emitConditional(a, r)
			i++
			continue
		}
		j := i
		for j < len(rules) && j-i < 200 && len(rules[j].conds) == 0 && rules[j].action == r.action {
			j++
		}
		ret, skip := a.label(), a.label()
		for k := i; k < j; k++ {
			a.jump(bpf.JumpEqual, rules[k].nr, ret, -1)
		}
		a.emit(bpf.Jump{Skip: 1})
		a.mark(ret)
		a.emit(bpf.RetConstant{Val: r.action})
		a.mark(skip)
		i = j
	}
	a.emit(bpf.RetConstant{Val: defaultAction})
	return a.resolve()
}

func emitConditional(a *asm, r rule) {
	other, fail := a.label(), a.label()
	a.jump(bpf.JumpEqual, r.nr, -1, other)
	for _, c := range r.conds {
		ok := a.label()
		vhi, vlo := uint32(c.value>>32), uint32(c.value)
		switch c.op {
		case "eq":
			a.emit(loadHi(c.arg))
			a.jump(bpf.JumpEqual, vhi, -1, fail)
			a.emit(loadLo(c.arg))
			a.jump(bpf.JumpEqual, vlo, ok, fail)
		case "ne":
			a.emit(loadHi(c.arg))
			a.jump(bpf.JumpEqual, vhi, -1, ok)
			a.emit(loadLo(c.arg))
			a.jump(bpf.JumpEqual, vlo, fail, ok)
		case "lt", "le", "gt", "ge":
			// Decide on the high words; compare the low words when equal.
			less, greater := fail, ok
			if c.op == "lt" || c.op == "le" {
				less, greater = ok, fail
			}
			a.emit(loadHi(c.arg))
			a.jump(bpf.JumpGreaterThan, vhi, greater, -1)
			a.jump(bpf.JumpEqual, vhi, -1, less)
			a.emit(loadLo(c.arg))
			switch c.op {
			case "lt":
				a.jump(bpf.JumpGreaterOrEqual, vlo, fail, ok)
			case "le":
				a.jump(bpf.JumpGreaterThan, vlo, fail, ok)
			case "gt":
				a.jump(bpf.JumpGreaterThan, vlo, ok, fail)
			case "ge":
				a.jump(bpf.JumpGreaterOrEqual, vlo, ok, fail)
			}
		case "maskednone":
			a.emit(loadHi(c.arg))
			a.jump(bpf.JumpBitsSet, vhi, fail, -1)
			a.emit(loadLo(c.arg))
			a.jump(bpf.JumpBitsSet, vlo, fail, ok)
		}
		a.mark(ok)
	}
	a.emit(bpf.RetConstant{Val: r.action})
	a.mark(fail)
	a.emit(loadNR()) // hand the next rule the syscall number again
	a.mark(other)
}
