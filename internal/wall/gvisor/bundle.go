package gvisor

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/wall"
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
	Namespaces []ociNamespace `json:"namespaces"`
}

type ociNamespace struct {
	Type string `json:"type"`
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
}

// capNames are the names the OCI spec gives the capabilities a root
// command may keep (wall.Options.KeepCaps).
var capNames = map[int]string{
	unix.CAP_CHOWN: "CAP_CHOWN", unix.CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE", unix.CAP_FOWNER: "CAP_FOWNER",
	unix.CAP_FSETID: "CAP_FSETID", unix.CAP_KILL: "CAP_KILL", unix.CAP_SETGID: "CAP_SETGID", unix.CAP_SETUID: "CAP_SETUID",
	unix.CAP_SETFCAP: "CAP_SETFCAP", unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE", unix.CAP_SYS_CHROOT: "CAP_SYS_CHROOT",
	unix.CAP_AUDIT_WRITE: "CAP_AUDIT_WRITE",
}

// bundleSpec is the OCI spec of a one-shot sandbox o, whose directories
// are l's. It is pure: what it refuses, it refuses before anything is made.
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
		Linux: ociLinux{Namespaces: []ociNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}}},
	}
	if o.Cwd == "" {
		s.Process.Cwd = "/workspace"
	}
	if o.Root {
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
	if o.NoFile > 0 {
		s.Process.Rlimits = append(s.Process.Rlimits, ociRlimit{Type: "RLIMIT_NOFILE", Hard: o.NoFile, Soft: o.NoFile})
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

// supported refuses what this wall does not do yet, by name.
func supported(o *wall.Options) error {
	no := func(what string) error {
		return fmt.Errorf("--isolation gvisor does not support %s yet", what)
	}
	switch {
	case o.AgentSocket != "":
		return no("long-lived sandboxes (airlock create, serve, mcp)")
	case o.TTY:
		return no("a terminal (-t)")
	case o.NetNS != nil:
		return no("network access (--allow, --policy, grants)")
	case len(o.Argv) == 0:
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
	for _, t := range o.Trees {
		if t.Target != "/" {
			out = append(out, strings.TrimPrefix(filepath.Clean(t.Target), "/"))
		}
	}
	return out
}
