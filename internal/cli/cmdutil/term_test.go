package cmdutil

import (
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// A pseudo-terminal nobody sized reports 0x0: a sandbox's terminal gets
// 24x80 instead (exec -it under script(1) was refused: rows and cols must
// be positive); a sized one keeps its size.
func TestTermSizeOfAnUnsizedTerminal(t *testing.T) {
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skip("no pseudo-terminals:", err)
	}
	defer ptm.Close()
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pts.Close()
	if err := unix.IoctlSetWinsize(int(pts.Fd()), unix.TIOCSWINSZ, &unix.Winsize{}); err != nil {
		t.Fatal(err)
	}
	if r, c := TermSize(int(pts.Fd())); r != 24 || c != 80 {
		t.Errorf("unsized terminal: %dx%d, want 24x80", r, c)
	}
	if err := unix.IoctlSetWinsize(int(pts.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 132}); err != nil {
		t.Fatal(err)
	}
	if r, c := TermSize(int(pts.Fd())); r != 50 || c != 132 {
		t.Errorf("sized terminal: %dx%d, want 50x132", r, c)
	}
	if r, c := TermSize(-1); r != 24 || c != 80 {
		t.Errorf("no terminal: %dx%d, want 24x80", r, c)
	}
}
