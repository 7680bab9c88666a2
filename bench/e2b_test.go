package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// BenchmarkE2BFront: the same work through the E2B front, driven by the
// unmodified E2B JS SDK (test/e2b/bench.mjs, the pinned e2b from npm ci
// in test/e2b), and through airlock's API with its Go SDK, on one daemon
// in one run: create → first output of `echo hi` (p50, p99), a
// commands.run('true') round trip (both run bash -l -c, as the SDK does),
// 10 MiB written and read (median MiB/s), and a small GET of a server
// inside through the E2B port front (getHost(8000), the tenant's key)
// against the API's port front and the same GET made inside (added p50).
// The E2B side speaks HTTP over loopback TCP, airlock's SDK over the unix
// socket. Skipped without node or the SDK.
func BenchmarkE2BFront(b *testing.B) {
	dir, _ := filepath.Abs("../test/e2b")
	if _, err := exec.LookPath("node"); err != nil {
		b.Skip("node: ", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
		b.Skip("the E2B SDK (npm ci in test/e2b): ", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d := startServe(b, "--e2b-listen", addr)
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if i > 1000 {
			b.Fatal("the E2B front did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx := context.Background()
	n := max(b.N, 20)

	// The E2B SDK.
	nctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(nctx, "node", "bench.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr,
		"E2B_API_KEY="+d.key, "N="+strconv.Itoa(n))
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		b.Fatalf("node bench.mjs: %v\n%s", err, se.String())
	}
	var e2b struct {
		CreateFirstOutput, Run, Get []float64
		WriteMibs, ReadMibs         []float64
		Sandbox                     string
	}
	if err := json.Unmarshal(so.Bytes(), &e2b); err != nil || e2b.Sandbox == "" {
		b.Fatalf("node bench.mjs: %v %s", err, so.String())
	}
	defer func() { _ = d.tenant.Destroy(ctx, e2b.Sandbox) }()

	// airlock's Go SDK: the same, on a sandbox of its own.
	var first, runs []time.Duration
	var wmibs, rmibs []float64
	echo := &api.Exec{Cmd: []string{"/bin/bash", "-l", "-c", "echo hi"}}
	for range n {
		t0 := time.Now()
		id := d.create(b, &api.CreateSandbox{TTL: "5m"})
		st, err := d.tenant.ExecStream(ctx, id, echo)
		if err != nil {
			b.Fatal(err)
		}
		for {
			ev, err := st.Next()
			if err != nil || ev.End != nil {
				b.Fatalf("echo hi: %v %+v", err, ev)
			}
			if len(ev.Stdout) > 0 {
				break
			}
		}
		first = append(first, time.Since(t0))
		st.Close()
		_ = d.tenant.Destroy(ctx, id)
	}
	id := d.create(b, &api.CreateSandbox{TTL: "30m"})
	defer func() { _ = d.tenant.Destroy(ctx, id) }()
	tr := &api.Exec{Cmd: []string{"/bin/bash", "-l", "-c", "true"}}
	for i := range n*5 + 5 {
		t0 := time.Now()
		if end, err := d.tenant.Exec(ctx, id, tr, io.Discard, io.Discard); err != nil || end.ExitCode != 0 {
			b.Fatalf("true: %v %+v", err, end)
		}
		if i >= 5 {
			runs = append(runs, time.Since(t0))
		}
	}
	blob := bytes.Repeat([]byte{7}, 10<<20)
	for range 5 {
		t0 := time.Now()
		if err := d.tenant.WriteFile(ctx, id, "/tmp/ten", blob, 0o644); err != nil {
			b.Fatal(err)
		}
		wmibs = append(wmibs, 10/time.Since(t0).Seconds())
		t0 = time.Now()
		back, err := d.tenant.ReadFile(ctx, id, "/tmp/ten")
		if err != nil || len(back) != len(blob) {
			b.Fatalf("read: %d bytes, %v", len(back), err)
		}
		rmibs = append(rmibs, 10/time.Since(t0).Seconds())
	}

	// The E2B SDK's server, through the API's port front and from inside.
	hc := d.tenant.PortClient()
	var apiGets []time.Duration
	for i := range len(e2b.Get) + 20 {
		t0 := time.Now()
		res, err := hc.Get(d.tenant.PortURL(e2b.Sandbox, 8000, "/small"))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			b.Fatalf("GET through the API: %s", res.Status)
		}
		if i >= 20 {
			apiGets = append(apiGets, time.Since(t0))
		}
	}
	var io1, ie bytes.Buffer
	end, err := d.tenant.Exec(ctx, e2b.Sandbox, &api.Exec{Cmd: []string{"python3", "-c", portBenchInside, strconv.Itoa(len(e2b.Get))}}, &io1, &ie)
	if err != nil || end.ExitCode != 0 {
		b.Fatalf("inside: %v %+v %s", err, end, ie.String())
	}
	inside, err := strconv.ParseFloat(strings.TrimSpace(io1.String()), 64)
	if err != nil {
		b.Fatalf("inside: %q", io1.String())
	}

	report := func(name string, e2bV, airlockV float64, unit string) {
		b.ReportMetric(e2bV, "e2b-"+name+"-"+unit)
		b.ReportMetric(airlockV, "airlock-"+name+"-"+unit)
	}
	report("first-output-p50", pct(e2b.CreateFirstOutput, 0.5), percentile(first, 0.5), "ms")
	report("first-output-p99", pct(e2b.CreateFirstOutput, 0.99), percentile(first, 0.99), "ms")
	report("run-p50", pct(e2b.Run, 0.5), percentile(runs, 0.5), "ms")
	report("run-p99", pct(e2b.Run, 0.99), percentile(runs, 0.99), "ms")
	report("write10MiB", pct(e2b.WriteMibs, 0.5), pct(wmibs, 0.5), "MiB/s")
	report("read10MiB", pct(e2b.ReadMibs, 0.5), pct(rmibs, 0.5), "MiB/s")
	report("port-get-p50", pct(e2b.Get, 0.5), percentile(apiGets, 0.5), "ms")
	b.ReportMetric(inside, "inside-get-p50-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("create → first output p50/p99: E2B SDK %.1f/%.1f ms, Go SDK %.1f/%.1f ms (%d each)",
		pct(e2b.CreateFirstOutput, 0.5), pct(e2b.CreateFirstOutput, 0.99), percentile(first, 0.5), percentile(first, 0.99), n)
	b.Logf("commands.run('true') p50/p99: E2B SDK %.2f/%.2f ms, Go SDK Exec %.2f/%.2f ms (%d each)",
		pct(e2b.Run, 0.5), pct(e2b.Run, 0.99), percentile(runs, 0.5), percentile(runs, 0.99), len(runs))
	b.Logf("10 MiB write/read, median: E2B SDK %.0f/%.0f MiB/s, Go SDK %.0f/%.0f MiB/s",
		pct(e2b.WriteMibs, 0.5), pct(e2b.ReadMibs, 0.5), pct(wmibs, 0.5), pct(rmibs, 0.5))
	b.Logf("a small GET of a server inside, p50: E2B port front %.2f ms (+%.2f), API port front %.2f ms (+%.2f), inside %.2f ms (%d each)",
		pct(e2b.Get, 0.5), pct(e2b.Get, 0.5)-inside, percentile(apiGets, 0.5), percentile(apiGets, 0.5)-inside, inside, len(apiGets))
}

// pct is the p-th quantile of xs.
func pct(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}
