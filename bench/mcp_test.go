package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkMCPToolCall measures tool-call round trips of `airlock mcp`
// over stdio from the go-sdk client, as an agent makes them: run_command
// of `true` (a shell started in the sandbox) and read_file of a small
// file, 300 each after a warm-up.
func BenchmarkMCPToolCall(b *testing.B) {
	ws := b.TempDir()
	_ = os.WriteFile(filepath.Join(ws, "small.txt"), []byte("hello from the workspace\n"), 0o644)
	cmd := exec.Command(airlockBin, "mcp", "--workspace", ws)
	c := sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "1"}, nil)
	ctx := context.Background()
	cs, err := c.Connect(ctx, &sdk.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	measure := func(name string, args map[string]any) (p50, p99 float64) {
		const n = 300
		lat := make([]float64, 0, n)
		for i := 0; i < n+20; i++ {
			t0 := time.Now()
			res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
			if err != nil || res.IsError {
				b.Fatalf("%s: %v %+v", name, err, res)
			}
			if i >= 20 {
				lat = append(lat, float64(time.Since(t0).Microseconds())/1000)
			}
		}
		slices.Sort(lat)
		return lat[n/2], lat[n*99/100]
	}
	b.ResetTimer()
	r50, r99 := measure("run_command", map[string]any{"command": "true"})
	f50, f99 := measure("read_file", map[string]any{"path": "small.txt"})
	b.ReportMetric(r50, "run_command-p50-ms")
	b.ReportMetric(r99, "run_command-p99-ms")
	b.ReportMetric(f50, "read_file-p50-ms")
	b.ReportMetric(f99, "read_file-p99-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("run_command true: p50 %.2f ms p99 %.2f ms; read_file: p50 %.2f ms p99 %.2f ms", r50, r99, f50, f99)
}
