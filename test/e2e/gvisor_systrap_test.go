package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// A long-lived gVisor sandbox runs on systrap and survives what its agent
// lives through: many commands, 5 MiB writes and reads through the files
// API, commands whose output the agent relays, and the freezes of pause,
// download and diff between them. With the runsc pinned before, a freeze
// left systrap's stub answering a stale seccomp notification, and the
// agent's next heap growth killed the sandbox ("systrap corrupted memory:
// subprocess died"); long-lived sandboxes ran on ptrace meanwhile.
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
