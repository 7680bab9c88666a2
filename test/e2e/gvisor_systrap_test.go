package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/wall/gvisor"
)

// A long-lived gVisor sandbox runs on systrap and survives what its agent
// lives through: many commands, 5 MiB writes and reads through the files
// API, commands whose output the agent relays, and the stops of pause,
// download and diff between them. While those stops froze the sandbox's
// cgroup, the freezer broke systrap's stubs and the agent's next heap
// growth killed the sandbox ("systrap corrupted memory: subprocess died");
// long-lived sandboxes ran on ptrace meanwhile.
func TestGVisorLongLivedSurvivesFreezesExecsAndHeapGrowth(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", Workspace: workspace(t), TTL: "10m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, sb.ID) }()
	if p := sentryPlatform(t, sb.ID); p != "systrap" {
		t.Fatalf("the sandbox's Sentry runs on %q, want systrap", p)
	}
	if err := alice.WriteFile(ctx, sb.ID, "/workspace/small/a.txt", []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 5<<20/16)
	for i := 0; i < 50; i++ {
		if out, _, end := run(t, alice, sb.ID, sh(fmt.Sprintf("echo %d", i))); out != fmt.Sprintf("%d\n", i) || end.ExitCode != 0 {
			t.Fatalf("exec %d: %q %+v", i, out, end)
		}
		p := fmt.Sprintf("/workspace/big-%d.bin", i%3)
		if err := alice.WriteFile(ctx, sb.ID, p, big, 0o644); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		switch i % 5 {
		case 0:
			if b, err := alice.ReadFile(ctx, sb.ID, p); err != nil || !bytes.Equal(b, big) {
				t.Fatalf("read back %d: %d bytes, %v", i, len(b), err)
			}
			if out, _, end := run(t, alice, sb.ID, sh("head -c 8388608 /dev/zero | tr '\\0' x")); len(out) != 8<<20 || end.ExitCode != 0 {
				t.Fatalf("8 MiB of output %d: %d bytes %+v", i, len(out), end)
			}
		case 1:
			if _, err := alice.Pause(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := alice.Resume(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		case 2:
			download(t, alice, sb.ID)
		case 3:
			if _, err := alice.Diff(ctx, sb.ID); err != nil {
				t.Fatalf("diff %d: %v", i, err)
			}
		}
	}
	// A paused sandbox is destroyed like any other.
	if _, err := alice.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := alice.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

func download(t *testing.T, c *client.Client, id string) {
	t.Helper()
	body, _, err := c.Download(context.Background(), id, "/workspace/small")
	if err != nil {
		t.Fatalf("download: %v", err)
	}
	defer body.Close()
	if _, err := io.Copy(io.Discard, body); err != nil {
		t.Fatalf("download: %v", err)
	}
}

// sentryPlatform is the --platform of sandbox id's Sentry (runsc-sandbox),
// read from the host's process list.
func sentryPlatform(t *testing.T, id string) string {
	t.Helper()
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, _ := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || args[0] != "runsc-sandbox" || !strings.Contains(string(b), id) {
			continue
		}
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--platform="); ok {
				return v
			}
		}
		return ""
	}
	t.Fatalf("no Sentry of sandbox %s", id)
	return ""
}

// Pause is gVisor's own (runsc pause), kept in runsc's state: a daemon
// restarted while a gvisor sandbox is paused adopts it paused (its agent
// thawed for the check and paused again), and resume gives it back.
func TestGVisorPausedSandboxIsAdoptedPaused(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	data := newDataDir(t)
	d := startDaemon(t, data)
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "alice", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	alice := d.client(t, tn.Key)
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", Workspace: workspace(t), TTL: "10m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, sb.ID) }()
	run(t, alice, sb.ID, sh("echo before > /workspace/f.txt"))
	if _, err := alice.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if st := runscStatus(t, sb.ID); st != "paused" {
		t.Fatalf("runsc says the paused sandbox is %q", st)
	}
	d.kill9()
	d2 := startDaemon(t, data)
	c := d2.client(t, tn.Key)
	if got, err := c.Sandbox(ctx, sb.ID); err != nil || got.State != api.StatePaused {
		t.Fatalf("adopted: %+v %v", got, err)
	}
	if st := runscStatus(t, sb.ID); st != "paused" {
		t.Fatalf("runsc says the adopted paused sandbox is %q", st)
	}
	wantCode(t, "exec while paused", func() error { _, err := c.Exec(ctx, sb.ID, sh("true"), nil, nil); return err }(), api.CodeFailedPrecondition)
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if st := runscStatus(t, sb.ID); st != "running" {
		t.Fatalf("runsc says the resumed sandbox is %q", st)
	}
	if out, _, end := run(t, c, sb.ID, sh("cat /workspace/f.txt")); out != "before\n" || end.ExitCode != 0 {
		t.Errorf("after resume: %q %+v", out, end)
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// runscStatus is what `runsc state` says of gVisor sandbox id.
func runscStatus(t *testing.T, id string) string {
	t.Helper()
	out, err := exec.Command(gvisor.DefaultRunsc, "--root", filepath.Join(stateDir, "gvisor", "runsc"), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("runsc state %s: %v: %s", id, err, out)
	}
	return st.Status
}
