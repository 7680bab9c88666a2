package nsinit

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path"

	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// On the gVisor wall (internal/wall/gvisor) `airlock-init gvisor-init` is the
// first process of the sandbox, started by runsc inside gVisor's Sentry,
// and serves the agent. runsc built the root from the bundle, and the
// Sentry is the sandbox's kernel, so none of init's host-kernel set-up
// applies: no mounts, no pivot_root, no Landlock or seccomp (gVisor's
// Sentry answers every system call, and is itself confined by seccomp on
// the host), no cgroup placement (the host's cgroup sees one Sentry, not
// the sandbox's processes). What init does here is what it does after
// Report{ready} in agent mode: listen, and launch the agent's commands
// from its locked main thread. Capabilities, no_new_privs and rlimits are
// the bundle's (runsc applies them before exec).
//
//	host                                   gvisor-init (in the Sentry)
//	runsc run ──────────────────────────►  argv[2] = GVisorConfig (JSON)
//	                                        listen at Socket (--host-uds=create:
//	                                        the gofer binds it in the host's
//	                                        agent directory)
//	reads stdout      ◄────────────────── "ready\n"; stdin, stdout → /dev/null
//	renames the socket out of the shared directory, then serves through it

// GVisorReady is the line gvisor-init writes on its stdout once it listens.
const GVisorReady = "ready\n"

// GVisorConfig is what the host tells gvisor-init (its argv[2]): a
// long-lived sandbox's agent (Socket ... Cwd), or a one-shot command on a
// terminal (Command, gvisortty.go).
type GVisorConfig struct {
	Command  []string `json:"command,omitempty"`
	Leader   bool     `json:"leader,omitempty"` // the terminal's leader (gvisortty.go)
	Socket   string   `json:"socket"`           // where to listen, inside the sandbox
	UID      uint32   `json:"uid"`              // the commands' default user
	GID      uint32   `json:"gid"`
	Home     string   `json:"home"`
	Cwd      string   `json:"cwd"`
	Protocol int      `json:"protocol"`
}

// GVisorMain runs `airlock-init gvisor-init CONFIG`. It never returns.
func GVisorMain(serve func(Agent) error) {
	goruntime.LockOSThread()
	signals = make(chan os.Signal, 16)
	signal.Notify(signals, forwarded...)
	if err := gvisorInit(serve); err != nil {
		fmt.Fprintf(os.Stderr, "airlock-init gvisor-init: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func gvisorInit(serve func(Agent) error) error {
	if len(os.Args) != 3 {
		return fmt.Errorf("usage: gvisor-init CONFIG")
	}
	var cfg GVisorConfig
	if err := json.Unmarshal([]byte(os.Args[2]), &cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if cfg.Protocol != ProtocolVersion {
		return fmt.Errorf("host speaks protocol %d, init speaks %d", cfg.Protocol, ProtocolVersion)
	}
	if len(cfg.Command) > 0 {
		return gvisorTerminal(cfg)
	}
	if !path.IsAbs(cfg.Socket) || len(cfg.Socket) >= 108 {
		return fmt.Errorf("socket path %q", cfg.Socket)
	}
	if err := unix.Chdir(cfg.Cwd); err != nil {
		return fmt.Errorf("chdir %s: %w", cfg.Cwd, err)
	}
	fd, err := listenAt(cfg.Socket)
	if err != nil {
		return err
	}
	lf := os.NewFile(uintptr(fd), "agent")
	ln, err := net.FileListener(lf)
	lf.Close()
	if err != nil {
		return err
	}
	// The agent's socket can be closed and bound again (gvisorsave.go).
	agentLn := newRelistener(cfg.Socket, ln)
	if err := serveControl(agentLn); err != nil {
		return err
	}
	if _, err := unix.Write(1, []byte(GVisorReady)); err != nil {
		return fmt.Errorf("report ready: %w", err)
	}
	// stdout is a pipe whose reader goes when the host does: nothing may
	// write there after it (a write would end init with SIGPIPE). stderr
	// stays: it is runsc's log, a file.
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	for _, fd := range []int{0, 1} {
		if err := unix.Dup3(null, fd, 0); err != nil {
			return err
		}
	}
	unix.Close(null)
	return runAgent(Agent{
		Net: agentLn,
		UID: cfg.UID, GID: cfg.GID, Home: cfg.Home, Env: os.Environ(), Cwd: cfg.Cwd,
		SignalResize: true,
	}, placement{procs: -1}, true, serve)
}

// listenAt listens on a unix socket bound at p, readable by root only.
func listenAt(p string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	old := unix.Umask(0o177)
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: p})
	unix.Umask(old)
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", p, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen: %w", err)
	}
	return fd, nil
}

// openPTYByName opens a terminal pair on gVisor's devpts, whose ptmx has
// no TIOCGPTPEER: the peer is opened by its name in /dev/pts, which only
// the Sentry's devpts serves (nothing in the sandbox can put another file
// there). The peer is owned by uid and gid.
func openPTYByName(uid, gid uint32, rows, cols uint16) (master, slave *os.File, err error) {
	mfd, err := unix.Open("/dev/pts/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open ptmx: %w", err)
	}
	fail := func(err error) (*os.File, *os.File, error) { unix.Close(mfd); return nil, nil, err }
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		return fail(fmt.Errorf("unlockpt: %w", err))
	}
	n, err := unix.IoctlGetUint32(mfd, unix.TIOCGPTN)
	if err != nil {
		return fail(fmt.Errorf("TIOCGPTN: %w", err))
	}
	sfd, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fail(fmt.Errorf("open pts %d: %w", n, err))
	}
	if err := unix.Fchown(sfd, int(uid), int(gid)); err != nil {
		unix.Close(sfd)
		return fail(fmt.Errorf("fchown pty: %w", err))
	}
	if rows > 0 && cols > 0 {
		_ = unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}
	return os.NewFile(uintptr(mfd), "ptmx"), os.NewFile(uintptr(sfd), "pts"), nil
}
