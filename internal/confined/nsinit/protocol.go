package nsinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The host and `airlock-init init` talk over one SOCK_SEQPACKET socketpair that
// the child inherits as fd 3. Exactly one typed struct crosses it in each
// direction per step; descriptors ride along as SCM_RIGHTS.
//
//	host (internal/wall/container)          child (airlock-init init, PID 1)
//	clone(NEWUSER|NEWNS|NEWPID|NEWNET|
//	      NEWUTS|NEWIPC|NEWCGROUP) ───────► blocks in recvmsg(fd 3)
//	writes uid/gid maps (before exec)
//	builds idmapped trees with the
//	child's userns
//	Config + [image trees, workspace] ───► mounts, pivot_root, caps,
//	                                        no_new_privs, Landlock, seccomp
//	                              ◄─────── Report{ready} + [ws upper, ws merged, pty]
//	                                        starts the command, reaps, forwards signals
//	                              ◄─────── Report{exit}
//	(or Report{error} at any step; EOF means init died)
//
// With Config.Agent there is no command: one more descriptor comes with
// the Config, a listening unix socket in a host directory no sandbox can
// see. After Report{ready} init closes the sync socket and serves the agent
// (internal/confined/agent) on that socket for the rest of the sandbox's
// life; the host may go away and come back (a daemon restart) without init
// noticing. When the host made a cgroup for the commands, its placement
// descriptors (Config.Commands) come last, after the socket.

// Fixed descriptor numbers in the child.
const (
	SyncFD  = 3 // the socketpair
	StdinFD = 4 // the command's stdin, stdout, stderr (absent with a TTY)
	// Lease descriptors follow the stdio ones; init holds them open so that
	// the leases live exactly as long as the sandbox.
)

// ProtocolVersion is bumped on any incompatible change to these types.
const ProtocolVersion = 3

// Config is everything init needs; built and validated by the host.
type Config struct {
	Version   int    `json:"version"`
	Hostname  string `json:"hostname"`
	Scratch   string `json:"scratch"` // empty host directory the scratch tmpfs is mounted on
	DiskBytes int64  `json:"disk_bytes"`

	// TreeTargets says where each image tree (the first descriptors sent
	// with Config) goes: "/" for a whole root filesystem, or a directory
	// such as "/usr" for the host image.
	TreeTargets []string `json:"tree_targets"`
	Writable    bool     `json:"writable"`
	Workspace   bool     `json:"workspace"` // one more descriptor: the workspace tree
	// Agent: serve the agent on one more descriptor (a listening socket,
	// sent last) instead of running Argv.
	Agent bool `json:"agent"`
	// Commands says how init puts each command it starts (agent mode)
	// into the commands' cgroup, through the CommandFDs descriptors sent
	// last: "thread" (cgroup v1: the forking thread writes "0" to the
	// first half, the commands' tasks files, before the fork and to the
	// second half, the sandbox's, after), "process" (v2: the child's pid
	// is written to the one descriptor, a cgroup.procs), or "" (none).
	Commands   string `json:"commands,omitempty"`
	CommandFDs int    `json:"command_fds,omitempty"`
	Files      []File `json:"files"` // generated into the top layer

	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	Home string `json:"home"`

	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Cwd  string   `json:"cwd"`
	TTY  bool     `json:"tty"`
	Rows uint16   `json:"rows"`
	Cols uint16   `json:"cols"`

	NoFile uint64 `json:"nofile"`
	// NProc caps the processes of each user inside (RLIMIT_NPROC), below
	// the sandbox's pids limit, so that a fork bomb of the sandbox user
	// leaves init room for its own threads.
	NProc    uint64 `json:"nproc,omitempty"`
	Landlock bool   `json:"landlock"`
	// HostNet: the network namespace was made and configured by the host;
	// init can neither configure it nor mount sysfs for it.
	HostNet  bool   `json:"host_net"`
	Seccomp  []byte `json:"seccomp"`   // struct sock_filter array, native layout
	KeepCaps []int  `json:"keep_caps"` // bounding set for the command; empty = none
}

// File is one generated file (or directory, or symlink) of the top layer.
type File struct {
	Path string      `json:"path"` // relative to the root, clean
	Mode os.FileMode `json:"mode"`
	UID  uint32      `json:"uid"`
	GID  uint32      `json:"gid"`
	Data string      `json:"data,omitempty"`
	Link string      `json:"link,omitempty"`
}

// Report is what init tells the host.
type Report struct {
	Kind string `json:"kind"` // "ready", "exit", "error"
	// ready
	Pid int `json:"pid,omitempty"` // the command's pid inside the sandbox
	// Steps times init's setup, in microseconds since it started (for
	// --debug profiling; reported by the sandbox, so only informative).
	Steps []Step `json:"steps,omitempty"`
	// exit
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
	// error, or a command that could not start (Code 126/127)
	Error string `json:"error,omitempty"`
	Step  string `json:"step,omitempty"`
}

// Step is one timed setup step.
type Step struct {
	Name string `json:"name"`
	US   int64  `json:"us"`
}

// maxMsg bounds one message; a Config carries the seccomp program and
// generated files, well under this.
const maxMsg = 4 << 20

// MakeRoom lets socket fd send messages up to maxMsg: a SEQPACKET message
// must fit the sender's buffer whole (the default is about 200 KiB, less
// than a Config with a CA bundle among its files).
func MakeRoom(fd int) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, maxMsg+64<<10); err != nil {
		return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, maxMsg+64<<10)
	}
	return nil
}

// Send writes v and fds as one message.
func Send(fd int, v any, fds []int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxMsg {
		return fmt.Errorf("message of %d bytes exceeds %d", len(b), maxMsg)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(fd, b, oob, nil, 0); err != nil {
		return fmt.Errorf("sendmsg: %w", err)
	}
	return nil
}

// ErrClosed is returned by Recv when the peer closed the socket.
var ErrClosed = errors.New("peer closed the sync socket")

// Recv reads one message into v and returns the descriptors that came with
// it (marked close-on-exec).
func Recv(fd int, v any) ([]int, error) {
	// Learn the message's size first (SEQPACKET keeps boundaries), so a
	// small report does not cost a large buffer's page faults.
	var size int
	var err error
	for {
		size, _, _, _, err = unix.Recvmsg(fd, nil, nil, unix.MSG_PEEK|unix.MSG_TRUNC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("recvmsg: %w", err)
	}
	if size > maxMsg {
		return nil, fmt.Errorf("message of %d bytes exceeds %d", size, maxMsg)
	}
	buf := make([]byte, max(size, 1))
	oob := make([]byte, unix.CmsgSpace(64*4))
	var n, oobn int
	for {
		n, oobn, _, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("recvmsg: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("parse control message: %w", err)
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err != nil {
				return nil, err
			}
			fds = append(fds, got...)
		}
	}
	if n == 0 {
		for _, f := range fds {
			unix.Close(f)
		}
		return nil, ErrClosed
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		for _, f := range fds {
			unix.Close(f)
		}
		return nil, fmt.Errorf("decode message: %w", err)
	}
	return fds, nil
}
