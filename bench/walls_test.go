package bench

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// BenchmarkServeExecByWall: `true` in an existing sandbox through the SDK,
// on a container sandbox and on a gvisor one of the same daemon, the two
// interleaved (so that a busy host weighs on both alike); and the median
// `airlock run -- true` of each wall. The gvisor wall needs runsc
// installed (scripts/runsc.sh).
func BenchmarkServeExecByWall(b *testing.B) {
	needRunsc(b)
	d := startServe(b)
	ctx := context.Background()
	walls := []string{"container", "gvisor"}
	ids := map[string]string{}
	for _, w := range walls {
		ids[w] = d.create(b, &api.CreateSandbox{Isolation: w})
		for i := 0; i < 20; i++ {
			if _, err := d.tenant.Exec(ctx, ids[w], trueCmd, nil, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	runs := max(b.N, 200)
	took := map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < runs; i++ {
		for _, w := range walls {
			t0 := time.Now()
			end, err := d.tenant.Exec(ctx, ids[w], trueCmd, nil, nil)
			if err != nil || end.ExitCode != 0 {
				b.Fatalf("%s exec: %+v %v", w, end, err)
			}
			took[w] = append(took[w], time.Since(t0))
		}
	}
	start := map[string][]time.Duration{}
	for i := 0; i < 21; i++ {
		for _, w := range walls {
			t0 := time.Now()
			if out, err := exec.Command(airlockBin, "run", "--isolation", w, "--", "true").CombinedOutput(); err != nil {
				b.Fatalf("%s run: %v: %s", w, err, out)
			}
			start[w] = append(start[w], time.Since(t0))
		}
	}
	b.StopTimer()
	median := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds()) / 1000
	}
	c50, g50, g99 := percentile(took["container"], 0.5), percentile(took["gvisor"], 0.5), percentile(took["gvisor"], 0.99)
	b.ReportMetric(c50, "container-exec-p50-ms")
	b.ReportMetric(percentile(took["container"], 0.99), "container-exec-p99-ms")
	b.ReportMetric(g50, "gvisor-exec-p50-ms")
	b.ReportMetric(g99, "gvisor-exec-p99-ms")
	b.ReportMetric(g50/c50, "gvisor-exec-ratio")
	b.ReportMetric(median(start["container"]), "container-run-true-median-ms")
	b.ReportMetric(median(start["gvisor"]), "gvisor-run-true-median-ms")
	b.ReportMetric(0, "ns/op")
}
