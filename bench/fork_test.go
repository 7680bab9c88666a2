package bench

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// hold100 holds 100 MiB resident, of random bytes (a checkpoint
// compresses what it saves: pages of zeros would cost it nothing), says
// so in /tmp/ready, and sleeps.
const hold100 = `import os
b = os.urandom(100 << 20)
open("/tmp/ready", "w").close()
import time
time.sleep(1e9)
`

// BenchmarkGVisorFork: airlock fork --count 4 of a gvisor sandbox holding
// 100 MiB resident: the whole call, the checkpoint (the source paused),
// and each copy's create (restored at once, from one checkpoint).
func BenchmarkGVisorFork(b *testing.B) {
	needRunsc(b)
	d := startServe(b)
	ctx := context.Background()
	src := d.create(b, &api.CreateSandbox{Isolation: "gvisor", Limits: api.Limits{MemoryBytes: 1 << 30}})
	s, err := d.tenant.ExecStream(ctx, src, &api.Exec{Cmd: []string{"python3", "-c", hold100}, Background: true})
	if err != nil {
		b.Fatal(err)
	}
	if ev, err := s.Next(); err != nil || ev.PID == 0 {
		b.Fatalf("start: %+v %v", ev, err)
	}
	s.Close()
	for i := 0; ; i++ {
		end, err := d.tenant.Exec(ctx, src, &api.Exec{Cmd: []string{"test", "-e", "/tmp/ready"}}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		if end.ExitCode == 0 {
			break
		}
		if i > 600 {
			b.Fatal("the 100 MiB were never written")
		}
		time.Sleep(100 * time.Millisecond)
	}
	start := time.Now()
	f, err := d.tenant.Fork(ctx, src, 4)
	if err != nil {
		b.Fatal(err)
	}
	total := time.Since(start)
	for _, sb := range f.Sandboxes {
		if err := d.tenant.Destroy(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
	}
	ms := slices.Clone(f.CreateMillis)
	slices.Sort(ms)
	b.ReportMetric(float64(total.Milliseconds()), "total-ms")
	b.ReportMetric(float64(f.CheckpointMillis), "checkpoint-ms")
	b.ReportMetric(float64(ms[len(ms)/2]), "create-p50-ms")
	b.ReportMetric(float64(ms[len(ms)-1]), "create-max-ms")
	b.ReportMetric(float64(f.MemoryBytes)/(1<<20), "memory-MiB")
	b.ReportMetric(0, "ns/op")
	b.Logf("fork of 4 from 100 MiB resident: %v in all; checkpoint %d ms (%.0f MiB of memory, %.0f MiB in all); copies' creates %v ms",
		total.Round(time.Millisecond), f.CheckpointMillis, float64(f.MemoryBytes)/(1<<20), float64(f.Bytes)/(1<<20), f.CreateMillis)
}
