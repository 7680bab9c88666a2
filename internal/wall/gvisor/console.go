package gvisor

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"golang.org/x/sys/unix"
)

// A one-shot sandbox's terminal (-t). runsc run (--console-socket) opens
// a host terminal pair, sends its master over a unix socket the host
// listens on, and gives the peer to the sandbox's first process
// (gvisor-init, which starts the command on a terminal of the Sentry's:
// internal/confined/nsinit/gvisortty.go). The host relays the master as
// the container wall's (wall.Layers.PTY).
//
// The socket is in a directory of the bundle that only host root may
// enter: the Sentry and the gofer run as the sandbox's leased ids, and
// nothing in the sandbox names host paths. One connection is taken, from
// runsc run itself (its peer credentials), carrying exactly one
// descriptor, a terminal's master; anything else fails the create.

// consoleDir is the root-only directory of a bundle holding the socket.
const consoleDir = "console"

// listenConsole listens on the console socket of bundle; path is where.
func listenConsole(bundle string) (ln *net.UnixListener, path string, err error) {
	dir := filepath.Join(bundle, consoleDir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("console: %w", err)
	}
	path = filepath.Join(dir, "sock")
	if len(path) >= len(unix.RawSockaddrUnix{}.Path) {
		return nil, "", fmt.Errorf("%w: console socket path %s is too long (a shorter --state-dir)", errdefs.ErrUnavailable, path)
	}
	ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, "", fmt.Errorf("console: %w", err)
	}
	return ln, path, nil
}

// receiveConsole takes the terminal's master from the one connection of
// process pid (runsc run) to ln, and closes ln. It returns when the
// master came, or with an error once ln is closed (runsc ended first).
func receiveConsole(ln *net.UnixListener, pid int) (*os.File, error) {
	defer ln.Close()
	conn, err := ln.AcceptUnix()
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	defer conn.Close()
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("console: SO_PEERCRED: %w", credErr)
	}
	if int(cred.Pid) != pid || cred.Uid != 0 {
		return nil, fmt.Errorf("%w: console: a connection from pid %d uid %d, not runsc run's (pid %d)", errdefs.ErrInternal, cred.Pid, cred.Uid, pid)
	}
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*4))
	_, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	return consoleMaster(oob[:oobn], flags)
}

// consoleMaster is the one descriptor that the control messages oob carry,
// if it is a terminal's master; every descriptor received is closed
// otherwise.
func consoleMaster(oob []byte, flags int) (*os.File, error) {
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob)
	for _, m := range msgs {
		got, rerr := unix.ParseUnixRights(&m)
		if rerr != nil && err == nil {
			err = rerr
		}
		fds = append(fds, got...)
	}
	fail := func(err error) (*os.File, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("%w: console: %v", errdefs.ErrInternal, err)
	}
	switch {
	case err != nil:
		return fail(err)
	case flags&unix.MSG_CTRUNC != 0:
		return fail(fmt.Errorf("control message truncated"))
	case len(msgs) != 1 || len(fds) != 1:
		return fail(fmt.Errorf("%d messages with %d descriptors, not one", len(msgs), len(fds)))
	}
	fd := fds[0]
	unix.CloseOnExec(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("fstat: %w", err))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return fail(fmt.Errorf("not a character device (mode %o)", st.Mode))
	}
	if _, err := unix.IoctlGetTermios(fd, unix.TCGETS); err != nil {
		return fail(fmt.Errorf("not a terminal: %w", err))
	}
	// Only a master has a peer number.
	if _, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN); err != nil {
		return fail(fmt.Errorf("not a terminal's master: %w", err))
	}
	return os.NewFile(uintptr(fd), "pty"), nil
}

// rawTerminal puts the host terminal of master in raw mode (the line
// discipline is the Sentry's terminal's, inside) and gives it the user's
// size, when known.
func rawTerminal(master *os.File, rows, cols uint16) error {
	fd := int(master.Fd())
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return fmt.Errorf("console: TCGETS: %w", err)
	}
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, t); err != nil {
		return fmt.Errorf("console: TCSETS: %w", err)
	}
	if rows > 0 && cols > 0 {
		if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
			return fmt.Errorf("console: TIOCSWINSZ: %w", err)
		}
	}
	return nil
}

// terminal is the master runsc run sends on console (the sandbox's
// terminal), raw and rows×cols; or, when runsc ends first, an error with
// what runsc said.
func (sb *Sandbox) terminal(console *net.UnixListener, rows, cols uint16) (*os.File, error) {
	type got struct {
		f   *os.File
		err error
	}
	recv := make(chan got, 1)
	go func() {
		f, err := receiveConsole(console, sb.pid)
		recv <- got{f, err}
	}()
	var g got
	select {
	case g = <-recv:
	case <-sb.exited:
		console.Close()
		g = <-recv
	}
	if g.err != nil {
		select {
		case <-sb.exited:
			said := strings.TrimSpace(<-sb.stderr)
			sb.stderr <- said
			return nil, fmt.Errorf("%w: no terminal from runsc: %s", errdefs.ErrUnavailable, runscError(said))
		default:
			return nil, g.err
		}
	}
	if err := rawTerminal(g.f, rows, cols); err != nil {
		g.f.Close()
		return nil, err
	}
	return g.f, nil
}
