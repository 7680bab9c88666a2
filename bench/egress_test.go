package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/test/fakenet"
)

// inHost runs airlock in the fake internet's stand-in host.
func inHost(b *testing.B, fi *fakenet.Internet, args ...string) string {
	b.Helper()
	cmd := exec.Command(airlockBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var err error
	fakenet.InNS(b, fi.Host, func() { err = cmd.Start() })
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		b.Fatalf("airlock %v: %v\n%s%s", args, err, out.String(), errb.String())
	}
	return out.String()
}

// directClient dials from the stand-in host namespace, without airlock.
func directClient(b *testing.B, fi *fakenet.Internet) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			fakenet.InNS(b, fi.Host, func() { c, err = (&net.Dialer{}).DialContext(ctx, network, addr) })
			return c, err
		},
		MaxIdleConnsPerHost: 4,
	}}
}

// sandboxRun opens the world's TEST-NET-1 servers, which the guard blocks
// like every documentation range, as an operator would.
func sandboxRun(fi *fakenet.Internet, ws string, args ...string) []string {
	full := []string{"run", "--dns-upstream", "192.0.2.53:53", "--egress-allow-net", "192.0.2.0/24", "--allow", "bench.test", "--workspace", ws, "--", "/workspace/attack"}
	return append(full, args...)
}

// BenchmarkEgress measures the proxy against a direct connection from the
// host, in one run: a 100 MiB download (7 each way), small GETs on a kept-alive
// connection (latency and requests per second), and what proxy mode adds
// to a cold `airlock run -- true`.
func BenchmarkEgress(b *testing.B) {
	fi := fakenet.New(b)
	ws := b.TempDir()
	helper, _ := os.ReadFile(attackBin)
	_ = os.WriteFile(filepath.Join(ws, "attack"), helper, 0o755)
	direct := directClient(b, fi)
	b.ResetTimer()

	// Throughput: 7 downloads each way, alternated; the ratio is the
	// median of each pair's (on a shared host the load drifts between
	// pairs more than within one).
	const pairs = 7
	var prox, dir, ratio []float64
	for i := 0; i < pairs; i++ {
		out := inHost(b, fi, sandboxRun(fi, ws, "download", "http://bench.test/big")...)
		var n int64
		var secs float64
		if _, err := fmt.Sscanf(strings.TrimSpace(out), "BYTES %d SECONDS %f", &n, &secs); err != nil || n != 100<<20 {
			b.Fatalf("download through the proxy: %q", out)
		}
		prox = append(prox, float64(n)/secs/(1<<20))
		start := time.Now()
		resp, err := direct.Get("http://192.0.2.12/big")
		if err != nil {
			b.Fatal(err)
		}
		n, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		dir = append(dir, float64(n)/time.Since(start).Seconds()/(1<<20))
		ratio = append(ratio, prox[i]/dir[i]*100)
	}
	slices.Sort(prox)
	slices.Sort(dir)
	slices.Sort(ratio)
	b.ReportMetric(prox[pairs/2], "proxy-MiB/s")
	b.ReportMetric(dir[pairs/2], "direct-MiB/s")
	b.ReportMetric(ratio[pairs/2], "throughput-%")

	// Small GETs.
	const n = 2000
	out := inHost(b, fi, sandboxRun(fi, ws, "getloop", "http://bench.test/", fmt.Sprint(n))...)
	var proxMed, proxRPS float64
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "MEDIAN_US %f RPS %f", &proxMed, &proxRPS); err != nil {
		b.Fatalf("getloop: %q", out)
	}
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		resp, err := direct.Get("http://192.0.2.12/")
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lat = append(lat, time.Since(t0))
	}
	dirRPS := float64(n) / time.Since(start).Seconds()
	slices.Sort(lat)
	dirMed := float64(lat[n/2].Microseconds())
	b.ReportMetric(proxRPS, "proxy-req/s")
	b.ReportMetric(dirRPS, "direct-req/s")
	b.ReportMetric((proxMed-dirMed)/1000, "added-median-ms")

	// Cold start with and without proxy mode (in the stand-in host).
	var plain, proxied []float64
	for i := 0; i < 30; i++ {
		t0 := time.Now()
		inHost(b, fi, "run", "--", "true")
		plain = append(plain, float64(time.Since(t0).Microseconds())/1000)
		t0 = time.Now()
		inHost(b, fi, "run", "--dns-upstream", "192.0.2.53:53", "--allow", "bench.test", "--", "true")
		proxied = append(proxied, float64(time.Since(t0).Microseconds())/1000)
	}
	slices.Sort(plain)
	slices.Sort(proxied)
	b.ReportMetric(plain[15], "run-true-ms")
	b.ReportMetric(proxied[15], "run-true-proxy-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("download: proxy %.0f MiB/s, direct %.0f MiB/s (%.0f%%, pairs %.0f-%.0f%%); small GETs: proxy %.0f req/s median %.0fus, direct %.0f req/s median %.0fus (+%.3f ms); run -- true: %.1f ms, with proxy mode %.1f ms",
		prox[pairs/2], dir[pairs/2], ratio[pairs/2], ratio[0], ratio[pairs-1], proxRPS, proxMed, dirRPS, dirMed, (proxMed-dirMed)/1000, plain[15], proxied[15])
}

// BenchmarkEgressByWall measures the proxy's download throughput (100 MiB
// from the fake internet, median of 3) from a gvisor sandbox against a
// container sandbox, in one run. The gvisor wall needs runsc installed
// (scripts/runsc.sh).
func BenchmarkEgressByWall(b *testing.B) {
	fi := fakenet.New(b)
	ws := b.TempDir()
	helper, _ := os.ReadFile(attackBin)
	_ = os.WriteFile(filepath.Join(ws, "attack"), helper, 0o755)
	b.ResetTimer()
	med := map[string]float64{}
	for _, wall := range []string{"container", "gvisor"} {
		var rates []float64
		for i := 0; i < 3; i++ {
			args := sandboxRun(fi, ws, "download", "http://bench.test/big")
			out := inHost(b, fi, append([]string{"run", "--isolation", wall}, args[1:]...)...)
			var n int64
			var secs float64
			if _, err := fmt.Sscanf(strings.TrimSpace(out), "BYTES %d SECONDS %f", &n, &secs); err != nil || n != 100<<20 {
				b.Fatalf("%s: download through the proxy: %q", wall, out)
			}
			rates = append(rates, float64(n)/secs/(1<<20))
		}
		slices.Sort(rates)
		med[wall] = rates[1]
	}
	b.ReportMetric(med["container"], "container-MiB/s")
	b.ReportMetric(med["gvisor"], "gvisor-MiB/s")
	b.ReportMetric(med["gvisor"]/med["container"]*100, "gvisor-%")
	b.ReportMetric(0, "ns/op")
	b.Logf("download through the proxy: container %.0f MiB/s, gvisor %.0f MiB/s (%.0f%%)", med["container"], med["gvisor"], med["gvisor"]/med["container"]*100)
}
