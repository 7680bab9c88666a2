package safefs

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/workspace/internal/wstest"
	"golang.org/x/sys/unix"
)

func unreadHas(us []Unread, path, why string) bool {
	for _, u := range us {
		if strings.HasPrefix(u.Path, path) && strings.Contains(u.Why, why) {
			return true
		}
	}
	return false
}

func TestReadCappedRefusesEscapes(t *testing.T) {
	root := t.TempDir()
	_ = os.Symlink("/etc/passwd", filepath.Join(root, "abs"))
	_ = os.Symlink("../../../../../../etc/passwd", filepath.Join(root, "rel"))
	_ = unix.Mkfifo(filepath.Join(root, "fifo"), 0o644)
	wstest.Mkfiles(t, root, map[string]string{"big": strings.Repeat("x", 100)})
	r := wstest.OpenPath(t, root)
	for _, p := range []string{"abs", "rel", "fifo", "../etc/passwd", "/etc/passwd"} {
		if b, err := ReadCapped(r, p, 1<<20); err == nil {
			t.Errorf("read %s: %q", p, b)
		}
	}
	if _, err := ReadCapped(r, "big", 10); err == nil {
		t.Error("size cap not enforced")
	}
}

// A walk holds the names along its path: past its budget of name bytes it
// stops reading directories, and says where.
func TestWalkKeepsItsNameBudget(t *testing.T) {
	root := t.TempDir()
	for i := range 50 {
		wstest.Mkfiles(t, root, map[string]string{"d" + strconv.Itoa(i%5) + "/" + strings.Repeat("n", 100) + strconv.Itoa(i): ""})
	}
	w := NewWalker(context.Background())
	w.max = 3 * (116 * 10) // three directories' worth
	d := wstest.OpenPath(t, root)
	top, _ := Reopen(d)
	defer top.Close()
	read := 0
	for _, n := range w.List(top, "") {
		sub := w.Enter(top, n, n, 1)
		if sub == nil {
			continue
		}
		read += len(w.List(sub, n))
		sub.Close()
	}
	if read >= 50 || !unreadHas(w.Unread(), "d", "bytes of names") {
		t.Errorf("read %d names, unread %v", read, w.Unread())
	}
}

// The links a walk remembers are capped in bytes; past the cap a file is
// read as if it had one link (its cost then counts against the reader).
func TestLinksRememberedAreCapped(t *testing.T) {
	var l Links
	st := unix.Stat_t{Mode: unix.S_IFREG, Nlink: 2, Ino: 1}
	l.bytes = maxLinkPaths - 3
	if l.First(&st, "long-path") != "" || l.First(&st, "other") != "" {
		t.Error("a link past the cap was paired")
	}
	st.Ino = 2
	if l.First(&st, "ab") != "" || l.First(&st, "cd") != "ab" {
		t.Error("a link within the cap was not paired")
	}
}
