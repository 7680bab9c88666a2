package gvisor

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY is a host terminal pair, as runsc's console makes one.
func openPTY(t *testing.T) (master, peer *os.File) {
	t.Helper()
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no /dev/ptmx: %v", err)
	}
	master = os.NewFile(uintptr(mfd), "ptmx")
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	sfd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if e != 0 {
		t.Fatal(e)
	}
	peer = os.NewFile(sfd, "pts")
	t.Cleanup(func() { peer.Close() })
	return master, peer
}

// open is the number of descriptors this process has open.
func open(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// The console socket accepts one descriptor, a terminal's master, and
// closes every descriptor of a message it refuses.
func TestConsoleTakesOnlyOneTerminalMaster(t *testing.T) {
	master, peer := openPTY(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	fds := func(fs ...*os.File) []int {
		var out []int
		for _, f := range fs {
			out = append(out, int(f.Fd()))
		}
		return out
	}
	// Received descriptors are this process's own copies, as recvmsg
	// makes them.
	received := func(fds []int) []int {
		var out []int
		for _, fd := range fds {
			d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
		return out
	}
	for name, oob := range map[string]func() []byte{
		"no descriptor":       func() []byte { return nil },
		"a pipe":              func() []byte { return unix.UnixRights(received(fds(r))...) },
		"the terminal's peer": func() []byte { return unix.UnixRights(received(fds(peer))...) },
		"two masters":         func() []byte { return unix.UnixRights(received(fds(master, master))...) },
		"the master and a pipe in two messages": func() []byte {
			return append(unix.UnixRights(received(fds(master))...), unix.UnixRights(received(fds(w))...)...)
		},
	} {
		before := open(t)
		if f, err := consoleMaster(oob(), 0); err == nil {
			f.Close()
			t.Errorf("%s: accepted", name)
		}
		if after := open(t); after != before {
			t.Errorf("%s: %d descriptors open after, %d before: the refused ones must be closed", name, after, before)
		}
	}
	if _, err := consoleMaster(unix.UnixRights(received(fds(master))...), unix.MSG_CTRUNC); err == nil {
		t.Error("a truncated message was accepted")
	}
	f, err := consoleMaster(unix.UnixRights(received(fds(master))...), 0)
	if err != nil {
		t.Fatalf("the master: %v", err)
	}
	f.Close()
}

// receiveConsole takes the master from runsc run's connection only: a
// connection from another process is refused.
func TestConsoleTakesTheMasterFromRunscRunOnly(t *testing.T) {
	master, _ := openPTY(t)
	send := func(path string) {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		// A refusing end may have closed the connection already.
		_, _, _ = c.(*net.UnixConn).WriteMsgUnix([]byte("pty-master"), unix.UnixRights(int(master.Fd())), nil)
	}
	for _, tc := range []struct {
		name string
		pid  int
		ok   bool
	}{{"runsc run's", os.Getpid(), true}, {"another process's", os.Getpid() + 1, false}} {
		ln, path, err := listenConsole(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(filepath.Dir(path)); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("console directory: %v %v, want 0700", st.Mode(), err)
		}
		sent := make(chan struct{})
		go func() { defer close(sent); send(path) }()
		f, err := receiveConsole(ln, tc.pid)
		<-sent
		if (err == nil) != tc.ok {
			t.Errorf("%s connection: %v", tc.name, err)
		}
		if f != nil {
			if err := rawTerminal(f, 33, 101); err != nil {
				t.Error(err)
			}
			ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
			if err != nil || ws.Row != 33 || ws.Col != 101 {
				t.Errorf("size %+v %v", ws, err)
			}
			// The line discipline is the Sentry's terminal's, inside.
			tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
			if err != nil || tio.Lflag&(unix.ECHO|unix.ICANON|unix.ISIG) != 0 || tio.Oflag&unix.OPOST != 0 || tio.Iflag&unix.ICRNL != 0 {
				t.Errorf("the host's terminal is not raw: %+v %v", tio, err)
			}
			f.Close()
		}
	}
}
