package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// densityCount is how many sandboxes BenchmarkDensity makes on wall:
// AIRLOCK_DENSITY (container) or AIRLOCK_DENSITY_GVISOR, else 1,000 on
// the container wall and 50 on gvisor.
func densityCount(wall string) int {
	env, def := "AIRLOCK_DENSITY", 1000
	if wall == "gvisor" {
		env, def = "AIRLOCK_DENSITY_GVISOR", 50
	}
	if n, err := strconv.Atoi(os.Getenv(env)); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkDensity: N idle sandboxes on one daemon, made 8 at a time
// through the SDK; then every one of them answers an exec (8 at a time),
// and once idle, what each costs: the host's MemAvailable drop, the
// daemon's own growth (RSS, Go heap, goroutines, descriptors) per
// sandbox; last, how long the kill switch takes to end them all, and the
// daemon's CPU time for it.
func BenchmarkDensity(b *testing.B) {
	for _, wall := range []string{"container", "gvisor"} {
		b.Run(wall, func(b *testing.B) {
			if wall == "gvisor" {
				needRunsc(b)
			}
			n := densityCount(wall)
			d := startServe(b)
			ctx := context.Background()
			memBefore := memAvailable(b)
			before := d.metrics(b)
			var mu sync.Mutex
			var ids []string
			start := time.Now()
			parallel(n, 8, func(int) {
				id := d.create(b, &api.CreateSandbox{Isolation: wall, TTL: "1h", Limits: api.Limits{MemoryBytes: 128 << 20}})
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			})
			made := time.Since(start)
			start = time.Now()
			parallel(n, 8, func(i int) {
				if end, err := d.tenant.Exec(ctx, ids[i], trueCmd, nil, nil); err != nil || end.ExitCode != 0 {
					b.Errorf("exec in sandbox %d of %d: %+v %v", i+1, n, end, err)
				}
			})
			answered := time.Since(start)
			time.Sleep(10 * time.Second) // idle: agents and the daemon settle
			after := d.metrics(b)
			memAfter := memAvailable(b)
			start = time.Now()
			cpu := cpuTime(b, d.cmd.Process.Pid)
			gone, err := d.admin.KillAll(ctx, "")
			killed := time.Since(start)
			killCPU := cpuTime(b, d.cmd.Process.Pid) - cpu
			if err != nil || len(gone) != n {
				b.Fatalf("kill switch: %d of %d ended: %v", len(gone), n, err)
			}
			per := func(k string) float64 { return (after[k] - before[k]) / float64(n) }
			b.ReportMetric(float64(n)/made.Seconds(), "creates/s")
			b.ReportMetric(float64(n)/answered.Seconds(), "first-execs/s")
			b.ReportMetric(float64(memBefore-memAfter)/float64(n)/(1<<20), "host-MiB/sandbox")
			b.ReportMetric(per("process_resident_memory_bytes")/1024, "daemon-rss-KiB/sandbox")
			b.ReportMetric(per("go_memstats_heap_inuse_bytes")/1024, "daemon-heap-KiB/sandbox")
			b.ReportMetric(per("go_goroutines"), "goroutines/sandbox")
			b.ReportMetric(per("process_open_fds"), "fds/sandbox")
			b.ReportMetric(killed.Seconds(), "kill-all-s")
			b.ReportMetric(killCPU.Seconds(), "kill-all-daemon-cpu-s")
			b.ReportMetric(0, "ns/op")
			b.Logf("%d %s sandboxes: made at %.0f/s, all answered an exec at %.0f/s; idle, each costs the host %.2f MiB (MemAvailable) and the daemon %.0f KiB RSS (%.0f KiB heap), %.1f goroutines, %.1f fds; kill-all %.2f s (the daemon's CPU %.2f s)",
				n, wall, float64(n)/made.Seconds(), float64(n)/answered.Seconds(), float64(memBefore-memAfter)/float64(n)/(1<<20),
				per("process_resident_memory_bytes")/1024, per("go_memstats_heap_inuse_bytes")/1024, per("go_goroutines"), per("process_open_fds"), killed.Seconds(), killCPU.Seconds())
		})
	}
}

// parallel runs f(0..n-1), width at a time.
func parallel(n, width int, f func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, width)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}

// metrics reads the daemon's own gauges from its /metrics (admin key).
func (d *daemon) metrics(b *testing.B) map[string]float64 {
	b.Helper()
	sock := d.dir + "/airlock.sock"
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	key, err := os.ReadFile(d.dir + "/lib/admin.key")
	if err != nil {
		b.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://airlock/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(key)))
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		b.Fatalf("metrics: %s %s", resp.Status, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				out[f[0]] = v
			}
		}
	}
	for _, k := range []string{"process_resident_memory_bytes", "go_memstats_heap_inuse_bytes", "go_goroutines", "process_open_fds"} {
		if _, ok := out[k]; !ok {
			b.Fatalf("metrics: no %s", k)
		}
	}
	return out
}

// cpuTime is the user and system CPU time process pid used so far.
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// After the command name (in parentheses, which may hold anything):
	// state is field 3, utime 14, stime 15, in clock ticks (100 a second).
	_, rest, _ := strings.Cut(string(st), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, st)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// memAvailable is the host's MemAvailable, in bytes.
func memAvailable(b *testing.B) int64 {
	b.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if _, err := fmt.Sscanf(sc.Text(), "MemAvailable: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	b.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}
