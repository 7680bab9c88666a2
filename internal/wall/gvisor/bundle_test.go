package gvisor

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/confined/nsinit"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"golang.org/x/sys/unix"
)

func hostImage() *wall.Options {
	return &wall.Options{
		Trees: []wall.Tree{{HostPath: "/usr", Target: "/usr"}, {HostPath: "/var/lib/airlock/hostetc", Target: "/etc"}},
		Argv:  []string{"uname", "-a"}, Env: []string{"PATH=/usr/bin"}, Cwd: "/workspace", Hostname: "airlock-x",
		Home: "/home/user", NoFile: 1024, DiskBytes: 1 << 30,
	}
}

func testLayout() layout {
	return layout{Root: "/s/gen", Trees: []string{"/usr", "/var/lib/airlock/hostetc"}, Workspace: "/s/ws/merged", Tmp: "/s/tmp", Home: "/s/home", IDs: testIDs}
}

func mountAt(s *ociSpec, dst string) *ociMount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dst {
			return &s.Mounts[i]
		}
	}
	return nil
}

func TestBundleShowsTreesReadOnlyAndWritablePlacesFromTheHost(t *testing.T) {
	s, err := bundleSpec(hostImage(), testLayout())
	if err != nil {
		t.Fatal(err)
	}
	if !s.Root.Readonly || s.Root.Path != "/s/gen" {
		t.Errorf("root %+v: want the generated layer, read-only", s.Root)
	}
	for dst, src := range map[string]string{"/usr": "/usr", "/etc": "/var/lib/airlock/hostetc"} {
		m := mountAt(s, dst)
		if m == nil || m.Type != "bind" || m.Source != src || !slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "rw") {
			t.Errorf("%s: %+v, want a read-only bind of %s", dst, m, src)
		}
	}
	for dst, src := range map[string]string{"/workspace": "/s/ws/merged", "/tmp": "/s/tmp", "/home/user": "/s/home"} {
		m := mountAt(s, dst)
		if m == nil || m.Source != src || !slices.Contains(m.Options, "rw") {
			t.Errorf("%s: %+v, want a writable bind of %s", dst, m, src)
		}
	}
	// gVisor's own /proc, /sys, /dev and /dev/shm, never a bind of the host's.
	for _, dst := range []string{"/proc", "/sys", "/dev", "/dev/shm"} {
		if m := mountAt(s, dst); m == nil || m.Type == "bind" {
			t.Errorf("%s: %+v", dst, m)
		}
	}
}

func TestBundleUserHasNoCapabilitiesAndRootKeepsOnlyItsSet(t *testing.T) {
	o := hostImage()
	s, err := bundleSpec(o, testLayout())
	if err != nil {
		t.Fatal(err)
	}
	c := s.Process.Capabilities
	if s.Process.User.UID != wall.SandboxUID || len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable) != 0 || !s.Process.NoNewPrivileges {
		t.Errorf("user process: %+v caps %+v", s.Process.User, c)
	}
	o.Root, o.KeepCaps = true, []int{unix.CAP_CHOWN, unix.CAP_KILL}
	if s, err = bundleSpec(o, testLayout()); err != nil {
		t.Fatal(err)
	}
	c = s.Process.Capabilities
	if s.Process.User.UID != 0 || !slices.Equal(c.Bounding, []string{"CAP_CHOWN", "CAP_KILL"}) || len(c.Inheritable) != 0 {
		t.Errorf("root process: %+v caps %+v", s.Process.User, c)
	}
	o.KeepCaps = []int{unix.CAP_SYS_ADMIN}
	if _, err := bundleSpec(o, testLayout()); err == nil {
		t.Error("a capability outside the table was given")
	}
}

func TestBundleWritableRootfsMakesTreesWritable(t *testing.T) {
	o := hostImage()
	o.Writable = true
	l := testLayout()
	l.TreesRW, l.Trees = true, []string{"/s/sub/0/merged", "/s/sub/1/merged"}
	s, err := bundleSpec(o, l)
	if err != nil {
		t.Fatal(err)
	}
	if s.Root.Readonly {
		t.Error("root read-only with --writable-rootfs")
	}
	if m := mountAt(s, "/usr"); m == nil || m.Source != "/s/sub/0/merged" || !slices.Contains(m.Options, "rw") {
		t.Errorf("/usr: %+v", m)
	}
}

// A one-shot terminal's first process is gvisor-init, as the command's
// user with its capabilities, from the read-only binary directory, told
// the command and nothing of an agent's (no socket, no directory for one).
func TestBundleTerminalRunsTheCommandUnderInitOnTheConsole(t *testing.T) {
	o := hostImage()
	o.TTY = true
	l := testLayout()
	l.Bin = "/s/bin"
	s, err := bundleSpec(o, l)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Process.Terminal || len(s.Process.Args) != 3 || s.Process.Args[0] != initExe || s.Process.Args[1] != initArgv1 {
		t.Fatalf("process %+v: want gvisor-init on the console", s.Process)
	}
	var cfg nsinit.GVisorConfig
	if err := json.Unmarshal([]byte(s.Process.Args[2]), &cfg); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Command, o.Argv) || cfg.Socket != "" || cfg.Protocol != nsinit.ProtocolVersion {
		t.Errorf("init's config %+v: want the command %v alone", cfg, o.Argv)
	}
	if s.Process.User.UID != wall.SandboxUID || len(s.Process.Capabilities.Bounding) != 0 {
		t.Errorf("init runs as %+v with %+v: want the command's user and capabilities", s.Process.User, s.Process.Capabilities)
	}
	if m := mountAt(s, binDir); m == nil || m.Source != "/s/bin" || !slices.Contains(m.Options, "ro") {
		t.Errorf("%s: %+v, want the binary's directory read-only", binDir, m)
	}
	if m := mountAt(s, agentDir); m != nil {
		t.Errorf("%s: %+v, want no agent's directory", agentDir, m)
	}
	if !slices.Contains(mountPoints(o), strings.TrimPrefix(binDir, "/")) || slices.Contains(mountPoints(o), strings.TrimPrefix(agentDir, "/")) {
		t.Errorf("mount points %v", mountPoints(o))
	}
	o.AgentSocket, o.Argv = "/run/airlock/agents/x.sock", nil
	if _, err := bundleSpec(o, l); err == nil {
		t.Error("a long-lived sandbox with a terminal was accepted")
	}
}

func TestBundleRefusesWhatTheWallDoesNotDo(t *testing.T) {
	o := hostImage()
	o.AgentSocket = "/run/airlock/agents/x.sock"
	if _, err := bundleSpec(o, testLayout()); err == nil {
		t.Error("a long-lived sandbox with a command was accepted")
	}
	o = hostImage()
	o.Trees = append(o.Trees, wall.Tree{HostPath: "/x", Target: "/a/../../b"})
	if _, err := bundleSpec(o, layout{Trees: []string{"/usr", "/etc", "/x"}, IDs: testIDs}); err == nil {
		t.Error("an unclean tree target was accepted")
	}
}

var testIDs = idRange{Base: 1<<30 + 3*65536, Size: 65536}

// runsc starts the Sentry and the gofer in the bundle's user namespace as
// its root: the namespace maps the sandbox's leased ids, never the host's
// root, and a bundle without a range is refused.
func TestBundleMapsTheSandboxsLeasedIDs(t *testing.T) {
	s, err := bundleSpec(hostImage(), testLayout())
	if err != nil {
		t.Fatal(err)
	}
	user := false
	for _, n := range s.Linux.Namespaces {
		user = user || n.Type == "user" && n.Path == ""
	}
	want := []ociIDMap{{ContainerID: 0, HostID: testIDs.Base, Size: testIDs.Size}}
	if !user || !slices.Equal(s.Linux.UIDMappings, want) || !slices.Equal(s.Linux.GIDMappings, want) {
		t.Errorf("namespaces %+v, uid map %+v, gid map %+v: want a new user namespace mapping %+v", s.Linux.Namespaces, s.Linux.UIDMappings, s.Linux.GIDMappings, want)
	}
	for _, ids := range []idRange{{}, {Base: 0, Size: 65536}, {Base: testIDs.Base, Size: wall.SandboxUID}} {
		l := testLayout()
		l.IDs = ids
		if _, err := bundleSpec(hostImage(), l); err == nil {
			t.Errorf("ids %+v accepted", ids)
		}
	}
	if u, ok := testIDs.host(wall.SandboxUID); !ok || u != testIDs.Base+wall.SandboxUID {
		t.Errorf("the sandbox user is host %d %v", u, ok)
	}
	if _, ok := testIDs.host(testIDs.Size); ok {
		t.Error("an id past the range is the sandbox's")
	}
}

func networkNS(s *ociSpec) ociNamespace {
	for _, n := range s.Linux.Namespaces {
		if n.Type == "network" {
			return n
		}
	}
	return ociNamespace{}
}

func TestBundleJoinsTheHostMadeNetworkNamespaceWithIPv6Off(t *testing.T) {
	o := hostImage()
	s, err := bundleSpec(o, testLayout())
	if err != nil {
		t.Fatal(err)
	}
	if n := networkNS(s); n.Type != "network" || n.Path != "" || networkFlags(o)[0] != "--network=none" {
		t.Errorf("no network: %+v %s, want a new, empty namespace and --network=none", n, networkFlags(o))
	}
	ns, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	o.NetNS = ns
	if _, err := bundleSpec(o, testLayout()); err == nil {
		t.Error("a sandbox with a network got a namespace of its own")
	}
	l := testLayout()
	l.NetNS = netnsPath(o)
	if s, err = bundleSpec(o, l); err != nil {
		t.Fatal(err)
	}
	if n := networkNS(s); n.Path != l.NetNS || !strings.HasSuffix(n.Path, "/fd/"+strconv.Itoa(int(ns.Fd()))) || networkFlags(o)[0] != "--network=sandbox" {
		t.Errorf("proxy mode: %+v %s, want the host's namespace and --network=sandbox", n, networkFlags(o))
	}
	if s.Linux.Sysctl["net.ipv6.conf.all.disable_ipv6"] != "1" {
		t.Errorf("IPv6 left on: %v", s.Linux.Sysctl)
	}
}

// A long-lived sandbox's process is gvisor-init, as root with only the
// capabilities a root command keeps and no_new_privs, serving on the
// socket path inside the one agent directory; the binary is read-only and
// the agent directory is the only writable place it adds.
func TestBundleOfALongLivedSandboxRunsGVisorInit(t *testing.T) {
	o := hostImage()
	o.Argv = nil
	o.AgentSocket = "/run/airlock/agents/x.sock"
	o.KeepCaps = []int{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_KILL}
	o.NProc = 480
	l := testLayout()
	l.Bin, l.Agent = "/s/scratch/bin", "/s/agent"
	s, err := bundleSpec(o, l)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Process
	if len(p.Args) != 3 || p.Args[0] != initExe || p.Args[1] != initArgv1 || p.User.UID != 0 || !p.NoNewPrivileges {
		t.Fatalf("process %+v", p)
	}
	var cfg nsinit.GVisorConfig
	if err := json.Unmarshal([]byte(p.Args[2]), &cfg); err != nil || cfg.Socket != agentSockIn || cfg.UID != wall.SandboxUID || cfg.Protocol != nsinit.ProtocolVersion {
		t.Errorf("config %+v %v", cfg, err)
	}
	if want := []string{"CAP_SETUID", "CAP_SETGID", "CAP_KILL"}; !slices.Equal(p.Capabilities.Bounding, want) || !slices.Equal(p.Capabilities.Effective, want) || len(p.Capabilities.Inheritable) != 0 {
		t.Errorf("capabilities %+v", p.Capabilities)
	}
	if !slices.Contains(p.Rlimits, ociRlimit{Type: "RLIMIT_NPROC", Hard: 480, Soft: 480}) {
		t.Errorf("rlimits %+v", p.Rlimits)
	}
	if m := mountAt(s, binDir); m == nil || m.Source != l.Bin || !slices.Contains(m.Options, "ro") {
		t.Errorf("%s: %+v", binDir, m)
	}
	if m := mountAt(s, agentDir); m == nil || m.Source != l.Agent || !slices.Contains(m.Options, "noexec") {
		t.Errorf("%s: %+v", agentDir, m)
	}
	for _, d := range []string{".airlock/bin", ".airlock/agent"} {
		if !slices.Contains(mountPoints(o), d) {
			t.Errorf("no mount point %s", d)
		}
	}
	o.Root = true
	if s, _ = bundleSpec(o, l); json.Unmarshal([]byte(s.Process.Args[2]), &cfg) != nil || cfg.UID != 0 || cfg.Home != o.Home {
		t.Errorf("--user root: %+v", cfg)
	}
}

// The version the wall demands is the one the repository pins and
// scripts/runsc.sh builds.
func TestPinnedIsThirdPartyRunscsPin(t *testing.T) {
	b, err := os.ReadFile("../../../third_party/runsc/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require gvisor\.dev/gvisor (\S+)$`).FindSubmatch(b)
	if m == nil || string(m[1]) != Pinned {
		t.Fatalf("third_party/runsc/go.mod pins %q, the wall wants %s", m, Pinned)
	}
	sum, err := os.ReadFile("../../../third_party/runsc/go.sum")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sum), "gvisor.dev/gvisor "+Pinned+" h1:") {
		t.Error("third_party/runsc/go.sum records no hash of the pinned module")
	}
}

func TestCheckRefusesAMissingOrWrongRunsc(t *testing.T) {
	dir := t.TempDir()
	if r := Check(dir + "/runsc"); r.Err == nil || !strings.Contains(r.Err.Error(), "scripts/runsc.sh") {
		t.Errorf("missing: %v", r.Err)
	}
	fake := dir + "/fake"
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'runsc version v0.0.0-old'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if r := Check(fake); r.Err == nil || !strings.Contains(r.Err.Error(), `version "v0.0.0-old"`) {
			t.Errorf("wrong version: %v", r.Err)
		}
	}
	if err := os.Chmod(fake, 0o777); err != nil {
		t.Fatal(err)
	}
	if r := Check(fake); r.Err == nil || r.Version != "" {
		t.Errorf("writable by anyone: %+v", r)
	}
}

// --pids is kept by the Sentry (RLIMIT_NPROC, a fork past it gets EAGAIN),
// with the host's cap far enough above it for runsc's and the Sentry's own
// tasks (two a task inside) never to be met first.
func TestBundlePidsLimitIsTheSentrys(t *testing.T) {
	o := hostImage()
	o.Pids = 100
	s, err := bundleSpec(o, testLayout())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Rlimits, ociRlimit{Type: "RLIMIT_NPROC", Hard: 100, Soft: 100}) {
		t.Errorf("rlimits %+v, want RLIMIT_NPROC 100", s.Process.Rlimits)
	}
	if h := hostPids(o.Pids); h < 40+2*o.Pids {
		t.Errorf("host pids.max %d for --pids %d: below runsc's own tasks and two a task", h, o.Pids)
	}
	if hostPids(0) != 0 {
		t.Error("no pids limit must stay none on the host")
	}
}
