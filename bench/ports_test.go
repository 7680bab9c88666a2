package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// portBenchServer serves /tmp/www on the sandbox's 127.0.0.1:8000: a
// small file and a 64 MiB one.
const portBenchServer = `
import functools, http.server, os
os.makedirs('/tmp/www', exist_ok=True)
open('/tmp/www/small', 'w').write('x' * 100)
with open('/tmp/www/big', 'wb') as f:
    f.write(b'\0' * (64 << 20))
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(('127.0.0.1', 8000), functools.partial(H, directory='/tmp/www'))
print('ready', flush=True)
s.serve_forever()
`

// portBenchInside times n GETs of /small from inside the sandbox, each
// on a new connection, and prints their median in ms.
const portBenchInside = `
import http.client, sys, time
ts = []
for i in range(int(sys.argv[1])):
    t = time.perf_counter()
    c = http.client.HTTPConnection('127.0.0.1', 8000)
    c.request('GET', '/small')
    c.getresponse().read()
    c.close()
    ts.append(time.perf_counter() - t)
ts.sort()
print(ts[len(ts) // 2] * 1000)
`

// BenchmarkPortFront: a small GET of a server inside a sandbox through
// the daemon's port front (/v1/sandboxes/{id}/ports/8000/..., over the
// unix socket, the tenant's key; each request a new connection to the
// sandbox, relayed by its agent, and a port.connect record), beside the
// same GET made inside the sandbox (python's http.client to 127.0.0.1):
// the p50 the front adds; and a 64 MiB GET through the front (the
// relay's throughput). On each wall (gvisor when runsc is installed).
func BenchmarkPortFront(b *testing.B) {
	d := startServe(b)
	walls := []string{"container"}
	if _, err := os.Stat(runscBin); err == nil {
		walls = append(walls, "gvisor")
	}
	for _, w := range walls {
		b.Run(w, func(b *testing.B) { portFront(b, d, w) })
	}
}

func portFront(b *testing.B, d *daemon, wall string) {
	ctx := context.Background()
	id := d.create(b, &api.CreateSandbox{Isolation: wall})
	defer func() { _ = d.tenant.Destroy(ctx, id) }()
	st, err := d.tenant.ExecStream(ctx, id, &api.Exec{Cmd: []string{"python3", "-u", "-c", portBenchServer}, Background: true})
	if err != nil {
		b.Fatal(err)
	}
	ev, err := st.Next()
	st.Close()
	if err != nil || ev.PID == 0 {
		b.Fatalf("server: %+v %v", ev, err)
	}
	logs, err := d.tenant.Logs(ctx, id, ev.PID, true)
	if err != nil {
		b.Fatal(err)
	}
	var out bytes.Buffer
	for !strings.Contains(out.String(), "ready") {
		ev, err := logs.Next()
		if err != nil || ev.End != nil {
			b.Fatalf("server: %v %+v %s", err, ev, out.String())
		}
		out.Write(ev.Stdout)
		out.Write(ev.Stderr)
	}
	logs.Close()
	hc := d.tenant.PortClient()
	get := func(path string) int64 {
		res, err := hc.Get(d.tenant.PortURL(id, 8000, path))
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			b.Fatalf("GET %s: %s", path, res.Status)
		}
		return n
	}
	for range 20 {
		get("/small")
	}
	runs := max(b.N, 300)
	var front []time.Duration
	b.ResetTimer()
	for range runs {
		t0 := time.Now()
		get("/small")
		front = append(front, time.Since(t0))
	}
	b.StopTimer()
	var so, se bytes.Buffer
	end, err := d.tenant.Exec(ctx, id, &api.Exec{Cmd: []string{"python3", "-c", portBenchInside, strconv.Itoa(runs)}}, &so, &se)
	if err != nil || end.ExitCode != 0 {
		b.Fatalf("inside: %v %+v %s", err, end, se.String())
	}
	inside, err := strconv.ParseFloat(strings.TrimSpace(so.String()), 64)
	if err != nil {
		b.Fatalf("inside: %q", so.String())
	}
	t0 := time.Now()
	n := get("/big")
	mbps := float64(n) / (1 << 20) / time.Since(t0).Seconds()
	f50 := percentile(front, 0.5)
	b.ReportMetric(f50, "front-p50-ms")
	b.ReportMetric(percentile(front, 0.99), "front-p99-ms")
	b.ReportMetric(inside, "inside-p50-ms")
	b.ReportMetric(f50-inside, "added-p50-ms")
	b.ReportMetric(mbps, "64MiB-MiB/s")
	b.ReportMetric(0, "ns/op")
	b.Logf("%s: %d GETs through the front p50 %.2f ms (p99 %.2f), inside p50 %.2f ms: added %.2f ms; 64 MiB through the front at %.0f MiB/s",
		wall, runs, f50, percentile(front, 0.99), inside, f50-inside, mbps)
}
