package bench

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"golang.org/x/sys/unix"
)

// daemon is an `airlock serve` of the benchmark's own, in temporary
// state and data directories; stop destroys its sandboxes and ends it.
type daemon struct {
	cmd      *exec.Cmd
	dir      string
	tenant   *client.Client
	key      string // the tenant's
	admin    *client.Client
	stateDir string
}

func startServe(b *testing.B, extra ...string) *daemon {
	b.Helper()
	dir, err := os.MkdirTemp("", "airlock-bench-serve-")
	if err != nil {
		b.Fatal(err)
	}
	_ = os.Chmod(dir, 0o711)
	d := &daemon{dir: dir, stateDir: filepath.Join(dir, "run")}
	sock := filepath.Join(dir, "airlock.sock")
	d.cmd = exec.Command(airlockBin, append([]string{"--state-dir", d.stateDir, "--data-dir", filepath.Join(dir, "lib"), "serve", "--socket", sock, "--log-level", "warn"}, extra...)...)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	d.cmd.Stderr = os.Stderr
	if err := d.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	for i := 0; ; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if i > 1000 {
			b.Fatal("the daemon did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	key, err := os.ReadFile(filepath.Join(dir, "lib", "admin.key"))
	if err != nil {
		b.Fatal(err)
	}
	d.admin, _ = client.New(client.Config{Address: sock, Key: strings.TrimSpace(string(key))})
	t, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	d.key = t.Key
	d.tenant, _ = client.New(client.Config{Address: sock, Key: t.Key})
	b.Cleanup(d.stop)
	return d
}

func (d *daemon) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, _ = d.admin.KillAll(ctx, "")
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	_ = d.cmd.Wait()
	_ = exec.Command(airlockBin, "--state-dir", d.stateDir, "--data-dir", filepath.Join(d.dir, "lib"), "gc").Run()
	unsealExes(filepath.Join(d.stateDir, "exe"))
	os.RemoveAll(d.dir)
}

func (d *daemon) create(b *testing.B, req *api.CreateSandbox) string {
	sb, err := d.tenant.CreateSandbox(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	return sb.ID
}

func percentile(ds []time.Duration, p float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(float64(len(s))*p))].Microseconds()) / 1000
}

var trueCmd = &api.Exec{Cmd: []string{"true"}}

// BenchmarkServeExec: `true` in an existing sandbox through the SDK, one
// at a time, beside the floor of a host fork+exec of `true` (os/exec).
func BenchmarkServeExec(b *testing.B) {
	d := startServe(b)
	ctx := context.Background()
	id := d.create(b, &api.CreateSandbox{})
	for i := 0; i < 20; i++ {
		if _, err := d.tenant.Exec(ctx, id, trueCmd, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	runs := max(b.N, 500)
	var al, host []time.Duration
	b.ResetTimer()
	for i := 0; i < runs; i++ {
		t0 := time.Now()
		end, err := d.tenant.Exec(ctx, id, trueCmd, nil, nil)
		if err != nil || end.ExitCode != 0 {
			b.Fatalf("exec: %+v %v", end, err)
		}
		al = append(al, time.Since(t0))
		t0 = time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
		host = append(host, time.Since(t0))
	}
	b.StopTimer()
	p50, p99, h50 := percentile(al, 0.5), percentile(al, 0.99), percentile(host, 0.5)
	b.ReportMetric(p50, "exec-p50-ms")
	b.ReportMetric(p99, "exec-p99-ms")
	b.ReportMetric(h50, "host-forkexec-p50-ms")
	b.ReportMetric(p50/h50, "ratio")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d execs: p50 %.2f ms, p99 %.2f ms; host fork+exec of true p50 %.2f ms (ratio %.1fx)", runs, p50, p99, h50, p50/h50)
}

// BenchmarkServeExecConcurrent: 16 clients, each with a sandbox of its
// own, running `true` as fast as they can for a few seconds.
func BenchmarkServeExecConcurrent(b *testing.B) {
	d := startServe(b)
	ctx := context.Background()
	const clients = 16
	ids := make([]string, clients)
	for i := range ids {
		ids[i] = d.create(b, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 256 << 20}})
	}
	// The first second of a burst is reported apart: it is not the steady
	// state (see BenchmarkServeExecConcurrent's note in the closing note).
	warm, lat, counts := time.Second, [clients][]time.Duration{}, make([]int, clients)
	var first []time.Duration
	dur := 5 * time.Second
	var n sync.WaitGroup
	var mu sync.Mutex
	b.ResetTimer()
	start := time.Now()
	deadline := start.Add(warm + dur)
	for i := 0; i < clients; i++ {
		n.Add(1)
		go func() {
			defer n.Done()
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if _, err := d.tenant.Exec(ctx, ids[i], trueCmd, nil, nil); err != nil {
					b.Error(err)
					return
				}
				if t0.Sub(start) < warm {
					mu.Lock()
					first = append(first, time.Since(t0))
					mu.Unlock()
					continue
				}
				lat[i] = append(lat[i], time.Since(t0))
				counts[i]++
			}
		}()
	}
	n.Wait()
	b.StopTimer()
	b.ReportMetric(percentile(first, 0.99), "burst-first-second-p99-ms")
	total := 0
	var all []time.Duration
	for i := range counts {
		total += counts[i]
		all = append(all, lat[i]...)
	}
	rate := float64(total) / dur.Seconds()
	b.ReportMetric(rate, "execs/s")
	b.ReportMetric(percentile(all, 0.5), "p50-ms")
	b.ReportMetric(percentile(all, 0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d clients: %d execs in %v = %.0f/s (p50 %.2f ms, p99 %.2f ms)", clients, total, dur, rate, percentile(all, 0.5), percentile(all, 0.99))
}

// BenchmarkServeCreateDestroy: sandbox create + destroy pairs, one at a
// time and four at a time, beside bwrap starting and ending `true`.
func BenchmarkServeCreateDestroy(b *testing.B) {
	d := startServe(b)
	ctx := context.Background()
	runs := max(b.N, 100)
	one := func() {
		sb, err := d.tenant.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 256 << 20}})
		if err != nil {
			b.Fatal(err)
		}
		if err := d.tenant.Destroy(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		one()
	}
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < runs; i++ {
		one()
	}
	serial := float64(runs) / time.Since(t0).Seconds()
	t0 = time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < runs/4; i++ {
				one()
			}
		}()
	}
	wg.Wait()
	parallel := float64(runs/4*4) / time.Since(t0).Seconds()
	b.StopTimer()
	b.ReportMetric(serial, "create+destroy/s")
	b.ReportMetric(parallel, "create+destroy/s-4way")
	if bwrap, err := exec.LookPath("bwrap"); err == nil {
		t0 = time.Now()
		for i := 0; i < runs; i++ {
			if err := exec.Command(bwrap, bwrapArgs...).Run(); err != nil {
				b.Fatal(err)
			}
		}
		bw := float64(runs) / time.Since(t0).Seconds()
		b.ReportMetric(bw, "bwrap-true/s")
		b.ReportMetric(bw/serial, "ratio")
		b.Logf("create+destroy: %.1f/s serial, %.1f/s 4-way; bwrap true: %.1f/s (ratio %.1fx)", serial, parallel, bw, bw/serial)
	}
	b.ReportMetric(0, "ns/op")
}

// pss is a process's proportional set size in bytes (smaps_rollup).
func pss(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// sandboxCost sums, over the daemon's sandboxes of one wall ("": the
// container wall, "gvisor"), the PSS of their processes and the kernel
// memory their cgroups account (v1 memory.kmem.usage_in_bytes; v2
// memory.stat kernel).
func (d *daemon) sandboxCost(b *testing.B, wall string) (pssBytes, kernelBytes int64, n int) {
	// The cgroup parent of a state directory's sandboxes (the walls'
	// Scope).
	sum := sha256.Sum256([]byte(filepath.Clean(d.stateDir)))
	scope := "airlock-" + hex.EncodeToString(sum[:4])
	if wall != "" {
		scope = "airlock-" + wall + "-" + hex.EncodeToString(sum[:4])
	}
	parent := filepath.Join("/sys/fs/cgroup/memory", scope)
	if _, err := os.Stat(parent); err != nil {
		parent = filepath.Join("/sys/fs/cgroup", scope)
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		n++
		raw, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(raw)) {
			pid, _ := strconv.Atoi(f)
			pssBytes += pss(pid)
		}
		if k, err := os.ReadFile(filepath.Join(dir, "memory.kmem.usage_in_bytes")); err == nil {
			v, _ := strconv.ParseInt(strings.TrimSpace(string(k)), 10, 64)
			kernelBytes += v
		} else if st, err := os.ReadFile(filepath.Join(dir, "memory.stat")); err == nil {
			for _, l := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(l, "kernel "); ok {
					x, _ := strconv.ParseInt(v, 10, 64)
					kernelBytes += x
				}
			}
		}
	}
	return pssBytes, kernelBytes, n
}

// BenchmarkServeIdleMemory: host memory per idle sandbox at 100 and 500
// sandboxes: their processes' PSS plus the kernel memory their cgroups
// account, plus what the daemon grew by holding them.
func BenchmarkServeIdleMemory(b *testing.B) {
	for _, n := range []int{100, 500} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			d := startServe(b)
			ctx := context.Background()
			base := pss(d.cmd.Process.Pid)
			parallel(n, 8, func(int) {
				id := d.create(b, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 128 << 20}})
				if _, err := d.tenant.Exec(ctx, id, trueCmd, nil, nil); err != nil {
					b.Error(err)
				}
			})
			time.Sleep(6 * time.Second) // idle: the agents have handed back their garbage
			p, k, got := d.sandboxCost(b, "")
			if got != n {
				b.Fatalf("counted %d sandboxes, want %d", got, n)
			}
			grown := pss(d.cmd.Process.Pid) - base
			per := float64(p+k+grown) / float64(n) / (1 << 20)
			b.ReportMetric(float64(p)/float64(n)/(1<<20), "pss-MiB/sandbox")
			b.ReportMetric(float64(k)/float64(n)/(1<<20), "kernel-MiB/sandbox")
			b.ReportMetric(float64(grown)/float64(n)/(1<<20), "daemon-MiB/sandbox")
			b.ReportMetric(per, "total-MiB/sandbox")
			b.ReportMetric(0, "ns/op")
			b.Logf("%d idle sandboxes: %.2f MiB each (PSS %.2f + kernel %.2f + daemon %.2f)", n, per,
				float64(p)/float64(n)/(1<<20), float64(k)/float64(n)/(1<<20), float64(grown)/float64(n)/(1<<20))
		})
	}
}

// unsealExes clears the immutable attribute of the copies of airlock a
// state directory holds, so that it can be removed.
func unsealExes(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS); err == nil {
			_ = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags&^0x10) // FS_IMMUTABLE_FL
		}
		f.Close()
	}
}

// BenchmarkServeExecAudit: the same `true` exec against a daemon with its
// audit log (the start fsynced before the pid is answered) and one
// without, alternated in one run.
func BenchmarkServeExecAudit(b *testing.B) {
	on, off := startServe(b), startServe(b, "--no-audit")
	ctx := context.Background()
	idOn, idOff := on.create(b, &api.CreateSandbox{}), off.create(b, &api.CreateSandbox{})
	for i := 0; i < 20; i++ {
		_, _ = on.tenant.Exec(ctx, idOn, trueCmd, nil, nil)
		_, _ = off.tenant.Exec(ctx, idOff, trueCmd, nil, nil)
	}
	runs := max(b.N, 500)
	var withLog, without []time.Duration
	b.ResetTimer()
	for i := 0; i < runs; i++ {
		t0 := time.Now()
		if _, err := on.tenant.Exec(ctx, idOn, trueCmd, nil, nil); err != nil {
			b.Fatal(err)
		}
		withLog = append(withLog, time.Since(t0))
		t0 = time.Now()
		if _, err := off.tenant.Exec(ctx, idOff, trueCmd, nil, nil); err != nil {
			b.Fatal(err)
		}
		without = append(without, time.Since(t0))
	}
	b.StopTimer()
	a, n := percentile(withLog, 0.5), percentile(without, 0.5)
	b.ReportMetric(a, "audit-on-p50-ms")
	b.ReportMetric(n, "audit-off-p50-ms")
	b.ReportMetric((a/n-1)*100, "added-%")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d execs each: p50 %.3f ms with the audit log, %.3f ms without (+%.1f%%)", runs, a, n, (a/n-1)*100)
}
