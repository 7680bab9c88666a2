package cmdutil

import "golang.org/x/term"

// TermSize is the size of the terminal on fd, rows and columns. A terminal
// that reports no size (0x0, as a pseudo-terminal nobody sized does, or a
// serial console) is taken as 24x80, the size a terminal starts with, so
// that a sandbox's terminal always has one.
func TermSize(fd int) (rows, cols uint16) {
	w, h, err := term.GetSize(fd)
	if err != nil || w <= 0 || h <= 0 {
		return 24, 80
	}
	return clamp16(h), clamp16(w)
}

func clamp16(n int) uint16 {
	if n > 0xffff {
		return 0xffff
	}
	return uint16(n)
}
