package nsinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// A one-shot command on a terminal (-t) on the gVisor wall. runsc gives
// the sandbox's first process the host's terminal (the console: the host
// holds its master, in raw mode, and relays it as the container wall's),
// but the Sentry shows it as a host file (/proc/self/fd/0 is "host:[1]"),
// so that `tty` and every ttyname(3) say it is no terminal. The command
// runs on a terminal of the Sentry's devpts instead (/dev/pts/N, its line
// discipline the Sentry's: ^C is a SIGINT there), which gvisor-init
// relays to the host's:
//
//	host terminal ◄──► leader (gvisor-init, session of its own) ◄──► /dev/pts/N: the command
//	                     ▲ SIGWINCH, SIGINT, SIGTERM, ...
//	init (gvisor-init, the host terminal's session; reaps)
//	                     ▲ SIGWINCH (the Sentry forwards the host's), runsc kill
//
// Two processes, because the Sentry keeps the foreground process group
// per session, not per terminal: the leader (init's child, started as
// gvisor-init again with Leader set) has /dev/pts/N as its controlling
// terminal and puts the command's process group in the foreground, so
// that it may tell that group (which a shell's job control moves) the
// SIGWINCH the Sentry's devpts does not send on a change of size; and it
// reads the host's terminal from outside that terminal's session, where
// being in the background does not stop it. Both run as the command's
// user, with its capabilities (the bundle's).
//
// Each exits as the command did (128+n for signal n), the leader once
// what the command wrote has been relayed.
func gvisorTerminal(cfg GVisorConfig) error {
	if cfg.Leader {
		return terminalLeader(cfg.Command)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, unix.SIGWINCH)
	cfg.Leader = true
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	leader := &exec.Cmd{
		Path:        self,
		Args:        []string{os.Args[0], os.Args[1], string(b)},
		Env:         os.Environ(),
		Stdin:       os.Stdin,
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL},
	}
	if err := leader.Start(); err != nil {
		return fmt.Errorf("start the terminal's leader: %w", err)
	}
	pid := leader.Process.Pid
	exited := make(chan unix.WaitStatus, 1)
	go reap(pid, exited)
	for {
		select {
		case <-winch:
			_ = unix.Kill(pid, unix.SIGWINCH)
		case s := <-signals:
			_ = unix.Kill(pid, s.(syscall.Signal))
		case ws := <-exited:
			exitAs(ws)
		}
	}
}

// exitAs exits as a process that ended with ws did.
func exitAs(ws unix.WaitStatus) {
	if ws.Signaled() {
		os.Exit(128 + int(ws.Signal()))
	}
	os.Exit(ws.ExitStatus())
}

// terminalLeader starts argv on a terminal of the Sentry's, its
// controlling one, and relays it to the host's (stdin, stdout).
func terminalLeader(argv []string) error {
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	if uid == 0 {
		gid = ttyGID
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, unix.SIGWINCH)
	size, _ := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ)
	if size == nil {
		size = &unix.Winsize{}
	}
	master, slave, err := openPTYByName(uid, gid, size.Row, size.Col)
	if err != nil {
		return err
	}
	if err := unix.IoctlSetInt(int(slave.Fd()), unix.TIOCSCTTY, 0); err != nil {
		return fmt.Errorf("TIOCSCTTY: %w", err)
	}
	var mfd int
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	// The raw descriptor, non-blocking (Fd would make it blocking):
	// relayOut drains it once the command is gone.
	_ = rc.Control(func(fd uintptr) { mfd = int(fd) })
	cmd := &exec.Cmd{
		Args:   argv,
		Env:    os.Environ(),
		Stdin:  slave,
		Stdout: slave,
		Stderr: slave,
		SysProcAttr: &syscall.SysProcAttr{
			Foreground: true, Ctty: int(slave.Fd()),
			Pdeathsig: syscall.SIGKILL,
		},
	}
	path, code, err := lookPath(argv[0], cmd.Env)
	if err == nil {
		cmd.Path = path
		if err = cmd.Start(); err != nil {
			code = 126
			if errors.Is(err, unix.ENOENT) {
				code = 127
			}
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: %v\r\n", err)
		os.Exit(code)
	}
	pid := cmd.Process.Pid
	ended := make(chan struct{})
	relayed := make(chan struct{})
	go func() { defer close(relayed); relayOut(mfd, ended) }()
	go func() { _, _ = io.Copy(master, os.Stdin) }()
	exited := make(chan unix.WaitStatus, 1)
	go reap(pid, exited)
	for {
		select {
		case <-winch:
			if now, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ); err == nil && *now != *size {
				size = now
				resize(mfd, int(slave.Fd()), size)
			}
		case s := <-signals:
			_ = unix.Kill(-pid, s.(syscall.Signal))
		case ws := <-exited:
			close(ended)
			<-relayed
			exitAs(ws)
		}
	}
}

// resize gives the terminal of master mfd and peer sfd (the leader's
// controlling terminal) its new size, and its foreground process group
// the SIGWINCH that Linux sends on a change of size and the Sentry's
// devpts does not.
func resize(mfd, sfd int, size *unix.Winsize) {
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, size); err != nil {
		return
	}
	if pg, err := unix.IoctlGetInt(sfd, unix.TIOCGPGRP); err == nil && pg > 0 {
		_ = unix.Kill(-pg, unix.SIGWINCH)
	}
}

// relayOut copies what the command writes on its terminal (master, mfd,
// non-blocking) to stdout, the host's terminal, until ended is closed;
// then what the terminal still holds.
func relayOut(mfd int, ended <-chan struct{}) {
	endR, endW, err := os.Pipe()
	if err != nil {
		return
	}
	defer endR.Close()
	go func() { <-ended; endW.Close() }()
	var efd int
	rc, _ := endR.SyscallConn()
	_ = rc.Control(func(fd uintptr) { efd = int(fd) })
	buf := make([]byte, 32<<10)
	fds := []unix.PollFd{{Fd: int32(mfd), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		if fds[0].Revents != 0 {
			n, err := unix.Read(mfd, buf)
			if n > 0 {
				if writeAll(1, buf[:n]) != nil {
					return
				}
				continue
			}
			if err != unix.EAGAIN && err != unix.EINTR {
				return
			}
		}
		if fds[1].Revents != 0 {
			// The command has ended: what it left, without waiting for
			// what anything it left behind may write.
			for {
				n, _ := unix.Read(mfd, buf)
				if n <= 0 || writeAll(1, buf[:n]) != nil {
					return
				}
			}
		}
	}
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
