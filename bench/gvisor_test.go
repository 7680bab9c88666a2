package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// runscBin is the runsc the gvisor wall runs (scripts/runsc.sh installs
// it there, at the pinned version).
const runscBin = "/usr/local/lib/airlock/runsc"

func needRunsc(b *testing.B) {
	if _, err := os.Stat(runscBin); err != nil {
		b.Skip("runsc is not installed (./scripts/runsc.sh)")
	}
}

// runscPeer runs OCI bundles with runsc directly: the peer of the gvisor
// wall, with the flags airlock gives runsc for a one-shot run.
type runscPeer struct {
	root, bundle string
	n            int
}

// newRunscPeer makes a bundle that runs args as airlock's sandbox user:
// the host's /usr read-only (and the /bin, /lib links), fresh /proc, /dev
// and /tmp, no network, no capabilities.
func newRunscPeer(b *testing.B, args ...string) *runscPeer {
	b.Helper()
	dir := b.TempDir()
	p := &runscPeer{root: filepath.Join(dir, "state"), bundle: filepath.Join(dir, "bundle")}
	rootfs := filepath.Join(p.bundle, "rootfs")
	for _, d := range []string{"usr", "proc", "dev", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	for link, target := range map[string]string{"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"} {
		if err := os.Symlink(target, filepath.Join(rootfs, link)); err != nil {
			b.Fatal(err)
		}
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]any{"uid": 1000, "gid": 1000}, "args": args,
			"env": []string{"PATH=/usr/bin:/bin"}, "cwd": "/", "noNewPrivileges": true,
		},
		"root":     map[string]any{"path": "rootfs", "readonly": true},
		"hostname": "sandbox",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
			{"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro"}},
		},
		"linux": map[string]any{"namespaces": []map[string]any{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}}},
	}
	raw, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(p.bundle, "config.json"), raw, 0o644); err != nil {
		b.Fatal(err)
	}
	return p
}

// peerUserNS is where withUserNS maps a peer's ids: below the range
// airlock leases sandboxes' ids from (uidlease.First), above /etc/subuid's.
const peerUserNS = 1 << 29

// withUserNS makes p's sandbox run, as airlock's do, in a user namespace
// whose ids are a host range of their own (airlock leases one per
// sandbox): runsc then starts the Sentry and the gofer in it, which costs
// it time of its own. Its rootfs, root's, must be traversable by them.
func (p *runscPeer) withUserNS(b *testing.B) *runscPeer {
	b.Helper()
	dir := filepath.Dir(p.bundle) // b.TempDir(): TMPDIR/<test><n>/<m>
	for _, d := range []string{p.bundle, dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			b.Fatal(err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(p.bundle, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		b.Fatal(err)
	}
	linux := spec["linux"].(map[string]any)
	linux["namespaces"] = append(linux["namespaces"].([]any), map[string]any{"type": "user"})
	ids := []map[string]any{{"containerID": 0, "hostID": peerUserNS, "size": 65536}}
	linux["uidMappings"], linux["gidMappings"] = ids, ids
	raw, _ = json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(p.bundle, "config.json"), raw, 0o644); err != nil {
		b.Fatal(err)
	}
	return p
}

// cmd is `runsc run` of the bundle on platform, as a new container.
func (p *runscPeer) cmd(platform string) *exec.Cmd {
	p.n++
	return exec.Command(runscBin, "--root", p.root, "--network=none", "--platform="+platform, "--ignore-cgroups", "--overlay2=none",
		"run", "--bundle", p.bundle, fmt.Sprintf("bench-%d-%d", os.Getpid(), p.n))
}

// BenchmarkGVisorColdStart alternates `airlock run --isolation gvisor --
// true` with `runsc run` of a bundle that runs `true` the same way, and
// reports both medians and their ratio (goal: 1.2x at most). The bundle
// has no user namespace, which airlock's have (runsc-userns-ms is runsc
// run of the same bundle in one, mapped as airlock maps a sandbox's ids;
// ratio-userns is airlock's against it), nor airlock's overlays and
// writable mounts.
func BenchmarkGVisorColdStart(b *testing.B) {
	needRunsc(b)
	peer := newRunscPeer(b, "/usr/bin/true")
	peerNS := newRunscPeer(b, "/usr/bin/true").withUserNS(b)
	runPeer := func(peer *runscPeer) sample {
		cmd := peer.cmd("systrap")
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("runsc run: %v\n%s", err, out)
		}
		return sample{wall: time.Since(start)}
	}
	al := []string{"run", "--isolation", "gvisor", "--json", "--", "true"}
	for i := 0; i < 3; i++ { // warm all
		runOnce(b, airlockBin, al...)
		runPeer(peer)
		runPeer(peerNS)
	}
	runs := max(b.N, 20)
	var a, r, u []sample
	for i := 0; i < runs; i++ {
		a = append(a, runOnce(b, airlockBin, al...))
		r = append(r, runPeer(peer))
		u = append(u, runPeer(peerNS))
	}
	ms := func(s sample) float64 { return float64(s.wall.Microseconds()) / 1000 }
	am, rm, um := median(a, ms), median(r, ms), median(u, ms)
	b.ReportMetric(am, "airlock-gvisor-ms")
	b.ReportMetric(rm, "runsc-ms")
	b.ReportMetric(am/rm, "ratio")
	b.ReportMetric(um, "runsc-userns-ms")
	b.ReportMetric(am/um, "ratio-userns")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d runs each: airlock run --isolation gvisor median %.1f ms, runsc run %.1f ms, ratio %.2fx; runsc run in a user namespace %.1f ms, ratio %.2fx",
		runs, am, rm, am/rm, um, am/um)
}

// BenchmarkGVisorIdleMemory: host memory per idle gvisor sandbox at 50
// sandboxes (their processes' PSS, the kernel memory their cgroups
// account, the daemon's growth), beside runsc's own idle cost: the PSS of
// `runsc run` of a bundle running `sleep`, on the platform airlock's
// sandboxes run on (goal: runsc's own + 2 MiB at most).
func BenchmarkGVisorIdleMemory(b *testing.B) {
	needRunsc(b)
	const n = 50
	d := startServe(b)
	ctx := context.Background()
	base := pss(d.cmd.Process.Pid)
	var first string
	var once sync.Once
	parallel(n, 4, func(int) {
		id := d.create(b, &api.CreateSandbox{Isolation: "gvisor", Limits: api.Limits{MemoryBytes: 256 << 20}})
		once.Do(func() { first = id })
		if _, err := d.tenant.Exec(ctx, id, trueCmd, nil, nil); err != nil {
			b.Error(err)
		}
	})
	platform := sandboxPlatform(b, d, first)
	time.Sleep(6 * time.Second) // idle
	p, k, got := d.sandboxCost(b, "gvisor")
	if got != n {
		b.Fatalf("counted %d sandboxes, want %d", got, n)
	}
	grown := pss(d.cmd.Process.Pid) - base
	per := float64(p+k+grown) / n / (1 << 20)

	// runsc's own: five bare sandboxes idling in `sleep`.
	peer := newRunscPeer(b, "/usr/bin/sleep", "1000")
	var own int64
	const bare = 5
	var cmds []*exec.Cmd
	for i := 0; i < bare; i++ {
		cmd := peer.cmd(platform)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	defer func() {
		for _, c := range cmds {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
		_ = exec.Command(runscBin, "--root", peer.root, "delete", "--force").Run()
	}()
	time.Sleep(6 * time.Second)
	for _, c := range cmds {
		for _, pid := range descendants(c.Process.Pid) {
			own += pss(pid)
		}
	}
	ownPer := float64(own) / bare / (1 << 20)
	b.ReportMetric(per, "airlock-MiB/sandbox")
	b.ReportMetric(ownPer, "runsc-MiB/sandbox")
	b.ReportMetric(per-ownPer, "added-MiB")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d idle gvisor sandboxes (%s): %.1f MiB each (PSS %.1f + kernel %.1f + daemon %.2f); bare runsc run of sleep: %.1f MiB; airlock adds %.1f MiB",
		n, platform, per, float64(p)/n/(1<<20), float64(k)/n/(1<<20), float64(grown)/n/(1<<20), ownPer, per-ownPer)
}

// sandboxPlatform is the --platform airlock's runsc runs sandbox id on,
// read from its processes' command lines.
func sandboxPlatform(b *testing.B, d *daemon, id string) string {
	b.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(raw), id) {
			continue
		}
		for _, a := range strings.Split(string(raw), "\x00") {
			if v, ok := strings.CutPrefix(a, "--platform="); ok {
				return v
			}
		}
	}
	b.Fatalf("no runsc process of sandbox %s names its platform", id)
	return ""
}

// descendants are pid and every process below it.
func descendants(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// ppid is the second field after the command's closing paren.
		if i := strings.LastIndexByte(string(raw), ')'); i > 0 {
			if f := strings.Fields(string(raw)[i+1:]); len(f) > 1 {
				pp, _ := strconv.Atoi(f[1])
				children[pp] = append(children[pp], p)
			}
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}
