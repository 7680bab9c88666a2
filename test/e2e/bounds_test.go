package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// daemonCPU is the daemon's CPU time so far (user + system).
func (d *daemonProc) cpu(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// Issue 12, items 9 and 14: what one API call may make the daemon do is
// bounded, and values it cannot mean are refused. Each subtest performs
// the attack the review found and sees it fail.
func TestServeInputBounds(t *testing.T) {
	forEachWall(t, serveInputBounds)
}

func serveInputBounds(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data, "--max-background-execs", "2", "--max-background-execs-per-tenant", "3")
	ctx := context.Background()
	c := d.tenant(t, "bounds", api.Quotas{})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID

	t.Run("scanner", func(t *testing.T) { boundsScanner(t, ctx, d, c, id) })

	t.Run("unauthenticated flood", func(t *testing.T) { boundsUnauthenticatedFlood(t, ctx, d) })

	t.Run("background execs", func(t *testing.T) { boundsBackgroundExecs(t, ctx, c, id) })

	t.Run("missing cwd", func(t *testing.T) { boundsMissingCwd(t, ctx, c, id) })

	t.Run("values the host cannot mean", func(t *testing.T) { boundsValuesTheHostCannotMean(t, ctx, d, c, id) })

	t.Run("audit index", func(t *testing.T) { boundsAuditIndex(t, ctx, data, d, c, id) })
}

// Before: a 4 MiB write cost seconds of the daemon's CPU; a blocked
// 179 KB write made 9,344 fsynced records.
func boundsScanner(t *testing.T, ctx context.Context, d *daemonProc, c *client.Client, id string) {
	r := rand.New(rand.NewPCG(9, 12))
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alnum[r.IntN(len(alnum))]
		}
		return string(b)
	}
	var hostile strings.Builder // gitleaks' generic rule at its most costly
	for hostile.Len() < 4<<20 {
		fmt.Fprintf(&hostile, "api_key=%s\n", word(16))
	}
	before := len(secretRecords(t, d, id))
	cpu0 := d.cpu(t)
	err := c.WriteFile(ctx, id, "/workspace/big.txt", []byte(hostile.String()[:4<<20]), 0o644)
	spent := d.cpu(t) - cpu0
	t.Logf("a 4 MiB hostile write cost the daemon %v of CPU", spent)
	wantCode(t, "a 4 MiB write of credentials", err, api.CodeSecretDetected)
	if spent > 3*time.Second {
		t.Errorf("a 4 MiB write cost the daemon %v of CPU", spent)
	}
	var small strings.Builder
	for small.Len() < 179_000 {
		fmt.Fprintf(&small, "ghp_%s\n", word(36))
	}
	err = c.WriteFile(ctx, id, "/workspace/small.txt", []byte(small.String()), 0o644)
	wantCode(t, "a 179 KB write of credentials", err, api.CodeSecretDetected)
	recs := secretRecords(t, d, id)[before:]
	kinds := map[string]int{}
	for _, r := range recs {
		kinds[r.Kind]++
	}
	t.Logf("two blocked writes made %d records: %v", len(recs), kinds)
	if kinds["secret.finding"] != 32 || kinds["secret.scan_summary"] != 2 {
		t.Errorf("records of two blocked writes: %v", kinds)
	}
	var sum struct {
		Dropped int      `json:"findings_dropped"`
		Partly  []string `json:"partly_scanned"`
	}
	_ = json.Unmarshal(recs[len(recs)-1].Data, &sum)
	if sum.Dropped == 0 || len(sum.Partly) != 1 {
		t.Errorf("summary of the 179 KB write: %s", recs[len(recs)-1].Data)
	}
}

func boundsUnauthenticatedFlood(t *testing.T, ctx context.Context, d *daemonProc) {
	const n = 2000
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				bad, _ := client.New(client.Config{Address: d.sock, Key: fmt.Sprintf("airlock_tenant_bad%d", i)})
				_, err := bad.Sandboxes(ctx)
				if code(err) != api.CodeUnauthenticated {
					t.Errorf("a bad key: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(2500 * time.Millisecond) // the next tick records the summary
	failed, err := d.admin.Audit(ctx, "", "auth.failed")
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := d.admin.Audit(ctx, "", "audit.dropped")
	if err != nil {
		t.Fatal(err)
	}
	var counted int
	for _, r := range dropped {
		var s struct {
			Kind    string `json:"kind"`
			Records int    `json:"records"`
		}
		_ = json.Unmarshal(r.Data, &s)
		if s.Kind == "auth.failed" {
			counted += s.Records
		}
	}
	t.Logf("%d bad-key requests: %d auth.failed records, %d counted in summaries", n, len(failed), counted)
	if len(failed) >= n/2 || counted == 0 || len(failed)+counted != n {
		t.Errorf("%d requests: %d records, %d counted as dropped", n, len(failed), counted)
	}
}

func boundsBackgroundExecs(t *testing.T, ctx context.Context, c *client.Client, id string) {
	sb2, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	start := func(sandbox string) (uint32, error) {
		s, err := c.ExecStream(ctx, sandbox, &api.Exec{Cmd: []string{"sleep", "600"}, Background: true})
		if err != nil {
			return 0, err
		}
		defer s.Close()
		ev, err := s.Next()
		if err != nil {
			return 0, err
		}
		return ev.PID, nil
	}
	first, err := start(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := start(id); err != nil {
		t.Fatal(err)
	}
	_, err = start(id)
	wantCode(t, "a third background command in one sandbox (cap 2)", err, api.CodeQuotaExceeded)
	if _, err := start(sb2.ID); err != nil {
		t.Fatal(err)
	}
	_, err = start(sb2.ID)
	wantCode(t, "a fourth background command of one tenant (cap 3)", err, api.CodeQuotaExceeded)
	// Foreground commands are not counted.
	if out, _, end := run(t, c, id, sh("echo fg")); end.ExitCode != 0 || out != "fg\n" {
		t.Errorf("foreground: %q %+v", out, end)
	}
	// One ends: its place is free again.
	if err := c.Signal(ctx, id, first, "KILL"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := start(id)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after one ended: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func boundsMissingCwd(t *testing.T, ctx context.Context, c *client.Client, id string) {
	_, err := c.Exec(ctx, id, &api.Exec{Cmd: []string{"true"}, Cwd: "/no/such/dir"}, nil, nil)
	wantCode(t, "a missing cwd", err, api.CodeInvalidArgument)
	if err == nil || !strings.Contains(err.Error(), "cwd") || strings.Contains(err.Error(), "not found") {
		t.Errorf("a missing cwd: %v", err)
	}
	_, err = c.Exec(ctx, id, &api.Exec{Cmd: []string{"true"}, Cwd: "/etc/hostname"}, nil, nil)
	wantCode(t, "a file as cwd", err, api.CodeInvalidArgument)
	if _, _, end := run(t, c, id, &api.Exec{Cmd: []string{"no-such-command"}, Cwd: "/tmp"}); end.ExitCode != 127 {
		t.Errorf("a missing command: %+v", end)
	}
}

func boundsValuesTheHostCannotMean(t *testing.T, ctx context.Context, d *daemonProc, c *client.Client, id string) {
	for name, req := range map[string]*api.CreateSandbox{
		"memory 2^63-1":       {Limits: api.Limits{MemoryBytes: math.MaxInt64}},
		"disk 2^63-1":         {Limits: api.Limits{DiskBytes: math.MaxInt64}},
		"pids 2^63-1":         {Limits: api.Limits{Pids: math.MaxInt64}},
		"cpus 1e18":           {Limits: api.Limits{CPUs: 1e18}},
		"egress bytes 2^63-1": {Network: api.Network{Mode: "proxy", EgressBytes: math.MaxInt64}},
		"env key A=B":         {Env: map[string]string{"A=B": "c"}},
		"env key with NUL":    {Env: map[string]string{"A\x00": "c"}},
	} {
		_, err := c.CreateSandbox(ctx, req)
		wantCode(t, name, err, api.CodeInvalidArgument)
	}
	_, err := c.Exec(ctx, id, &api.Exec{Cmd: []string{"env"}, Env: map[string]string{"PATH=/tmp/evil:": "x"}}, nil, nil)
	wantCode(t, "an exec env key PATH=...", err, api.CodeInvalidArgument)
	_, err = d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "huge", Quotas: api.Quotas{MaxMemory: math.MaxInt64}})
	wantCode(t, "a quota of 2^63-1", err, api.CodeInvalidArgument)
}

// A tenant's audit read goes through the index beside the log, and
// sees its own records, those appended since its last read too.
func boundsAuditIndex(t *testing.T, ctx context.Context, data string, d *daemonProc, c *client.Client, id string) {
	other := d.tenant(t, "bounds-peer", api.Quotas{})
	osb, err := other.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.Audit(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	run(t, c, id, sh("true"))
	run(t, other, osb.ID, sh("true"))
	again, err := c.Audit(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(again) <= len(first) {
		t.Errorf("records appended since the last read: %d then %d", len(first), len(again))
	}
	me, err := c.Tenants(ctx)
	if err != nil || len(me) != 1 {
		t.Fatalf("the tenant's own record: %+v %v", me, err)
	}
	for _, r := range again {
		if r.Tenant != me[0].ID {
			t.Fatalf("tenant bounds (%s) read a record of %q: %s", me[0].ID, r.Tenant, r.Kind)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "audit", "index", "state")); err != nil {
		t.Errorf("no index: %v", err)
	}
}

// secretRecords are the scanner's records of sandbox id, in order.
func secretRecords(t *testing.T, d *daemonProc, id string) []api.AuditRecord {
	t.Helper()
	recs, err := d.admin.Audit(context.Background(), id, "secret")
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
