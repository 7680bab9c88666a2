package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
)

// BenchmarkAuditAppend: records per second into the audit log with group
// commit, from 64 writers that each wait for their record to be on disk
// (fsynced), and from writers that do not wait.
func BenchmarkAuditAppend(b *testing.B) {
	dir := b.TempDir()
	key, err := audit.LoadOrCreateKey(filepath.Join(dir, "key.pem"))
	if err != nil {
		b.Fatal(err)
	}
	data, _ := json.Marshal(map[string]any{"argv": []string{"python3", "-m", "pytest", "-q"}, "cwd": "/workspace", "user": "user", "env": []string{"PATH", "HOME", "LANG"}})
	rec := audit.Record{Kind: "exec.start", Tenant: "alice", Sandbox: "0123456789ab", Trigger: "T-42", Data: data}
	run := func(name string, wait bool) {
		l, err := audit.Open(filepath.Join(dir, name), key, audit.Options{})
		if err != nil {
			b.Fatal(err)
		}
		const writers, each = 64, 2000
		var wg sync.WaitGroup
		t0 := time.Now()
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					var err error
					if wait {
						err = l.Commit(context.Background(), rec)
					} else {
						err = l.Append(rec)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		rate := float64(writers*each) / time.Since(t0).Seconds()
		b.ReportMetric(rate, name+"-records/s")
		b.Logf("%s: %.0f records/s", name, rate)
		os.RemoveAll(filepath.Join(dir, name))
	}
	b.ResetTimer()
	run("committed", true)
	run("appended", false)
	b.ReportMetric(0, "ns/op")
}
