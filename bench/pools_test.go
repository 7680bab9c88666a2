package bench

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// waitReady polls the pool until it holds ready sandboxes.
func (d *daemon) waitReady(b *testing.B, name string, ready int) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := d.tenant.Pool(context.Background(), name)
		if err != nil {
			b.Fatal(err)
		}
		if p.Ready >= ready {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("pool %s: %+v", name, p)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkServePools: the latency of a create that takes a pooled
// sandbox (a hit) under 8 concurrent clients (p50, p99) and from one
// client, and create → first exec answered, pooled against unpooled, one
// at a time, in one run. Each round fills the pool, lets the clients empty it, and destroys
// what they took (outside the timings).
func BenchmarkServePools(b *testing.B) {
	d := startServe(b)
	ctx := context.Background()
	const clients, perClient = 8, 2
	lim := api.Limits{MemoryBytes: 256 << 20}
	if _, err := d.tenant.SetPool(ctx, "bench", &api.SetPool{Size: clients * perClient, Limits: lim}); err != nil {
		b.Fatal(err)
	}
	rounds := max(b.N, 8)
	var hits []time.Duration
	misses := 0
	var mu sync.Mutex
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		d.waitReady(b, "bench", clients*perClient)
		var ids []string
		var wg sync.WaitGroup
		for c := 0; c < clients; c++ {
			wg.Go(func() {
				for i := 0; i < perClient; i++ {
					t0 := time.Now()
					sb, err := d.tenant.CreateSandbox(ctx, &api.CreateSandbox{Pool: "bench", Env: map[string]string{"N": "1"}})
					took := time.Since(t0)
					if err != nil {
						b.Error(err)
						return
					}
					mu.Lock()
					ids = append(ids, sb.ID)
					if sb.Pool == "bench" {
						hits = append(hits, took)
					} else {
						misses++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for _, id := range ids {
			if err := d.tenant.Destroy(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	}
	// create → first exec answered, one at a time; and the create alone.
	firstExec := func(req *api.CreateSandbox, pooled bool) (out, creates []time.Duration) {
		for i := 0; i < 30; i++ {
			if pooled {
				d.waitReady(b, "bench", 1)
			}
			t0 := time.Now()
			sb, err := d.tenant.CreateSandbox(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			creates = append(creates, time.Since(t0))
			if end, err := d.tenant.Exec(ctx, sb.ID, trueCmd, nil, nil); err != nil || end.ExitCode != 0 {
				b.Fatalf("exec: %+v %v", end, err)
			}
			took := time.Since(t0)
			if (sb.Pool == "bench") != pooled {
				b.Fatalf("pooled %v, got %+v", pooled, sb)
			}
			out = append(out, took)
			if err := d.tenant.Destroy(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
		}
		return out, creates
	}
	warm, serial := firstExec(&api.CreateSandbox{Pool: "bench"}, true)
	cold, _ := firstExec(&api.CreateSandbox{Limits: api.Limits{MemoryBytes: 255 << 20}}, false)
	b.StopTimer()
	if len(hits) == 0 {
		b.Fatalf("no hits (%d misses)", misses)
	}
	h50, h99 := percentile(hits, 0.5), percentile(hits, 0.99)
	w50, w99, c50, c99 := percentile(warm, 0.5), percentile(warm, 0.99), percentile(cold, 0.5), percentile(cold, 0.99)
	b.ReportMetric(h50, "hit-create-p50-ms")
	b.ReportMetric(h99, "hit-create-p99-ms")
	s50 := percentile(serial, 0.5)
	b.ReportMetric(s50, "hit-create-serial-p50-ms")
	b.ReportMetric(w50, "pooled-first-exec-p50-ms")
	b.ReportMetric(c50, "unpooled-first-exec-p50-ms")
	b.ReportMetric(c50/w50, "ratio")
	b.ReportMetric(0, "ns/op")
	b.Logf("pool-hit create, %d clients: p50 %.2f ms, p99 %.2f ms (%d hits, %d misses), one client: p50 %.2f ms; create→first exec: pooled p50 %.2f / p99 %.2f ms, unpooled p50 %.2f / p99 %.2f ms (%.1fx)",
		clients, h50, h99, len(hits), misses, s50, w50, w99, c50, c99, c50/w50)
}
