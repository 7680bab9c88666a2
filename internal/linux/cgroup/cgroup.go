// Package cgroup is a thin typed wrapper over Linux control groups, v2 when
// the unified hierarchy has the controllers airlock needs, v1 otherwise. It
// detects, never assumes, and a missing controller is an error: airlock
// never runs a sandbox without its limits. Only x/sys is imported.
//
// Every sandbox gets one cgroup named <parent>/<id> in each hierarchy it
// uses; the parent is "airlock" for the default state directory. A
// long-lived sandbox's has a child for its commands (Limits.Commands), and
// on v2 one for init ("init": v2 allows processes only in leaves).
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultParent is the directory, under each hierarchy's root, that airlock
// owns; Host.Parent may name another (one per airlock state directory).
const DefaultParent = "airlock"

// Version is the cgroup interface in use.
type Version int

const (
	V1 Version = 1
	V2 Version = 2
)

// v1Controllers are the v1 hierarchies a sandbox is placed in.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer"}

// v2Controllers must be available in the unified hierarchy to use v2.
var v2Controllers = []string{"memory", "cpu", "pids"}

// Host describes the cgroup layout found on this machine.
type Host struct {
	Version Version
	// V2Root is the unified hierarchy's mount point (v2 only).
	V2Root string
	// V1Roots maps a v1 controller to its hierarchy's mount point.
	V1Roots map[string]string
	// Missing names controllers that neither version offers.
	Missing []string
	// Parent is airlock's directory in each hierarchy (DefaultParent
	// unless set): sandboxes are Parent/<id>, and List sees only these.
	Parent string
}

// Detect reads /proc/self/mountinfo and the unified hierarchy's controllers.
// It returns an error naming what is missing when no version has every
// controller airlock needs.
func Detect() (*Host, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return detect(string(mi), func(root string) string {
		b, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		return string(b)
	})
}

// detect decides from mountinfo text and the unified hierarchy's
// cgroup.controllers (read through controllers).
func detect(mountinfo string, controllers func(v2root string) string) (*Host, error) {
	h := &Host{V1Roots: map[string]string{}, Parent: DefaultParent}
	var v2root string
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, pf := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(pf) < 3 {
			continue
		}
		switch pf[0] {
		case "cgroup2":
			if v2root == "" {
				v2root = f[4]
			}
		case "cgroup":
			for _, opt := range strings.Split(pf[2], ",") {
				for _, c := range v1Controllers {
					if opt == c {
						h.V1Roots[c] = f[4]
					}
				}
			}
		}
	}
	if v2root != "" {
		if len(missingFrom(v2Controllers, strings.Fields(controllers(v2root)))) == 0 {
			h.Version, h.V2Root = V2, v2root
			return h, nil
		}
	}
	var missing []string
	for _, c := range v1Controllers {
		if h.V1Roots[c] == "" {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		h.Version = V1
		return h, nil
	}
	h.Missing = missing
	return h, fmt.Errorf("cgroup controllers %s are available neither in cgroup v2 nor v1", strings.Join(missing, ", "))
}

func missingFrom(want, have []string) []string {
	var out []string
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			out = append(out, w)
		}
	}
	return out
}

// Limits are applied at creation.
type Limits struct {
	MemoryBytes int64
	CPUs        float64
	Pids        int64
	// Commands, when set, makes the child cgroup CommandsDir with these
	// lower limits, for the commands of a long-lived sandbox: the kernel's
	// OOM kill and refused forks stay among them, and the sandbox lives on.
	// Without it, an OOM anywhere is the sandbox's (v2: memory.oom.group).
	Commands *CommandLimits
}

// CommandLimits are the limits of a sandbox's commands' cgroup.
type CommandLimits struct {
	MemoryBytes int64
	Pids        int64
}

// Child cgroups of a long-lived sandbox's.
const (
	// CommandsDir holds the commands (in the memory and pids hierarchies
	// on v1).
	CommandsDir = "commands"
	// InitDir holds init and the agent on v2; on v1 they stay in the
	// sandbox's cgroup itself.
	InitDir = "init"
)

// Cgroup is one sandbox's cgroup (a directory per v1 hierarchy, or one v2
// directory).
type Cgroup struct {
	host *Host
	dirs map[string]string // controller (or "" for v2) -> directory
	// made lists, for a cgroup Create made, the child cgroups it makes
	// in each directory (Remove needs no look for them); nil for one
	// Open found.
	made map[string][]string
}

// Create makes the cgroup airlock/<name> and applies limits. On error,
// whatever was created is removed.
func (h *Host) Create(name string, l Limits) (_ *Cgroup, err error) {
	if strings.ContainsAny(name, "/.") || name == "" {
		return nil, fmt.Errorf("cgroup name %q", name)
	}
	cg := &Cgroup{host: h, dirs: map[string]string{}, made: map[string][]string{}}
	defer func() {
		if err != nil {
			_ = cg.Remove()
		}
	}()
	if h.Version == V2 {
		parent := filepath.Join(h.V2Root, h.Parent)
		dir := filepath.Join(parent, name)
		// The parent goes when its last sandbox does (Remove): if another
		// airlock's destroy removes it between these steps, start again.
		for attempt := 0; ; attempt++ {
			err = os.Mkdir(parent, 0o755)
			if err == nil || errors.Is(err, os.ErrExist) {
				// Enabling controllers for our subtree must be done in each
				// ancestor too; the root's is the operator's business.
				if err = writeFile(filepath.Join(parent, "cgroup.subtree_control"), "+memory +cpu +pids"); err == nil {
					err = os.Mkdir(dir, 0o755)
				}
			}
			if err == nil || !errors.Is(err, os.ErrNotExist) || attempt == 2 {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		cg.dirs[""] = dir
		period := int64(100000)
		quota := int64(l.CPUs * float64(period))
		limits := map[string]string{
			"memory.max":      strconv.FormatInt(l.MemoryBytes, 10),
			"memory.swap.max": "0",
			"cpu.max":         fmt.Sprintf("%d %d", quota, period),
			"pids.max":        strconv.FormatInt(l.Pids, 10),
		}
		if l.Commands == nil {
			// An OOM kills every process of the sandbox together.
			limits["memory.oom.group"] = "1"
		}
		if err := writeV2(dir, limits); err != nil {
			return nil, err
		}
		if l.Commands == nil {
			return cg, nil
		}
		if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+memory +pids"); err != nil {
			return nil, err
		}
		for _, sub := range []string{InitDir, CommandsDir} {
			cg.made[dir] = append(cg.made[dir], filepath.Join(dir, sub))
			if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
				return nil, fmt.Errorf("create cgroup %s/%s: %w", dir, sub, err)
			}
		}
		// No memory.oom.group: the kernel kills the one process it picks.
		if err := writeV2(filepath.Join(dir, CommandsDir), map[string]string{
			"memory.max":      strconv.FormatInt(l.Commands.MemoryBytes, 10),
			"memory.swap.max": "0",
			"pids.max":        strconv.FormatInt(l.Commands.Pids, 10),
		}); err != nil {
			return nil, err
		}
		return cg, nil
	}
	seen := map[string]bool{}
	for _, c := range v1Controllers {
		root := h.V1Roots[c]
		dir := filepath.Join(root, h.Parent, name)
		cg.dirs[c] = dir
		if seen[root] { // co-mounted controllers (cpu,cpuacct) share a directory
			continue
		}
		seen[root] = true
		// As for v2: a concurrent destroy may remove the parent in between.
		for attempt := 0; ; attempt++ {
			err = os.MkdirAll(dir, 0o755)
			if err == nil || !errors.Is(err, os.ErrNotExist) || attempt == 2 {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("mkdir %s: %w", dir, err)
		}
	}
	period := int64(100000)
	if err := writeV1(cg.dirs, l.MemoryBytes, l.Pids, []struct{ ctl, file, val string }{
		{"cpu", "cpu.cfs_period_us", strconv.FormatInt(period, 10)},
		{"cpu", "cpu.cfs_quota_us", strconv.FormatInt(int64(l.CPUs*float64(period)), 10)},
	}); err != nil {
		return nil, err
	}
	if l.Commands == nil {
		return cg, nil
	}
	sub := map[string]string{}
	for _, ctl := range commandControllers {
		sub[ctl] = filepath.Join(cg.dirs[ctl], CommandsDir)
		cg.made[cg.dirs[ctl]] = []string{sub[ctl]}
		if err := os.Mkdir(sub[ctl], 0o755); err != nil && !errors.Is(err, os.ErrExist) { // co-mounted
			return nil, fmt.Errorf("mkdir %s: %w", sub[ctl], err)
		}
	}
	if err := writeV1(sub, l.Commands.MemoryBytes, l.Commands.Pids, nil); err != nil {
		return nil, err
	}
	return cg, nil
}

// commandControllers are the v1 hierarchies with a commands' cgroup.
var commandControllers = []string{"memory", "pids"}

// writeV1 writes the memory and pids limits, and more, into the v1
// directories dirs (controller -> directory).
func writeV1(dirs map[string]string, memory, pids int64, more []struct{ ctl, file, val string }) error {
	for _, w := range append([]struct{ ctl, file, val string }{
		{"memory", "memory.limit_in_bytes", strconv.FormatInt(memory, 10)},
		// Memory and swap together, so that swap is no way past the limit
		// (absent when the kernel does not account swap: then none is used
		// beyond what swappiness 0 allows, and v1 offers nothing more).
		{"memory", "memory.memsw.limit_in_bytes", strconv.FormatInt(memory, 10)},
		{"memory", "memory.swappiness", "0"},
		{"pids", "pids.max", strconv.FormatInt(pids, 10)},
	}, more...) {
		if err := writeFile(filepath.Join(dirs[w.ctl], w.file), w.val); err != nil {
			if w.file == "memory.swappiness" || w.file == "memory.memsw.limit_in_bytes" && errors.Is(err, os.ErrNotExist) {
				continue // tuning, or no swap accounting in this kernel
			}
			return err
		}
	}
	return nil
}

// writeV2 writes limits (file -> value) into the v2 directory dir.
func writeV2(dir string, limits map[string]string) error {
	for file, val := range limits {
		if err := writeFile(filepath.Join(dir, file), val); err != nil {
			if file == "memory.swap.max" && errors.Is(err, os.ErrNotExist) {
				continue // no swap accounting: no swap to limit
			}
			return err
		}
	}
	return nil
}

// Open returns the cgroup airlock/<name> without creating anything (for gc).
func (h *Host) Open(name string) *Cgroup {
	cg := &Cgroup{host: h, dirs: map[string]string{}}
	if h.Version == V2 {
		cg.dirs[""] = filepath.Join(h.V2Root, h.Parent, name)
	} else {
		for _, c := range v1Controllers {
			cg.dirs[c] = filepath.Join(h.V1Roots[c], h.Parent, name)
		}
	}
	return cg
}

// List names the sandbox cgroups that exist under airlock/.
func (h *Host) List() []string {
	root := h.V2Root
	if h.Version == V1 {
		root = h.V1Roots["memory"]
	}
	ents, _ := os.ReadDir(filepath.Join(root, h.Parent))
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

// Version is the interface this cgroup uses.
func (c *Cgroup) Version() Version { return c.host.Version }

// Dir returns the v2 directory, or the v1 directory of controller ctl.
func (c *Cgroup) Dir(ctl string) string {
	if c.host.Version == V2 {
		return c.dirs[""]
	}
	return c.dirs[ctl]
}

// OpenV2 opens the v2 directory init is to be cloned into
// (CLONE_INTO_CGROUP): the sandbox's, or its InitDir when it has children.
func (c *Cgroup) OpenV2() (*os.File, error) {
	dir := c.dirs[""]
	if _, err := os.Stat(filepath.Join(dir, InitDir)); err == nil {
		dir = filepath.Join(dir, InitDir)
	}
	return os.OpenFile(dir, unix.O_DIRECTORY|unix.O_PATH|unix.O_CLOEXEC, 0)
}

// Placement is how a sandbox's init puts each command it starts into the
// commands' cgroup (CommandsDir), through descriptors the host opened:
// the kernel checks a write to a cgroup's task list against the opener's
// credentials, so init needs no write access to any cgroup file, and a
// descriptor can move only the sandbox's own processes (pids are resolved
// in the writer's pid namespace) into the one cgroup it names.
type Placement struct {
	// Thread (v1): the forking thread writes "0" to each Enter file (the
	// commands' tasks files) before it forks, so that the child is born
	// in the cgroups, and to each Leave file (the sandbox's) after.
	Enter, Leave []*os.File
	// Procs (v2, where only whole processes move): the child's pid is
	// written to the commands' cgroup.procs as soon as it runs; what it
	// does before that (microseconds) is counted in init's cgroup, within
	// the sandbox's limits.
	Procs *os.File
}

// Files are the placement's descriptors, in the order Enter, Leave, Procs.
func (p *Placement) Files() []*os.File {
	out := append(append([]*os.File{}, p.Enter...), p.Leave...)
	if p.Procs != nil {
		out = append(out, p.Procs)
	}
	return out
}

// Close closes the placement's descriptors.
func (p *Placement) Close() {
	for _, f := range p.Files() {
		f.Close()
	}
}

// CommandPlacement opens the files init needs to place commands in the
// commands' cgroup (the cgroup must have been created with
// Limits.Commands).
func (c *Cgroup) CommandPlacement() (_ *Placement, err error) {
	p := &Placement{}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	open := func(path string) (*os.File, error) {
		f, err := os.OpenFile(path, os.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		return f, nil
	}
	if c.host.Version == V2 {
		p.Procs, err = open(filepath.Join(c.dirs[""], CommandsDir, "cgroup.procs"))
		return p, err
	}
	seen := map[string]bool{}
	for _, ctl := range commandControllers {
		if seen[c.dirs[ctl]] {
			continue
		}
		seen[c.dirs[ctl]] = true
		in, err := open(filepath.Join(c.dirs[ctl], CommandsDir, "tasks"))
		if err != nil {
			return nil, err
		}
		p.Enter = append(p.Enter, in)
		out, err := open(filepath.Join(c.dirs[ctl], "tasks"))
		if err != nil {
			return nil, err
		}
		p.Leave = append(p.Leave, out)
	}
	return p, nil
}

// EnterThread moves the calling OS thread (tid) into this cgroup's v1
// hierarchies and returns a function that moves it back. The caller must
// hold runtime.LockOSThread. A child cloned in between is born inside the
// cgroup, so it can create its cgroup namespace at clone time.
//
// The thread names itself as "0" in the tasks files: a thread moving itself
// needs no threadgroup lock, whose RCU grace period otherwise costs
// milliseconds per sandbox.
func (c *Cgroup) EnterThread(tid int) (restore func() error, err error) {
	if c.host.Version != V1 {
		return nil, errors.New("EnterThread is for cgroup v1")
	}
	orig, err := threadCgroups(tid)
	if err != nil {
		return nil, err
	}
	var moved []string
	restore = func() error {
		var first error
		for _, ctl := range moved {
			p := filepath.Join(c.host.V1Roots[ctl], orig[ctl], "tasks")
			if err := writeFile(p, "0"); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	seen := map[string]bool{}
	for _, ctl := range v1Controllers {
		if seen[c.dirs[ctl]] {
			continue
		}
		seen[c.dirs[ctl]] = true
		if err := writeFile(filepath.Join(c.dirs[ctl], "tasks"), "0"); err != nil {
			_ = restore()
			return nil, err
		}
		moved = append(moved, ctl)
	}
	return restore, nil
}

// threadCgroups reads /proc/self/task/TID/cgroup: controller -> path.
func threadCgroups(tid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/cgroup", tid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			out[ctl] = parts[2]
		}
	}
	return out, nil
}

// Stats is what the kernel accounted for a sandbox.
type Stats struct {
	CPUTime     time.Duration
	MemoryPeak  int64
	OOMKills    int64
	PidsLimited int64 // forks refused by pids.max
}

// Stats reads the accounting files of the cgroup and its children (the
// commands', init's). Missing counters are left zero.
func (c *Cgroup) Stats() Stats {
	s := Stats{CPUTime: c.CPUTime()}
	if c.host.Version == V2 {
		s.MemoryPeak = readInt(filepath.Join(c.dirs[""], "memory.peak"))
	} else {
		s.MemoryPeak = readInt(filepath.Join(c.dirs["memory"], "memory.max_usage_in_bytes"))
	}
	s.OOMKills, s.PidsLimited = c.LimitEvents()
	return s
}

// CPUTime is the CPU time the sandbox used so far: Stats' CPUTime alone,
// one file read (the daemon charges every sandbox's each second).
func (c *Cgroup) CPUTime() time.Duration {
	if c.host.Version == V2 {
		return time.Duration(readKV(filepath.Join(c.dirs[""], "cpu.stat"))["usage_usec"]) * time.Microsecond
	}
	return time.Duration(readInt(filepath.Join(c.dirs["cpuacct"], "cpuacct.usage")))
}

// LimitEvents are the sandbox's OOM kills and refused forks so far: those
// two counters alone, of the cgroup and its children (InitDir on v2,
// CommandsDir), read into a buffer on the stack. An exec reads them
// before and after its command, to tell which limit it met: Stats reads
// every counter, and costs many times more.
func (c *Cgroup) LimitEvents() (oomKills, pidsLimited int64) {
	if c.host.Version == V2 {
		// The events are counted up the tree (where the limit was met, or
		// where the process was, on older kernels and with the *_local
		// mount options): the larger of the sandbox's and its children's.
		d := c.dirs[""]
		oom, pids := readKey(filepath.Join(d, "memory.events"), "oom_kill"), readKey(filepath.Join(d, "pids.events"), "max")
		var childOOM, childPids int64
		for _, sub := range []string{InitDir, CommandsDir} {
			childOOM += readKey(filepath.Join(d, sub, "memory.events"), "oom_kill")
			childPids += readKey(filepath.Join(d, sub, "pids.events"), "max")
		}
		return max(oom, childOOM), max(pids, childPids)
	}
	// v1 counts each event in one cgroup only: add the commands' (init
	// stays in the sandbox's own).
	for _, sub := range []string{"", CommandsDir} {
		oomKills += readKey(filepath.Join(c.dirs["memory"], sub, "memory.oom_control"), "oom_kill")
		pidsLimited += readKey(filepath.Join(c.dirs["pids"], sub, "pids.events"), "max")
	}
	return oomKills, pidsLimited
}

// children lists the child cgroups of directory dir. Only airlock makes
// any (CommandsDir, InitDir): those are looked up by name, and the
// directory is read (a v1 memory cgroup's holds some 50 files) only when
// its link count (kernfs keeps a directory's at 2 plus its
// subdirectories) says there are others, or is not kept.
func children(dir string) []string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return nil
	}
	if st.Nlink == 2 {
		return nil
	}
	var out []string
	for _, name := range []string{CommandsDir, InitDir} {
		var sub unix.Stat_t
		p := filepath.Join(dir, name)
		if unix.Lstat(p, &sub) == nil && sub.Mode&unix.S_IFMT == unix.S_IFDIR {
			out = append(out, p)
		}
	}
	if st.Nlink > 2 && uint64(len(out)) == uint64(st.Nlink)-2 {
		return out
	}
	ents, _ := os.ReadDir(dir)
	out = out[:0]
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// WatchOOM calls fn (once) when the cgroup runs out of memory and the
// kernel's OOM killer is about to pick a victim, whichever process that is.
// v1 uses an eventfd on memory.oom_control; v2 watches memory.events with
// inotify. stop ends the watch.
func (c *Cgroup) WatchOOM(fn func()) (stop func(), err error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	var check func() bool
	var src int
	if c.host.Version == V1 {
		ctl, err := os.Open(filepath.Join(c.dirs["memory"], "memory.oom_control"))
		if err != nil {
			unix.Close(efd)
			return nil, err
		}
		defer ctl.Close()
		if err := writeFile(filepath.Join(c.dirs["memory"], "cgroup.event_control"), fmt.Sprintf("%d %d", efd, ctl.Fd())); err != nil {
			unix.Close(efd)
			return nil, err
		}
		src = efd
		// The kernel signals before it picks and kills a victim: the event
		// itself is the OOM (waiting for the counter would race it).
		check = func() bool { return true }
	} else {
		ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			unix.Close(efd)
			return nil, fmt.Errorf("inotify_init1: %w", err)
		}
		if _, err := unix.InotifyAddWatch(ifd, filepath.Join(c.dirs[""], "memory.events"), unix.IN_MODIFY); err != nil {
			unix.Close(ifd)
			unix.Close(efd)
			return nil, fmt.Errorf("inotify_add_watch: %w", err)
		}
		src = ifd
		// memory.events changes for other counters too; "oom" is counted
		// when the limit is hit, "oom_kill" once the victim is chosen.
		check = func() bool {
			kv := readKV(filepath.Join(c.dirs[""], "memory.events"))
			return kv["oom"] > 0 || kv["oom_kill"] > 0
		}
	}
	// stopfd wakes the poll loop when stop is called.
	stopfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(src)
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		fds := []unix.PollFd{{Fd: int32(src), Events: unix.POLLIN}, {Fd: int32(stopfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
				return
			}
			if fds[1].Revents != 0 {
				return
			}
			if fds[0].Revents != 0 {
				_, _ = unix.Read(src, buf)
				if check() {
					fn()
					return
				}
			}
		}
	}()
	return func() {
		_, _ = unix.Write(stopfd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		<-done
		unix.Close(stopfd)
		unix.Close(src)
		if src != efd {
			unix.Close(efd)
		}
	}, nil
}

// Freeze stops every task of the cgroup (v1 freezer.state, v2
// cgroup.freeze) and waits until the kernel says they are all frozen.
func (c *Cgroup) Freeze() error { return c.setFrozen(true) }

// Thaw lets the cgroup's tasks run again.
func (c *Cgroup) Thaw() error { return c.setFrozen(false) }

func (c *Cgroup) setFrozen(on bool) error {
	var file, val, want string
	if c.host.Version == V2 {
		file, val = filepath.Join(c.dirs[""], "cgroup.freeze"), "0"
		if on {
			val = "1"
		}
	} else {
		file, val, want = filepath.Join(c.dirs["freezer"], "freezer.state"), "THAWED", "THAWED"
		if on {
			val, want = "FROZEN", "FROZEN"
		}
	}
	if err := writeFile(file, val); err != nil {
		return err
	}
	for i := 0; i < 1000; i++ {
		if c.host.Version == V2 {
			if (readKV(filepath.Join(c.dirs[""], "cgroup.events"))["frozen"] == 1) == on {
				return nil
			}
		} else if b, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(b)) == want {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("cgroup: %s did not become %s", file, val)
}

// Frozen reports whether the cgroup is frozen.
func (c *Cgroup) Frozen() bool {
	if c.host.Version == V2 {
		return readKV(filepath.Join(c.dirs[""], "cgroup.events"))["frozen"] == 1
	}
	b, _ := os.ReadFile(filepath.Join(c.dirs["freezer"], "freezer.state"))
	return strings.TrimSpace(string(b)) == "FROZEN"
}

// MemoryCurrent is the memory the cgroup uses now, in bytes.
func (c *Cgroup) MemoryCurrent() int64 {
	if c.host.Version == V2 {
		return readInt(filepath.Join(c.dirs[""], "memory.current"))
	}
	return readInt(filepath.Join(c.dirs["memory"], "memory.usage_in_bytes"))
}

// Procs lists the pids in the cgroup and its children (v2: cgroup.procs;
// v1: the pids hierarchy's cgroup.procs).
func (c *Cgroup) Procs() []int {
	var out []int
	for _, d := range append([]string{c.Dir("pids")}, children(c.Dir("pids"))...) {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// KillUntil kills every process of the cgroup, again and again, until
// none is left and gone reports true (the holder of what the cgroup was
// made for has let go), for five seconds at most.
func (c *Cgroup) KillUntil(gone func() bool) {
	// Frozen tasks do not die until thawed (a paused or pooled sandbox).
	if c.Frozen() {
		_ = c.Thaw()
	}
	for i := 0; i < 250; i++ {
		procs := c.Procs()
		for _, p := range procs {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		if len(procs) == 0 && gone() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Remove deletes the cgroup directories, waiting briefly for dying tasks,
// and airlock's parent directory when no sandbox is left in it.
func (c *Cgroup) Remove() error {
	var first error
	seen := map[string]bool{}
	for _, d := range c.dirs {
		if seen[d] {
			continue
		}
		seen[d] = true
		subs, ok := c.made[d]
		if !ok && c.made == nil {
			subs = children(d)
		}
		for _, sub := range subs {
			if err := rmdir(sub); err != nil && first == nil {
				first = err
			}
		}
		if err := rmdir(d); err != nil && first == nil {
			first = err
		}
		removeParentIfEmpty(filepath.Dir(d))
	}
	return first
}

// removeParentIfEmpty removes airlock's parent directory p when no
// sandbox's cgroup is left in it. An empty one is told by its link count
// (kernfs keeps a directory's at 2 plus its subdirectories), read without
// the kernel's global cgroup lock; an rmdir takes that lock even to fail,
// and a kill switch of 1,000 sandboxes would try it 4,000 times while the
// kernel offlines their cgroups under the same lock. Two last sandboxes
// ending together may both try; one fails, busy or gone, as a create
// between the look and the rmdir makes it fail (Create starts again when
// the parent goes under it).
func removeParentIfEmpty(p string) {
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil || st.Nlink > 2 {
		return
	}
	_ = unix.Rmdir(p)
}

// rmdirMu lets one of this process's cgroup rmdirs into the kernel at a
// time. The kernel runs them one at a time anyway (under the parent
// directory's inode lock and the global cgroup mutex), and a waiter spins
// on its CPU while the holder runs: in a kill switch of 1,000 sandboxes
// that spinning was half of the daemon's time in rmdir, on the CPUs the
// kernel's own teardown of the sandboxes needed.
var rmdirMu sync.Mutex

// rmdir removes cgroup directory d, waiting briefly for dying tasks.
func rmdir(d string) error {
	var err error
	for i := 0; i < 200; i++ {
		rmdirMu.Lock()
		err = unix.Rmdir(d)
		rmdirMu.Unlock()
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("rmdir %s: %w", d, err)
}

func writeFile(p, val string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(val); err != nil {
		return fmt.Errorf("cgroup: write %s=%q: %w", p, val, err)
	}
	return nil
}

func readInt(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return n
}

// readKey is the value of key in the flat-keyed file p ("key value"
// lines, at most 512 bytes read: the events and oom_control files are a
// few lines), 0 when it has none.
func readKey(p, key string) int64 {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	var buf [512]byte
	n, _ := unix.Read(fd, buf[:])
	unix.Close(fd)
	return parseKey(buf[:max(n, 0)], key)
}

// parseKey finds key's value in the "key value" lines of b.
func parseKey(b []byte, key string) int64 {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(line, []byte{' '})
		if ok && string(k) == key {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}

func readKV(p string) map[string]int64 {
	out := map[string]int64{}
	f, err := os.Open(p)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			out[k] = n
		}
	}
	return out
}
