// Package doctor checks, on this host and for real where it can, every
// control airlock relies on (`airlock doctor`): what the container wall
// needs, and what only some sandboxes need (nftables for proxy mode, runsc
// for the gvisor wall); and reads the per-host limits that bound how many
// sandboxes the host holds (Limits).
package doctor

import (
	"fmt"
	"os"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/linux/cgroup"
	"github.com/airlock-sandbox/airlock/internal/linux/landlock"
	"github.com/airlock-sandbox/airlock/internal/linux/seccomp/filter"
	"github.com/airlock-sandbox/airlock/internal/wall/container"
	"github.com/airlock-sandbox/airlock/internal/wall/gvisor"
	"github.com/airlock-sandbox/airlock/internal/wall/initexe"
)

// Check is one host prerequisite as `airlock doctor` reports it.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Required checks block sandbox creation when they fail.
	Required bool `json:"required"`
	// Without says what airlock does when the check fails.
	Without string `json:"without"`
}

const refuse = "airlock run refuses to create sandboxes"

// Checks checks every control airlock relies on, on this host, for real
// where it can (it creates a user namespace and an idmapped mount), the
// airlock-init at init (initexe.Default when "") both walls run, and the
// runsc at runsc (gvisor.DefaultRunsc when "") the gvisor wall runs.
func Checks(stateDir, runsc, init string) []Check {
	var out []Check
	// need is a control airlock refuses to run without; note is not.
	add := func(required bool, name string, ok bool, detail, without string) {
		out = append(out, Check{Name: name, OK: ok, Detail: detail, Without: without, Required: required})
	}
	need := func(name string, ok bool, detail, without string) { add(true, name, ok, detail, without) }
	note := func(name string, ok bool, detail, without string) { add(false, name, ok, detail, without) }
	var u unix.Utsname
	_ = unix.Uname(&u)
	note("kernel", true, unix.ByteSliceToString(u.Release[:])+" "+unix.ByteSliceToString(u.Machine[:]), "")
	if m := unix.ByteSliceToString(u.Machine[:]); m != "x86_64" {
		need("architecture", false, m, refuse+" (the seccomp filter is built for x86_64)")
	}
	need("root", os.Geteuid() == 0, fmt.Sprintf("euid %d", os.Geteuid()), "airlock needs root (sudo) to create namespaces, cgroups and mounts")

	ini := initexe.New(init, "") // asked for real, every time
	bin, initErr := ini.Open()
	if initErr != nil {
		need("airlock-init", false, initErr.Error(), refuse+" (every sandbox runs it: its init and agent)")
	} else {
		need("airlock-init", true, fmt.Sprintf("%s at %s", bin.Version, bin.Path), refuse)
	}

	var missing []string
	for _, ns := range []string{"user", "pid", "mnt", "uts", "ipc", "net", "cgroup"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			missing = append(missing, ns)
		}
	}
	maxUserNS := strings.TrimSpace(readFile("/proc/sys/user/max_user_namespaces"))
	nsOK := len(missing) == 0 && maxUserNS != "0"
	detail := "user, pid, mount, uts, ipc, net, cgroup; max_user_namespaces=" + maxUserNS
	if len(missing) > 0 {
		detail = "missing: " + strings.Join(missing, ", ")
	}
	need("namespaces", nsOK, detail, refuse)

	idOK, idDetail := true, "open_tree + mount_setattr(MOUNT_ATTR_IDMAP) on the host's /usr"
	if os.Geteuid() == 0 {
		if err := container.ProbeIdmap("/usr"); err != nil {
			idOK, idDetail = false, err.Error()
		}
	} else {
		idOK, idDetail = false, "not checked: needs root"
	}
	need("idmapped mounts", idOK, idDetail, refuse+" (image ownership is shifted with them, never by chown)")

	fs := readFile("/proc/filesystems")
	need("overlayfs", strings.Contains(fs, "\toverlay\n"), "copy-on-write workspace and --writable-rootfs", refuse+" with --workspace, --repo or --writable-rootfs")

	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &how)
	if err == nil {
		unix.Close(fd)
	}
	need("openat2", err == nil, "RESOLVE_IN_ROOT for reading what sandboxes wrote", refuse+" (no safe way to read a sandbox's files)")

	if h, err := cgroup.Detect(); err != nil {
		need("cgroups", false, err.Error(), refuse+" (no memory, CPU or pids limits without them)")
	} else if h.Version == cgroup.V2 {
		need("cgroups", true, "v2 at "+h.V2Root+" with memory, cpu, pids", refuse)
	} else {
		need("cgroups", true, "v1 hierarchies memory, cpu, cpuacct, pids, freezer (v2 has no controllers here); airlock kills a one-shot sandbox on OOM itself", refuse)
	}

	need("seccomp", filter.Supported(), "Docker's default profile plus airlock's denials, x86_64 only", refuse)
	llOK, llDetail := true, fmt.Sprintf("ABI %d (need %d)", landlock.ABI(), landlock.MinABI)
	for _, m := range container.Missing() {
		if m.Control == "landlock" {
			llOK, llDetail = false, m.Detail
		}
	}
	need("landlock", llOK, llDetail, refuse+" unless --allow-degraded landlock (then writes are confined by read-only mounts only, and it is said)")

	nftOK, nftDetail := true, "nf_tables answers over netlink: proxy mode (--allow) fences a sandbox's network namespace with it"
	if conn, err := nftables.New(); err != nil {
		nftOK, nftDetail = false, err.Error()
	} else if _, err := conn.ListTables(); err != nil {
		nftOK, nftDetail = false, "list tables: "+err.Error()
	}
	note("nftables", nftOK, nftDetail, "network policies (--allow) will be refused")

	if runsc == "" {
		runsc = gvisor.DefaultRunsc
	}
	rs := gvisor.Check(runsc)
	note("gvisor", rs.Err == nil, rs.Describe(), "--isolation gvisor is refused (never run on the container wall instead); the container wall works")

	mfd, err := unix.MemfdCreate("probe", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err == nil {
		unix.Close(mfd)
	}
	need("memfd", err == nil, "sealed in-memory copy of airlock-init for the sandbox's init", refuse)
	return out
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
