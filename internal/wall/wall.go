// Package wall is what differs between isolation technologies, behind one
// small interface: make a sandbox from a prepared root, limits and network
// namespace, signal it, pause and resume it, read its accounting, destroy
// it, and adopt it again after a daemon restart. Everything around a wall
// (images, workspaces, the network and its proxy, the broker, audit, the
// API) is the same for every wall and lives above it, in
// internal/lifecycle, which prepares Options and never looks inside a
// Sandbox.
//
// Walls: internal/wall/container (airlock's own namespace launcher, the
// default) and internal/wall/gvisor (runsc). A wall is built on internal/linux/* and the confined side it
// launches; this package imports nothing of airlock.
package wall

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// SandboxUID is the unprivileged user a command runs as by default, inside
// every wall.
const SandboxUID = 1000

// Wall is one isolation technology on this host.
type Wall interface {
	// Name is the wall's name as specs and doctor show it ("container").
	Name() string
	// Version is the version of the wall's runtime, as audit records
	// name it ("" for a wall that is airlock's own code).
	Version() string
	// Missing lists the controls of this wall the host lacks and a caller
	// may run without when it says so (spec.AllowDegraded); a control that
	// cannot be done without makes New fail instead.
	Missing() []Missing
	// Reserve takes a new sandbox id's lock before anything is made for
	// it; gc treats a reserved id as alive.
	Reserve(id string) (Reservation, error)
	// Create builds and starts the sandbox o describes under r. On error
	// every step already taken is undone and r is released.
	Create(r Reservation, o *Options) (Sandbox, error)
	// Adopt takes over long-lived sandbox id, made by an earlier process,
	// whose init has host pid pid.
	Adopt(id string, pid int) (Sandbox, error)
	// Discard ends whatever is left of sandbox id that could not be
	// adopted, and removes it.
	Discard(id string) error
	// Live reports whether sandbox id is held by a live process.
	Live(id string) bool
	// GC removes what dead sandboxes left behind and names them.
	GC() ([]string, error)
}

// Missing is a control the host lacks.
type Missing struct {
	Control string // the name spec.AllowDegraded takes ("landlock")
	Detail  string // why, and what the sandbox runs without
}

// Reservation holds a sandbox id from before anything is made for it until
// the sandbox is destroyed.
type Reservation interface {
	ID() string
	// Release gives the id up unless a sandbox was created with it.
	Release()
}

// Tree is a host directory shown read-only inside the sandbox at Target,
// with its ownership shifted into the sandbox's uid range.
type Tree struct {
	HostPath string
	Target   string // "/" for a whole root filesystem
}

// File is a file, directory or symlink made in the sandbox's root before
// the command starts.
type File struct {
	Path     string // relative to the root, clean
	Mode     os.FileMode
	UID, GID uint32
	Data     string
	Link     string // a symlink's target
}

// Options describe one sandbox, prepared by internal/lifecycle from a
// validated spec: what it is made of, what it runs, and its limits.
type Options struct {
	Trees     []Tree
	Files     []File
	Writable  bool   // a writable layer over the image
	Workspace string // host directory shown copy-on-write at /workspace

	Root     bool // run the command as root inside (with KeepCaps)
	KeepCaps []int
	Home     string
	Argv     []string
	Env      []string
	Cwd      string
	Hostname string

	TTY        bool
	Rows, Cols uint16
	// Stdio are the command's stdin, stdout and stderr when not on a TTY.
	Stdio [3]*os.File

	// NetNS, when set, is a network namespace made by the host (proxy
	// mode); the sandbox joins it instead of getting an empty one.
	NetNS *os.File

	// AgentSocket, when set, makes a long-lived sandbox: no command runs;
	// the agent serves on a unix socket bound at this host path, and the
	// sandbox outlives the process that created it.
	AgentSocket string
	// Restore, when set, makes the long-lived sandbox from a checkpoint
	// (Checkpointer) instead of starting it afresh: its memory, processes
	// and /tmp and home as they were. Trees and Workspace must hold the
	// files the checkpoint was taken with.
	Restore *Restore
	// DieWithCreator makes a long-lived sandbox die with the process that
	// made it (no daemon will adopt it).
	DieWithCreator bool
	// NProc caps each user's processes inside (RLIMIT_NPROC).
	NProc uint64
	// CommandMemoryBytes and CommandPids, for a long-lived sandbox, are
	// the limits of its commands together, below the sandbox's: a command
	// that meets them is stopped (the kernel's OOM kill, refused forks)
	// and the sandbox, its files and its agent live on. Zero: the
	// commands share the sandbox's limits, and an OOM ends the sandbox.
	CommandMemoryBytes int64
	CommandPids        int64

	MemoryBytes int64
	CPUs        float64
	Pids        int64
	DiskBytes   int64
	NoFile      uint64
	// Landlock is off only when the caller opted out of a missing one.
	Landlock bool
	// BeforeStart, when set, is called once by Create (on a goroutine of
	// its own, perhaps) before anything of the sandbox's command or agent
	// runs; a wall may go on preparing the sandbox meanwhile, and Create
	// returns only once it has returned. Its error fails Create, and
	// nothing of the sandbox is left.
	BeforeStart func() error
}

// Restore names a checkpoint directory (Checkpointer.Checkpoint's dir).
type Restore struct {
	Dir string
}

// Checkpointer is a Sandbox whose memory can be saved to disk and
// restored (Options.Restore): the gVisor wall's.
type Checkpointer interface {
	// Checkpoint saves the running sandbox into dir, calls files while it
	// is paused (for the caller to save its root and workspace layers
	// with it), and lets it run on, its agent listening again at
	// agentSocket.
	Checkpoint(dir, agentSocket string, files func() error) error
}

// Sandbox is one live sandbox of a wall.
type Sandbox interface {
	ID() string
	// InitPid is the sandbox's first process, as the host sees it.
	InitPid() int
	// Wait blocks until a one-shot sandbox's command exits (or the
	// sandbox dies) and says how.
	Wait() Exit
	// Signal forwards sig to a one-shot sandbox's command.
	Signal(sig unix.Signal) error
	// Kill ends every process of the sandbox at once.
	Kill()
	// Done is closed when the sandbox's first process has exited (a
	// one-shot sandbox's: once it is destroyed).
	Done() <-chan struct{}
	Freeze() error
	Thaw() error
	Frozen() bool
	Stats() Stats
	// LimitEvents are Stats' OOMKills and PidsLimited alone, at a
	// fraction of its cost (an exec reads them twice).
	LimitEvents() (oomKills, pidsLimited int64)
	// CPUTime is Stats' CPUTime alone, at a fraction of its cost.
	CPUTime() time.Duration
	MemoryCurrent() int64
	// Layers are descriptors on what the sandbox wrote, for the host to
	// read (diffs, archives, snapshots); they outlive the sandbox until
	// CloseFiles.
	Layers() Layers
	// UIDBase is the host uid root inside the sandbox maps to.
	UIDBase() (uint32, error)
	// Destroy kills what is left, waits for it, and removes every host
	// resource the sandbox held except its Layers.
	Destroy() error
	// CloseFiles closes the Layers.
	CloseFiles()
}

// Layers are O_PATH directory descriptors on a sandbox's writable layers
// (any may be nil), and a one-shot sandbox's terminal.
type Layers struct {
	WorkspaceUpper *os.File // what the sandbox wrote to /workspace
	Workspace      *os.File // /workspace as the sandbox sees it
	RootUpper      *os.File // what it wrote over its image (long-lived)
	PTY            *os.File // the terminal's host side (-t)
}

// Exit is how a one-shot sandbox's command ended.
type Exit struct {
	Code   int
	Signal int
	// Error is set when the command could not start (Code 126 or 127).
	Error string
	// OOM is set when the kernel's OOM killer fired in the sandbox
	// (which ends a one-shot sandbox).
	OOM bool
	// InitDied is set when the sandbox died without reporting (killed).
	InitDied bool
}

// Stats is the kernel's accounting for one sandbox.
type Stats struct {
	CPUTime     time.Duration
	MemoryPeak  int64
	OOMKills    int64
	PidsLimited int64 // forks refused by the pids limit
}

// OpenPidfd opens a pidfd of process pid for WaitPidfd: f is in the
// runtime's poller; fd is its number, for pidfd_send_signal, valid until f
// is closed.
func OpenPidfd(pid int) (f *os.File, fd int, err error) {
	fd, err = unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, -1, err
	}
	return os.NewFile(uintptr(fd), "pidfd"), fd, nil
}

// WaitPidfd returns once the process of pidfd f (OpenPidfd's) has exited,
// or f is closed. It waits in the runtime's poller, as a socket read does,
// so that the thousand sandboxes a daemon waits for hold no thread each (a
// blocking wait costs a host task and a thread's stacks per sandbox).
func WaitPidfd(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return // closed
	}
	// Readable once the process has exited.
	err = rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		return n > 0 || err != nil && err != unix.EINTR
	})
	if err != nil && !errors.Is(err, os.ErrClosed) { // not in the poller: wait in a thread
		_ = rc.Control(func(fd uintptr) {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			for {
				if _, err := unix.Poll(pfd, -1); err != unix.EINTR {
					return
				}
			}
		})
	}
}
