package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

var airlockBin, attackBin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("bench: skipped: airlock needs root")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "airlock-bench-")
	if err != nil {
		panic(err)
	}
	airlockBin = filepath.Join(dir, "airlock")
	// `airlock run` keeps its audit logs under the user's state directory:
	// the benchmark's own, not root's.
	os.Setenv("XDG_STATE_HOME", filepath.Join(dir, "state"))
	attackBin = filepath.Join(dir, "attack")
	// airlock runs the airlock-init beside it in every sandbox.
	for bin, pkg := range map[string]string{airlockBin: "../cmd/airlock", filepath.Join(dir, "airlock-init"): "../cmd/airlock-init", attackBin: "../test/attack"} {
		build := exec.Command("go", "build", "-ldflags", "-s -w", "-o", bin, pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Printf("build %s: %v\n%s", pkg, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// bwrapArgs is bubblewrap's closest equivalent of `airlock run -- true`:
// every namespace, the host's /usr read-only, fresh /proc, /dev and /tmp.
// It sets up no cgroups, no seccomp filter and no overlay; airlock does.
var bwrapArgs = []string{
	"--unshare-all", "--die-with-parent",
	"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
	"--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
	"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true",
}

type sample struct {
	wall    time.Duration
	maxRSS  int64 // of the launcher process, bytes
	sandbox int64 // airlock: the sandbox cgroup's peak, bytes
}

func runOnce(b *testing.B, name string, args ...string) sample {
	cmd := exec.Command(name, args...)
	start := time.Now()
	out, err := cmd.Output()
	wall := time.Since(start)
	if err != nil {
		b.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	s := sample{wall: wall, maxRSS: cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss * 1024}
	if name == airlockBin {
		var res struct {
			Peak int64 `json:"peak_memory_bytes"`
		}
		if err := json.Unmarshal(out, &res); err == nil {
			s.sandbox = res.Peak
		}
	}
	return s
}

func median(xs []sample, f func(sample) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkColdStart alternates `airlock run -- true` with bwrap's
// equivalent and reports both medians, their ratio, and peak memory.
func BenchmarkColdStart(b *testing.B) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bubblewrap is not installed (apt-get install bubblewrap)")
	}
	runs := max(b.N, 50)
	for i := 0; i < 5; i++ { // warm the caches of both
		runOnce(b, airlockBin, "run", "--json", "--", "true")
		runOnce(b, bwrap, bwrapArgs...)
	}
	var al, bw []sample
	b.ResetTimer()
	for i := 0; i < runs; i++ {
		al = append(al, runOnce(b, airlockBin, "run", "--json", "--", "true"))
		bw = append(bw, runOnce(b, bwrap, bwrapArgs...))
	}
	b.StopTimer()
	ms := func(s sample) float64 { return float64(s.wall.Microseconds()) / 1000 }
	mib := func(n float64) float64 { return n / (1 << 20) }
	a, w := median(al, ms), median(bw, ms)
	b.ReportMetric(a, "airlock-ms")
	b.ReportMetric(w, "bwrap-ms")
	b.ReportMetric(a/w, "ratio")
	b.ReportMetric(mib(median(al, func(s sample) float64 { return float64(s.maxRSS) })), "airlock-rss-MiB")
	b.ReportMetric(mib(median(al, func(s sample) float64 { return float64(s.sandbox) })), "sandbox-peak-MiB")
	b.ReportMetric(mib(median(bw, func(s sample) float64 { return float64(s.maxRSS) })), "bwrap-rss-MiB")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d runs each: airlock median %.2f ms, bwrap median %.2f ms, ratio %.2fx", runs, a, w, a/w)
}
