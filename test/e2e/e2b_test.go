package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

// e2bDir is the Node test of the E2B front, with the pinned SDK
// (scripts/test.sh installs it: npm ci).
func e2bDir(t *testing.T) string {
	t.Helper()
	dir, _ := filepath.Abs("../e2b")
	_, nerr := exec.LookPath("node")
	_, merr := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	if nerr != nil || merr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node or the E2B SDK missing (run npm ci in test/e2b): %v %v", nerr, merr)
		}
		t.Skipf("node or the E2B SDK missing (run npm ci in test/e2b; under CI=true this fails): %v %v", nerr, merr)
	}
	return dir
}

// freeLoopback is a loopback address nothing listens on now.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// The unmodified E2B JS SDK (test/e2b/test.mjs) drives the daemon's E2B
// front: create, getInfo, setTimeout, list with filters and pages, pause
// and connect, snapshots, metrics, network fields, kill, isRunning, and
// another tenant's key answered as a missing sandbox; the SDK signs in
// with the tenant's E2B-shaped key. The sandbox it
// leaves is then checked through airlock's own API: the same sandbox,
// with the SDK's environment and metadata.
func TestE2BSDK(t *testing.T) {
	dir := e2bDir(t)
	addr := freeLoopback(t)
	data := newDataDir(t)
	d := startDaemon(t, data, "--e2b-listen", addr)
	d.waitLog(t, `"e2b":"`+addr+`"`)
	ctx := context.Background()
	var keys []string
	for _, name := range []string{"e2ba", "e2bb"} {
		tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tn.Key)
	}
	// The SDK signs in with tenant a's E2B-shaped key (airlock tenant
	// e2b-key), b with its airlock key.
	mint := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", data, "tenant", "e2b-key", "e2ba")
	mint.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock)
	e2bKey, err := mint.Output()
	if err != nil || !regexp.MustCompile(`^e2b_[0-9a-f]{40}\n$`).Match(e2bKey) {
		t.Fatalf("airlock tenant e2b-key: %q %v", e2bKey, err)
	}
	runID := fmt.Sprintf("run-%d", os.Getpid())
	cmd := exec.Command("node", "test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr,
		"E2B_API_KEY="+strings.TrimSpace(string(e2bKey)), "E2B_OTHER_KEY="+keys[1], "RUN="+runID)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("node test.mjs: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	t.Logf("node test.mjs:\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var res struct {
		Kept string `json:"kept"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || res.Kept == "" {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	a := d.client(t, keys[0])
	sb, err := a.Sandbox(ctx, res.Kept)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.Metadata["suite"] != runID || sb.Metadata["e2b.template"] != "base" || sb.Image != "host" {
		t.Errorf("the SDK's sandbox through airlock's API: %+v", sb)
	}
	if stdout, _, end := run(t, a, res.Kept, &api.Exec{Cmd: []string{"sh", "-c", "echo $FOO"}}); stdout != "bar\n" || end.ExitCode != 0 {
		t.Errorf("the SDK's envs: %q %+v", stdout, end)
	}
	// Only the kept sandbox is left of the run's.
	if live, err := a.Sandboxes(ctx); err != nil || len(live) != 1 || live[0].ID != res.Kept {
		t.Errorf("live sandboxes after the run: %v %v", live, err)
	}
	if err := a.Destroy(ctx, res.Kept); err != nil {
		t.Error(err)
	}
}
