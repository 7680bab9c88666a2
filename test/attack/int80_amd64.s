#include "textflag.h"

// func int80() int64
// getpid (20) through the legacy i386 system call gate; returns what the
// gate left in AX (a pid, or a negated errno).
TEXT ·int80(SB), NOSPLIT, $0-8
	MOVQ $20, AX
	INT $0x80
	MOVQ AX, ret+0(FP)
	RET
