package nsinit

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// gVisor saves a sandbox's memory (runsc checkpoint) only when no socket
// of it is backed by a host socket: the agent's listening socket (bound on
// the host by the gofer) and the host's connections to it must be gone
// first, and come back after. gvisor-init serves a control socket for
// that, in a directory of the Sentry's own /dev that only root may enter
// (no host file; an abstract socket would let any command connect),
// answering root only; `airlock-init gvisor-hook close|listen NAME` (this binary, which the
// host starts with `runsc exec` as root) asks it:
//
//	close        stop listening, close every connection of the host's,
//	             and answer once no host socket is left open
//	listen NAME  listen again at NAME in the agent's directory (the host
//	             moves the socket out, as at the start), and answer
//
// A sandbox restored from a checkpoint (runsc restore) comes back with the
// agent closed; the host asks it to listen, under a name of its own.

// gvisorControl is the socket gvisor-init's control listens on, in a
// directory of root's (0700) in the Sentry's own /dev.
const (
	gvisorControlDir = "/dev/.airlock"
	gvisorControl    = gvisorControlDir + "/init.sock"
)

// relistener is the agent's listener, whose host socket can be closed and
// bound again while the agent serves on.
type relistener struct {
	dir   string // the agent's directory
	conns chan net.Conn

	mu   sync.Mutex
	cur  net.Listener
	path string // where cur is bound
	open map[*tracked]struct{}
}

func newRelistener(path string, first net.Listener) *relistener {
	r := &relistener{dir: filepath.Dir(path), conns: make(chan net.Conn), open: map[*tracked]struct{}{}}
	r.start(first, path)
	return r
}

func (r *relistener) start(ln net.Listener, path string) {
	r.cur, r.path = ln, path
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed (close), or the socket went
			}
			t := &tracked{Conn: c, r: r}
			r.mu.Lock()
			if r.cur != ln {
				r.mu.Unlock()
				c.Close()
				return
			}
			r.open[t] = struct{}{}
			r.mu.Unlock()
			r.conns <- t
		}
	}()
}

// Accept waits for the next connection of whichever socket listens.
func (r *relistener) Accept() (net.Conn, error) { return <-r.conns, nil }

// Close is never asked for: the agent serves as long as init lives.
func (r *relistener) Close() error { return nil }

// Addr is the agent's socket.
func (r *relistener) Addr() net.Addr { return &net.UnixAddr{Name: r.dir, Net: "unix"} }

// close stops listening, removes the socket's name (a restored sandbox's
// agent directory does not hold it: the Sentry would look for it there),
// and closes every connection.
func (r *relistener) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		r.cur.Close()
		r.cur = nil
		if err := os.Remove(r.path); err != nil {
			return err
		}
	}
	for t := range r.open {
		t.Conn.Close()
		delete(r.open, t)
	}
	return nil
}

// listen binds the agent's socket again at name in its directory.
func (r *relistener) listen(name string) error {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return fmt.Errorf("socket name %q", name)
	}
	p := filepath.Join(r.dir, name)
	fd, err := listenAt(p)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		r.cur.Close()
		_ = os.Remove(r.path)
	}
	r.start(ln, p)
	return nil
}

type tracked struct {
	net.Conn
	r *relistener
}

func (t *tracked) Close() error {
	t.r.mu.Lock()
	delete(t.r.open, t)
	t.r.mu.Unlock()
	return t.Conn.Close()
}

// serveControl answers the host's hook on the control socket.
func serveControl(r *relistener) error {
	if err := os.Mkdir(gvisorControlDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("the control socket's directory: %w", err)
	}
	// Whatever was there (a restored sandbox's own), root's alone.
	if err := os.Chown(gvisorControlDir, 0, 0); err != nil {
		return err
	}
	if err := os.Chmod(gvisorControlDir, 0o700); err != nil {
		return err
	}
	_ = os.Remove(gvisorControl)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: gvisorControl}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bind the control socket: %w", err)
	}
	if err := unix.Listen(fd, 4); err != nil {
		unix.Close(fd)
		return err
	}
	f := os.NewFile(uintptr(fd), "control")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				continue
			}
			control(r, c.(*net.UnixConn))
		}
	}()
	return nil
}

// control answers one request, from root only.
func control(r *relistener, c *net.UnixConn) {
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil || cred.Uid != 0 {
		fmt.Fprintln(c, "error: root only")
		return
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	verb, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch verb {
	case "close":
		if err = r.close(); err == nil {
			err = noHostSockets()
		}
	case "listen":
		err = r.listen(arg)
	default:
		err = fmt.Errorf("unknown request %q", verb)
	}
	if err != nil {
		fmt.Fprintf(c, "error: %v\n", err)
		return
	}
	fmt.Fprintln(c, "ok")
}

// noHostSockets waits until init holds no socket but its control's and
// the one asking (Go closes a connection's descriptor once its last reader
// has returned, just after Close).
func noHostSockets() error {
	for i := 0; i < 500; i++ {
		n := 0
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
				n++
			}
		}
		if n <= 2 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the agent's connections did not close")
}

// HookMain runs `airlock-init gvisor-hook close|listen NAME` inside a gVisor
// sandbox (started by the host with runsc exec). It never returns.
func HookMain() {
	if err := hook(strings.Join(os.Args[2:], " ")); err != nil {
		fmt.Fprintf(os.Stderr, "airlock-init gvisor-hook: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func hook(req string) error {
	c, err := net.Dial("unix", gvisorControl)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := fmt.Fprintln(c, req); err != nil {
		return err
	}
	said, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("gvisor-init did not answer: %w", err)
	}
	if said = strings.TrimSpace(said); said != "ok" {
		return errors.New(said)
	}
	return nil
}
