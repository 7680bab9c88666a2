// Package nsinit is the child side of a sandbox: `airlock-init init`, PID 1 of
// the sandbox's namespaces. It assembles the root filesystem (its
// internal/confined/nsinit/rootfs), pivots into it, drops every privilege
// it will not hand on, confines itself with no_new_privs, Landlock and
// seccomp (its children inherit all of it), then starts the command as its
// child, reaps, forwards signals and reports the exit status. It trusts
// only the host's Config and imports only internal/linux/* and
// internal/confined/nsinit/rootfs (no net/http, nothing of the host side).
package nsinit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	goruntime "runtime"

	"github.com/airlock-sandbox/airlock/internal/confined/nsinit/rootfs"
	"github.com/airlock-sandbox/airlock/internal/linux/landlock"
	"github.com/airlock-sandbox/airlock/internal/linux/seccomp/filter"
	"golang.org/x/sys/unix"
)

// Main runs `airlock-init init`. It never returns. serve runs the in-sandbox
// agent when the host asks for one (Config.Agent); init itself knows
// nothing of its protocol.
//
// The main goroutine stays on one OS thread for its whole life: the
// capability, no_new_privs and rlimit changes below are per-thread, and the
// command is forked from this same thread, so it inherits exactly them.
// Seccomp (TSYNC) and Landlock are applied to every thread.
func Main(serve func(Agent) error) {
	goruntime.LockOSThread()
	// Subscribe before anything else: a signal the host forwards early must
	// be buffered for the command, not take Go's default path (which would
	// end PID 1 and the sandbox with it).
	signals = make(chan os.Signal, 16)
	signal.Notify(signals, forwarded...)
	// Nothing in the sandbox may ptrace or read /proc/1/{mem,exe,fd} of init.
	// Descriptors from the host are for init only: none reaches the command
	// unless handed over explicitly. Either failing ends init before any
	// set-up, and with it the sandbox's creation (fail closed).
	if unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) != nil ||
		unix.CloseRange(SyncFD, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) != nil {
		os.Exit(1)
	}

	started = time.Now()
	var cfg Config
	fds, err := Recv(SyncFD, &cfg)
	lap("config")
	if err != nil {
		os.Exit(1) // the host went away; nothing to report to
	}
	step, err := run(&cfg, fds, serve)
	if err != nil {
		_ = Send(SyncFD, Report{Kind: "error", Step: step, Error: err.Error()}, nil)
		os.Exit(1)
	}
	os.Exit(0)
}

var (
	started time.Time
	steps   []Step
	// signals buffers what arrives for the command (see Main).
	signals chan os.Signal
)

// forwarded are the signals init passes on to the command's process group.
var forwarded = []os.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2}

func lap(name string) {
	steps = append(steps, Step{Name: name, US: time.Since(started).Microseconds()})
}

func run(cfg *Config, fds []int, serve func(Agent) error) (string, error) {
	if cfg.Version != ProtocolVersion {
		return "protocol", fmt.Errorf("host speaks protocol %d, init speaks %d", cfg.Version, ProtocolVersion)
	}
	want := len(cfg.TreeTargets)
	if cfg.Workspace {
		want++
	}
	if cfg.Agent {
		want += 1 + cfg.CommandFDs
	}
	if len(fds) != want || cfg.CommandFDs < 0 {
		return "protocol", fmt.Errorf("got %d descriptors, want %d", len(fds), want)
	}
	listener := -1
	var place placement
	if cfg.Agent {
		var err error
		if place, err = newPlacement(cfg.Commands, fds[len(fds)-cfg.CommandFDs:]); err != nil {
			return "protocol", err
		}
		fds = fds[:len(fds)-cfg.CommandFDs]
		listener, fds = fds[len(fds)-1], fds[:len(fds)-1]
	}
	r, err := rootfs.Assemble(layout(cfg), fds)
	if err != nil {
		return "rootfs", err
	}
	lap("rootfs")
	var master, slave *os.File
	if cfg.TTY {
		if master, slave, err = openPTY(cfg); err != nil {
			return "pty", err
		}
	}
	if err := r.Pivot(); err != nil {
		return "pivot_root", err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return "hostname", fmt.Errorf("sethostname: %w", err)
	}
	if !cfg.HostNet {
		if err := loopbackUp(); err != nil {
			return "network", err
		}
	}
	lap("pivot")
	if err := confine(cfg); err != nil {
		return "confine", err
	}
	lap("confine")
	if err := unix.Chdir(cfg.Cwd); err != nil {
		return "cwd", fmt.Errorf("chdir %s: %w", cfg.Cwd, err)
	}
	// The leaked-descriptor class (runc CVE-2024-21626): a cwd outside the
	// root reads back as "(unreachable)/...".
	if wd, err := unix.Getwd(); err != nil || wd != cfg.Cwd {
		return "cwd", fmt.Errorf("working directory %q is not %q inside the root", wd, cfg.Cwd)
	}
	if cfg.Agent {
		return "agent", serveAgent(cfg, listener, r.ReadyFDs, place, serve)
	}
	return "exec", startAndWait(cfg, r.ReadyFDs, master, slave)
}

// loopbackUp brings up lo, the sandbox's only interface, so that servers
// the command starts on 127.0.0.1 are reachable from inside.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}

func openPTY(cfg *Config) (master, slave *os.File, err error) {
	return OpenPTY(filepath.Join(cfg.Scratch, "root/dev/pts/ptmx"), cfg.UID, cfg.Rows, cfg.Cols)
}

// OpenPTY opens a terminal pair on the devpts instance of ptmx, the peer
// owned by uid (group tty) and opened through the master (TIOCGPTPEER),
// never by path. The master is non-blocking, so reads honour deadlines.
func OpenPTY(ptmx string, uid uint32, rows, cols uint16) (master, slave *os.File, err error) {
	mfd, err := unix.Open(ptmx, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open ptmx: %w", err)
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, nil, fmt.Errorf("unlockpt: %w", err)
	}
	sfd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if e != 0 {
		unix.Close(mfd)
		return nil, nil, fmt.Errorf("TIOCGPTPEER: %w", e)
	}
	if err := unix.Fchown(int(sfd), int(uid), 5); err != nil {
		unix.Close(mfd)
		unix.Close(int(sfd))
		return nil, nil, fmt.Errorf("fchown pty: %w", err)
	}
	if rows > 0 && cols > 0 {
		_ = unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}
	return os.NewFile(uintptr(mfd), "ptmx"), os.NewFile(sfd, "pts"), nil
}

// confine drops what the command must not have, in the only order that
// works: capabilities, no_new_privs, Landlock (its syscalls are not in the
// seccomp profile), seccomp last. It runs on init's locked main thread, the
// one that forks the command; Landlock and seccomp cover all threads.
func confine(cfg *Config) error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_CAP_AMBIENT_CLEAR_ALL): %w", err)
	}
	keep := map[int]bool{}
	for _, c := range cfg.KeepCaps {
		keep[c] = true
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if keep[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("prctl(PR_CAPBSET_DROP, %d): %w", c, err)
		}
	}
	// The inheritable set must not carry anything across exec either.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	// Seccomp's TSYNC carries no_new_privs to every other thread.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	nofile := &unix.Rlimit{Cur: cfg.NoFile, Max: cfg.NoFile}
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err == nil && cur.Max < nofile.Max {
		nofile.Cur, nofile.Max = cur.Max, cur.Max // cannot raise the hard limit
	}
	if err := syscall.Setrlimit(unix.RLIMIT_NOFILE, (*syscall.Rlimit)(nofile)); err != nil {
		return fmt.Errorf("setrlimit(NOFILE): %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("setrlimit(CORE): %w", err)
	}
	if cfg.NProc > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: cfg.NProc, Max: cfg.NProc}); err != nil {
			return fmt.Errorf("setrlimit(NPROC): %w", err)
		}
	}
	if cfg.Landlock {
		rw := []string{"/workspace", "/tmp", "/dev/shm", "/dev/pts", cfg.Home}
		if cfg.Writable {
			rw = append(rw, "/")
		}
		if err := landlock.Restrict(rw, []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom"}); err != nil {
			return err
		}
	}
	prog, err := filter.Decode(cfg.Seccomp)
	if err != nil {
		return err
	}
	return filter.Load(prog)
}

func startAndWait(cfg *Config, readyFDs []int, master, slave *os.File) error {
	cmd := &exec.Cmd{
		Args: cfg.Argv,
		Env:  cfg.Env,
		SysProcAttr: &syscall.SysProcAttr{
			Setsid:     true,
			Credential: &syscall.Credential{Uid: cfg.UID, Gid: cfg.GID, Groups: []uint32{}},
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	if cfg.TTY {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
	} else {
		cmd.Stdin = os.NewFile(StdinFD, "stdin")
		cmd.Stdout = os.NewFile(StdinFD+1, "stdout")
		cmd.Stderr = os.NewFile(StdinFD+2, "stderr")
	}
	path, code, err := lookPath(cfg.Argv[0], cfg.Env)
	if err == nil {
		cmd.Path = path
		err = cmd.Start()
		if err != nil {
			code = 126
			if errors.Is(err, unix.ENOENT) {
				code = 127
			}
		}
	}
	ready := readyFDs
	if master != nil {
		ready = append(ready, int(master.Fd()))
	}
	if err != nil {
		_ = Send(SyncFD, Report{Kind: "ready"}, ready)
		return Send(SyncFD, Report{Kind: "exit", Code: code, Error: err.Error()}, nil)
	}
	if slave != nil {
		slave.Close()
	}
	pid := cmd.Process.Pid
	lap("started")
	if err := Send(SyncFD, Report{Kind: "ready", Pid: pid, Steps: steps}, ready); err != nil {
		return err
	}
	for _, fd := range readyFDs {
		unix.Close(fd)
	}
	if master != nil {
		master.Close()
	}
	// Signals are forwarded from this goroutine, on init's locked main
	// thread: Landlock gave each of init's threads a domain of its own, and
	// the command shares this thread's, so only from here may it be
	// signalled under Landlock's signal scoping. Reaping happens elsewhere.
	exited := make(chan unix.WaitStatus, 1)
	go reap(pid, exited)
	for {
		select {
		case s := <-signals:
			_ = unix.Kill(-pid, s.(syscall.Signal))
		case ws := <-exited:
			rep := Report{Kind: "exit", Code: ws.ExitStatus()}
			if ws.Signaled() {
				rep.Signal = int(ws.Signal())
				rep.Code = 128 + rep.Signal
			}
			return Send(SyncFD, rep, nil)
		}
	}
}

// reap waits for every child: the command, and the orphans re-parented to
// init; it sends the command's status.
func reap(pid int, exited chan<- unix.WaitStatus) {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return
		}
		if got == pid {
			exited <- ws
		}
	}
}

// lookPath finds the command the way a shell would with the sandbox's PATH.
func lookPath(file string, env []string) (string, int, error) {
	if strings.Contains(file, "/") {
		return file, 0, nil
	}
	pathEnv := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, 0, nil
		}
	}
	return "", 127, fmt.Errorf("%s: command not found", file)
}

// layout is what of cfg the root is assembled from.
func layout(cfg *Config) rootfs.Layout {
	files := make([]rootfs.File, len(cfg.Files))
	for i, f := range cfg.Files {
		files[i] = rootfs.File{Path: f.Path, Mode: f.Mode, UID: f.UID, GID: f.GID, Data: f.Data, Link: f.Link}
	}
	return rootfs.Layout{
		Scratch: cfg.Scratch, DiskBytes: cfg.DiskBytes, TreeTargets: cfg.TreeTargets,
		Writable: cfg.Writable, Workspace: cfg.Workspace, Agent: cfg.Agent, HostNet: cfg.HostNet,
		Files: files, UID: cfg.UID, GID: cfg.GID, Home: cfg.Home,
	}
}
