package gvisor

import (
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/confined/nsinit"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/wall/initexe"
	"golang.org/x/sys/unix"
)

// The OCI runtime spec, as much of it as a bundle for runsc needs (the
// field names are the spec's; runsc rejects none of what is left out).
type ociSpec struct {
	Version  string     `json:"ociVersion"`
	Process  ociProcess `json:"process"`
	Root     ociRoot    `json:"root"`
	Hostname string     `json:"hostname"`
	Mounts   []ociMount `json:"mounts"`
	Linux    ociLinux   `json:"linux"`
}

type ociProcess struct {
	Terminal        bool        `json:"terminal"`
	User            ociUser     `json:"user"`
	Args            []string    `json:"args"`
	Env             []string    `json:"env"`
	Cwd             string      `json:"cwd"`
	Capabilities    *ociCaps    `json:"capabilities,omitempty"`
	Rlimits         []ociRlimit `json:"rlimits,omitempty"`
	NoNewPrivileges bool        `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCaps struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Permitted   []string `json:"permitted"`
	Inheritable []string `json:"inheritable"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNamespace    `json:"namespaces"`
	UIDMappings []ociIDMap        `json:"uidMappings,omitempty"`
	GIDMappings []ociIDMap        `json:"gidMappings,omitempty"`
	Sysctl      map[string]string `json:"sysctl,omitempty"`
}

type ociIDMap struct {
	ContainerID uint32 `json:"containerID"`
	HostID      uint32 `json:"hostID"`
	Size        uint32 `json:"size"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

// layout is where on the host a sandbox's bundle takes its directories
// from: the root runsc is given, and the sources of its bind mounts (the
// host's merged overlays, or an image's read-only trees as they are).
type layout struct {
	Root      string   // the root's directory
	Trees     []string // a source per Options.Trees entry other than "/"
	TreesRW   bool     // the trees are writable overlays (--writable-rootfs)
	Workspace string   // /workspace (merged, or an empty directory)
	Tmp, Home string
	NetNS     string // the host-made network namespace (Options.NetNS), "" for none
	// The sandbox's leased host ids: the user namespace runsc starts the
	// Sentry and the gofer in maps 0..IDs.Size-1 to them.
	IDs idRange
	// The directory holding the binary gvisor-init runs from
	// (read-only), when it runs (runsInit); and a long-lived sandbox's
	// host directory the agent binds its socket in.
	Bin, Agent string
}

// idRange is a sandbox's leased host uid/gid range (uidlease.Range's ids).
type idRange struct{ Base, Size uint32 }

// host is the host id of id inside, and whether the range has it.
func (r idRange) host(id uint32) (uint32, bool) {
	if id >= r.Size {
		return 0, false
	}
	return r.Base + id, true
}

// Where gvisor-init (a long-lived sandbox's, or a one-shot terminal's)
// and the agent's socket are, inside.
const (
	binDir       = "/.airlock/bin"
	agentDir     = "/.airlock/agent"
	agentSockIn  = agentDir + "/agent.sock"
	initExe      = binDir + "/" + initexe.Name
	initArgv1    = "gvisor-init"
	agentSockOut = "agent.sock" // its name in the host's agent directory
)

// capNames are the names the OCI spec gives the capabilities a root
// command may keep (wall.Options.KeepCaps).
var capNames = map[int]string{
	unix.CAP_CHOWN: "CAP_CHOWN", unix.CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE", unix.CAP_FOWNER: "CAP_FOWNER",
	unix.CAP_FSETID: "CAP_FSETID", unix.CAP_KILL: "CAP_KILL", unix.CAP_SETGID: "CAP_SETGID", unix.CAP_SETUID: "CAP_SETUID",
	unix.CAP_SETFCAP: "CAP_SETFCAP", unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE", unix.CAP_SYS_CHROOT: "CAP_SYS_CHROOT",
	unix.CAP_AUDIT_WRITE: "CAP_AUDIT_WRITE",
}

// bundleSpec is the OCI spec of sandbox o, whose directories are l's: a
// one-shot sandbox's command (on a terminal (-t): gvisor-init, as the
// command's user, starting it on a terminal of the Sentry's), or a
// long-lived sandbox's gvisor-init as root with the capabilities a root
// command keeps (it starts each command as its user). It is pure: what it
// refuses, it refuses before anything is made.
func bundleSpec(o *wall.Options, l layout) (*ociSpec, error) {
	if err := supported(o); err != nil {
		return nil, err
	}
	s := &ociSpec{
		Version:  "1.0.2",
		Hostname: o.Hostname,
		Root:     ociRoot{Path: l.Root, Readonly: !o.Writable},
		Process: ociProcess{
			User: ociUser{UID: wall.SandboxUID, GID: wall.SandboxUID},
			Args: o.Argv, Env: o.Env, Cwd: o.Cwd,
			NoNewPrivileges: true,
			// Every command starts with no capabilities unless it runs as
			// root, which keeps o.KeepCaps.
			Capabilities: &ociCaps{Bounding: []string{}, Effective: []string{}, Permitted: []string{}, Inheritable: []string{}},
		},
		// gVisor's own kernel provides /proc, /sys and /dev; none of them
		// is the host's.
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "mode=755", "size=64k"}},
			// Writable by every user, as on the container wall; the Sentry's
			// memory, capped like the disk.
			{Destination: "/dev/shm", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "mode=1777", fmt.Sprintf("size=%d", o.DiskBytes)}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"ro", "nosuid", "nodev", "noexec"}},
		},
		// A network namespace of its own: empty (--network=none), or
		// the host-made one whose veth gVisor's netstack takes over
		// (--network=sandbox: runsc copies its address and routes into
		// the Sentry and takes the address off the host's view). runsc
		// reads this sysctl alone, to leave IPv6 out of the netstack.
		// A user namespace mapped to the sandbox's leased host ids: runsc
		// starts the Sentry and the gofer in it as its root, so that on
		// the host they are that range's first uid, never root, and their
		// capabilities are the namespace's, over the sandbox's own files
		// only (the host shows the sandbox its files through idmapped
		// mounts into the same range, as the container wall does).
		Linux: ociLinux{
			Namespaces:  []ociNamespace{{Type: "pid"}, {Type: "network", Path: l.NetNS}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "user"}},
			UIDMappings: []ociIDMap{{ContainerID: 0, HostID: l.IDs.Base, Size: l.IDs.Size}},
			GIDMappings: []ociIDMap{{ContainerID: 0, HostID: l.IDs.Base, Size: l.IDs.Size}},
			Sysctl:      map[string]string{"net.ipv6.conf.all.disable_ipv6": "1"},
		},
	}
	if l.IDs.Base == 0 || l.IDs.Size <= wall.SandboxUID {
		return nil, fmt.Errorf("gvisor wall: host id range %d+%d", l.IDs.Base, l.IDs.Size)
	}
	if (o.NetNS != nil) != (l.NetNS != "") {
		return nil, fmt.Errorf("gvisor wall: network namespace %q for a sandbox with network %v", l.NetNS, o.NetNS != nil)
	}
	if o.Cwd == "" {
		s.Process.Cwd = "/workspace"
	}
	if o.Root || o.AgentSocket != "" {
		s.Process.User = ociUser{}
		for _, c := range o.KeepCaps {
			n, ok := capNames[c]
			if !ok {
				return nil, fmt.Errorf("gvisor wall: capability %d has no name here", c)
			}
			cs := s.Process.Capabilities
			cs.Bounding, cs.Effective, cs.Permitted = append(cs.Bounding, n), append(cs.Effective, n), append(cs.Permitted, n)
		}
	}
	if runsInit(o) {
		s.Mounts = append(s.Mounts, ociMount{Destination: binDir, Type: "bind", Source: l.Bin, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if o.AgentSocket != "" {
		if err := agentProcess(o, s); err != nil {
			return nil, err
		}
		s.Mounts = append(s.Mounts, ociMount{Destination: agentDir, Type: "bind", Source: l.Agent, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}})
	}
	if o.TTY {
		if err := terminalProcess(s); err != nil {
			return nil, err
		}
	}
	if o.NoFile > 0 {
		s.Process.Rlimits = append(s.Process.Rlimits, ociRlimit{Type: "RLIMIT_NOFILE", Hard: o.NoFile, Soft: o.NoFile})
	}
	if n := sandboxNProc(o); n > 0 {
		s.Process.Rlimits = append(s.Process.Rlimits, ociRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
	}
	trees := l.Trees
	for _, t := range o.Trees {
		if t.Target == "/" {
			continue
		}
		if !cleanTarget(t.Target) {
			return nil, fmt.Errorf("gvisor wall: tree target %q", t.Target)
		}
		if len(trees) == 0 {
			return nil, fmt.Errorf("gvisor wall: no source for tree %s", t.Target)
		}
		opts := []string{"rbind", "ro", "nosuid", "nodev"}
		if l.TreesRW {
			opts[1] = "rw"
		}
		s.Mounts = append(s.Mounts, ociMount{Destination: t.Target, Type: "bind", Source: trees[0], Options: opts})
		trees = trees[1:]
	}
	rw := []string{"rbind", "rw", "nosuid", "nodev"}
	s.Mounts = append(s.Mounts,
		ociMount{Destination: "/workspace", Type: "bind", Source: l.Workspace, Options: rw},
		ociMount{Destination: "/tmp", Type: "bind", Source: l.Tmp, Options: rw},
		ociMount{Destination: o.Home, Type: "bind", Source: l.Home, Options: rw},
	)
	return s, nil
}

// agentProcess makes s's process a long-lived sandbox's gvisor-init
// (internal/confined/nsinit), which serves the agent at agentSockIn.
func agentProcess(o *wall.Options, s *ociSpec) error {
	uid := uint32(wall.SandboxUID)
	if o.Root {
		uid = 0
	}
	cfg, err := json.Marshal(nsinit.GVisorConfig{
		Socket: agentSockIn, UID: uid, GID: uid, Home: o.Home, Cwd: s.Process.Cwd, Protocol: nsinit.ProtocolVersion,
	})
	if err != nil {
		return err
	}
	s.Process.Args = []string{initExe, initArgv1, string(cfg)}
	return nil
}

// terminalProcess makes s's process gvisor-init starting s's command on
// a terminal of the Sentry's devpts (internal/confined/nsinit), as the
// command's user: runsc gives init the host's terminal (the console, whose
// master the host relays), which the Sentry shows as a host file, not as
// /dev/pts/N, so that init relays between the two.
func terminalProcess(s *ociSpec) error {
	cfg, err := json.Marshal(nsinit.GVisorConfig{Command: s.Process.Args, Protocol: nsinit.ProtocolVersion})
	if err != nil {
		return err
	}
	s.Process.Terminal = true
	s.Process.Args = []string{initExe, initArgv1, string(cfg)}
	return nil
}

// runsInit reports whether sandbox o's first process is gvisor-init: a
// long-lived sandbox's, or a one-shot terminal's.
func runsInit(o *wall.Options) bool { return o.AgentSocket != "" || o.TTY }

// The pids limit on the gVisor wall. The host's cgroup counts runsc's,
// the gofer's and the Sentry's host tasks, not the sandbox's processes:
// about 40 idle and two more per task inside (systrap's stub process and
// thread), and a host fork refused to the Sentry ends the whole sandbox.
// So --pids is kept inside, by the Sentry: RLIMIT_NPROC, which gVisor
// enforces per user (a fork past it gets EAGAIN, as on the container
// wall), and the host's cap is set far enough above it (hostPids) never
// to be met first; it still bounds the host tasks a sandbox may take.
const (
	hostTasksIdle    = 64 // runsc, the gofer, the Sentry's own threads, with room
	hostTasksPerTask = 2
)

// sandboxNProc is the RLIMIT_NPROC inside the Sentry: the wall's
// (o.NProc, a long-lived sandbox's, which leaves its init room), else the
// pids limit itself.
func sandboxNProc(o *wall.Options) uint64 {
	if o.NProc > 0 {
		return o.NProc
	}
	if o.Pids > 0 {
		return uint64(o.Pids)
	}
	return 0
}

// hostPids is the host cgroup's pids.max for a pids limit of pids (0: none).
func hostPids(pids int64) int64 {
	if pids <= 0 {
		return 0
	}
	return hostTasksIdle + hostTasksPerTask*pids
}

// supported refuses what this wall does not do, by name.
func supported(o *wall.Options) error {
	switch {
	case o.TTY && o.AgentSocket != "":
		return fmt.Errorf("gvisor wall: a long-lived sandbox has no terminal of its own")
	case o.Restore != nil && o.AgentSocket == "":
		return fmt.Errorf("gvisor wall: only a long-lived sandbox is restored from a checkpoint")
	case o.AgentSocket != "" && len(o.Argv) > 0:
		return fmt.Errorf("gvisor wall: a long-lived sandbox runs no command")
	case o.AgentSocket == "" && len(o.Argv) == 0:
		return fmt.Errorf("gvisor wall: no command")
	case !cleanTarget(o.Home):
		return fmt.Errorf("gvisor wall: home %q", o.Home)
	}
	return nil
}

// cleanTarget reports whether p is an absolute, clean path below /.
func cleanTarget(p string) bool {
	return p != "/" && path.IsAbs(p) && path.Clean(p) == p
}

// mountPoints are the directories the generated layer holds for the
// bundle's mounts (relative to the root).
func mountPoints(o *wall.Options) []string {
	out := []string{"proc", "sys", "dev", "tmp", "workspace", "etc", strings.TrimPrefix(o.Home, "/")}
	if runsInit(o) {
		out = append(out, strings.TrimPrefix(binDir, "/"))
	}
	if o.AgentSocket != "" {
		out = append(out, strings.TrimPrefix(agentDir, "/"))
	}
	for _, t := range o.Trees {
		if t.Target != "/" {
			out = append(out, strings.TrimPrefix(filepath.Clean(t.Target), "/"))
		}
	}
	return out
}
