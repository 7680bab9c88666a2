package doctor

import (
	"bufio"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/wall/uidlease"
)

// What one idle container sandbox takes of each per-host limit, as
// BenchmarkDensity measured it with 1,000 of them on one daemon (README,
// Benchmarks): the kernel tasks of its airlock-init (one process, its Go
// runtime's threads), the descriptors the daemon holds for it, the host
// memory it costs (MemAvailable), and one of each namespace.
const (
	TasksPerSandbox     = 7
	DaemonFDsPerSandbox = 7
	MemoryPerSandbox    = 3.7 * (1 << 20)
)

// Limit is a per-host limit that bounds how many sandboxes one host can
// hold, as `airlock doctor` reports it.
type Limit struct {
	Name string `json:"name"`
	// Detail is the limit and what is in use of it now.
	Detail string `json:"detail"`
	// PerSandbox is what one idle sandbox takes of it.
	PerSandbox string `json:"per_sandbox"`
	// Sandboxes is how many more idle sandboxes it leaves room for; null
	// when idle sandboxes take none of it (only what they are asked to
	// do does).
	Sandboxes *int64 `json:"sandboxes"`
	// First marks the limit that binds first: the fewest Sandboxes of the
	// limits every sandbox takes from.
	First bool `json:"binds_first,omitempty"`
	// some: only some sandboxes take from it (proxy mode's subnets).
	some bool
}

// Readings are a host's per-host limits and what is in use of them.
type Readings struct {
	PidMax, ThreadsMax, Tasks int64 // kernel.pid_max, kernel.threads-max, tasks (threads) alive
	UIDSlots, UIDsLeased      int64 // uid ranges of the state directory
	Pool                      netip.Prefix
	Subnets, SubnetsLeased    int64 // the /30s of the subnet pool (proxy mode)
	// fs.inotify.max_user_instances and max_user_watches, and root's use
	// of them: every sandbox's user namespace is root's, so what a
	// sandbox's agent watches is charged to root as well.
	InotifyInstances, InotifyWatches         int64
	InotifyInstancesUsed, InotifyWatchesUsed int64
	NoFileSoft, NoFileHard                   int64 // RLIMIT_NOFILE
	MemAvailable                             int64 // bytes
	// Namespaces: /proc/sys/user/max_<kind>_namespaces (charged to root,
	// the owner of every sandbox's user namespace) and how many exist.
	Namespaces map[string][2]int64
}

// Limits reads this host's per-host limits for state directory stateDir
// (its uid ranges; the subnet leases under netsDir, from pool) and says how
// many idle container sandboxes each leaves room for.
func Limits(stateDir, netsDir string, pool netip.Prefix) []Limit {
	return read(stateDir, netsDir, pool).Limits()
}

// Limits are r's limits, each with how many more idle sandboxes it leaves
// room for at the per-sandbox costs above; the one with the fewest is
// marked First.
func (r Readings) Limits() []Limit {
	var out []Limit
	add := func(name, detail, per string, room int64, per1 float64) *Limit {
		l := Limit{Name: name, Detail: detail, PerSandbox: per}
		if per1 > 0 {
			n := int64(math.Floor(float64(max(room, 0)) / per1))
			l.Sandboxes = &n
		}
		out = append(out, l)
		return &out[len(out)-1]
	}
	pids := min(r.PidMax, r.ThreadsMax)
	add("pids", fmt.Sprintf("kernel.pid_max %d, kernel.threads-max %d, %d tasks alive", r.PidMax, r.ThreadsMax, r.Tasks),
		fmt.Sprintf("%d tasks (airlock-init's threads; more for what runs inside)", TasksPerSandbox), pids-r.Tasks, TasksPerSandbox)
	add("uid ranges", fmt.Sprintf("%d ranges of %d host ids, %d leased", r.UIDSlots, uidlease.Size, r.UIDsLeased),
		"1 range", r.UIDSlots-r.UIDsLeased, 1)
	add("subnets", fmt.Sprintf("%d /30s in %s, %d leased (proxy mode only: a veth pair and a /30 each)", r.Subnets, r.Pool, r.SubnetsLeased),
		"1 /30 and a veth pair in proxy mode; none without a network", r.Subnets-r.SubnetsLeased, 1).some = true
	add("inotify", fmt.Sprintf("fs.inotify.max_user_instances %d (root: %d in use), max_user_watches %d (root: %d in use); every sandbox's watches are charged to root",
		r.InotifyInstances, r.InotifyInstancesUsed, r.InotifyWatches, r.InotifyWatchesUsed),
		"none idle; a directory watch (filesystem WatchDir) takes an instance and a watch per directory", 0, 0)
	add("descriptors", fmt.Sprintf("RLIMIT_NOFILE %d soft, %d hard (airlock serve raises its soft limit to the hard one; the systemd unit sets 65536)", r.NoFileSoft, r.NoFileHard),
		fmt.Sprintf("%d in the daemon", DaemonFDsPerSandbox), r.NoFileHard, DaemonFDsPerSandbox)
	add("memory", fmt.Sprintf("%d MiB available", r.MemAvailable>>20),
		fmt.Sprintf("%.1f MiB idle (more for what runs inside, up to its memory limit)", MemoryPerSandbox/(1<<20)), r.MemAvailable, MemoryPerSandbox)
	if len(r.Namespaces) > 0 {
		kinds := []string{"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"}
		var parts []string
		room := int64(math.MaxInt64)
		for _, k := range kinds {
			v, ok := r.Namespaces[k]
			if !ok {
				continue
			}
			parts = append(parts, fmt.Sprintf("%s %d of %d", k, v[1], v[0]))
			room = min(room, v[0]-v[1])
		}
		add("namespaces", "in use of /proc/sys/user/max_*_namespaces (root's: every sandbox's are): "+strings.Join(parts, ", "),
			"1 of each kind", room, 1)
	}
	first := -1
	for i, l := range out {
		if l.Sandboxes != nil && !l.some && (first < 0 || *l.Sandboxes < *out[first].Sandboxes) {
			first = i
		}
	}
	if first >= 0 {
		out[first].First = true
	}
	return out
}

// read takes r's readings on this host.
func read(stateDir, netsDir string, pool netip.Prefix) Readings {
	r := Readings{
		PidMax: readInt("/proc/sys/kernel/pid_max"), ThreadsMax: readInt("/proc/sys/kernel/threads-max"),
		UIDSlots: uidlease.Slots, Pool: pool,
		InotifyInstances: readInt("/proc/sys/fs/inotify/max_user_instances"),
		InotifyWatches:   readInt("/proc/sys/fs/inotify/max_user_watches"),
		Namespaces:       map[string][2]int64{},
	}
	// The fourth field of loadavg is running/total kernel tasks.
	if f := strings.Fields(readFile("/proc/loadavg")); len(f) > 3 {
		if _, all, ok := strings.Cut(f[3], "/"); ok {
			r.Tasks, _ = strconv.ParseInt(all, 10, 64)
		}
	}
	if pool.IsValid() && pool.Addr().Is4() && pool.Bits() <= 30 {
		r.Subnets = 1 << (30 - pool.Bits())
	}
	locked := flocked()
	r.UIDsLeased = leased(filepath.Join(stateDir, uidlease.Dir), locked)
	r.SubnetsLeased = leased(netsDir, locked)
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		r.NoFileSoft, r.NoFileHard = int64(rl.Cur), int64(rl.Max)
	}
	r.MemAvailable = meminfo("MemAvailable") << 10
	seen := map[string]map[string]bool{}
	for _, k := range []string{"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"} {
		if m := readInt("/proc/sys/user/max_" + k + "_namespaces"); m > 0 {
			r.Namespaces[k] = [2]int64{m, 0}
			seen[k] = map[string]bool{}
		}
	}
	initNS, _ := os.Readlink("/proc/1/ns/user")
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		dir := "/proc/" + p.Name()
		for k := range seen {
			if l, err := os.Readlink(dir + "/ns/" + k); err == nil {
				seen[k][l] = true
			}
		}
		// root's inotify: root's own processes and every sandbox's (a
		// user namespace other than the host's).
		if ns, _ := os.Readlink(dir + "/ns/user"); ns == initNS && !euidRoot(dir) {
			continue
		}
		fds, _ := os.ReadDir(dir + "/fd")
		for _, fd := range fds {
			if l, _ := os.Readlink(dir + "/fd/" + fd.Name()); l == "anon_inode:inotify" {
				r.InotifyInstancesUsed++
				r.InotifyWatchesUsed += int64(strings.Count(readFile(dir+"/fdinfo/"+fd.Name()), "inotify wd:"))
			}
		}
	}
	for k, s := range seen {
		v := r.Namespaces[k]
		v[1] = int64(len(s))
		if k == "user" {
			v[1]-- // the host's own is not counted against anyone
		}
		r.Namespaces[k] = v
	}
	return r
}

// flocked is the files /proc/locks lists as flock-locked, as it names
// them: major:minor:inode.
func flocked() map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(readFile("/proc/locks"), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[1] == "FLOCK" {
			out[f[5]] = true
		}
	}
	return out
}

// leased counts the lease files in dir that someone holds a lock on.
func leased(dir string, locked map[string]bool) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		var st unix.Stat_t
		if !strings.HasSuffix(e.Name(), ".lock") || unix.Lstat(filepath.Join(dir, e.Name()), &st) != nil {
			continue
		}
		if locked[fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)] {
			n++
		}
	}
	return n
}

func euidRoot(dir string) bool {
	sc := bufio.NewScanner(strings.NewReader(readFile(dir + "/status")))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 2 && f[0] == "Uid:" {
			return f[2] == "0"
		}
	}
	return false
}

func readInt(p string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(readFile(p)), 10, 64)
	return n
}

func meminfo(key string) int64 {
	for _, line := range strings.Split(readFile("/proc/meminfo"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
