package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// counter is a process holding its state in memory: a count it writes to
// /tmp/count every 100 ms, from memory only (never read back).
const counter = `import time
n = 0
while True:
    n += 1
    with open("/tmp/count.new", "w") as f:
        f.write(str(n))
    import os; os.rename("/tmp/count.new", "/tmp/count")
    time.sleep(0.1)
`

// count reads the counter's last value in sandbox id (-1: none yet).
func count(t *testing.T, c *client.Client, id string) int {
	t.Helper()
	return numberIn(t, c, id, "/tmp/count")
}

// numberIn reads the number in file (-1: no file yet) in sandbox id.
func numberIn(t *testing.T, c *client.Client, id, file string) int {
	t.Helper()
	out, _, _ := run(t, c, id, sh("cat "+file+" 2>/dev/null || echo -1"))
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s in %s: %q", file, id, out)
	}
	return n
}

// countPast waits until sandbox id's counter is past n, and returns it; it
// fails if the counter stops (no change across many reads).
func countPast(t *testing.T, c *client.Client, id string, n int) int {
	t.Helper()
	last, still := count(t, c, id), 0
	for last <= n {
		time.Sleep(50 * time.Millisecond)
		got := count(t, c, id)
		if got == last {
			if still++; still > 200 {
				t.Fatalf("the counter in %s stopped at %d", id, got)
			}
		} else {
			still = 0
		}
		last = got
	}
	return last
}

// A gVisor sandbox saved with its memory is restored running: the process
// counting in memory goes on from where it was (not from 0), its /tmp and
// /workspace are as they were, the agent answers; the source runs on.
func TestGVisorCheckpointRestore(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	src, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "gvisor", TTL: "10m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, src.ID) }()
	before := startCounting(t, alice, src.ID)
	// What the sandbox left in /tmp is copied as hostile: a link stays a
	// link, a set-id bit is dropped.
	if _, _, end := run(t, alice, src.ID, sh("ln -s /etc/passwd /tmp/link && echo x > /tmp/suid && chmod 4755 /tmp/suid")); end.ExitCode != 0 {
		t.Fatalf("plant /tmp: %+v", end)
	}

	snap, err := alice.SnapshotWith(ctx, src.ID, &api.CreateSnapshot{Name: "mem", Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.DeleteSnapshot(ctx, snap.ID) }()
	if !snap.Memory || snap.MemoryBytes <= 0 || snap.Bytes < snap.MemoryBytes {
		t.Errorf("snapshot: %+v", snap)
	}
	// The source runs on, its agent answering.
	afterSrc := countPast(t, alice, src.ID, before)

	// A restore whose sandbox would differ from the checkpointed one in
	// more than what is its own (here a writable root) is refused, and
	// nothing is left of it.
	_, err = alice.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + snap.ID, TTL: "5m", WritableRootfs: true})
	wantCode(t, "a restore with a writable root", err, api.CodeFailedPrecondition)
	if sbs, err := alice.Sandboxes(ctx); err != nil || len(sbs) != 1 {
		t.Errorf("sandboxes after the refused restore: %+v %v", sbs, err)
	}

	from, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + snap.ID, TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, from.ID) }()
	if from.Isolation != "gvisor" || from.ID == src.ID {
		t.Errorf("restored: %+v", from)
	}
	restored := count(t, alice, from.ID)
	if restored < before {
		t.Errorf("the restored counter is at %d, below the %d it had before the checkpoint", restored, before)
	}
	countPast(t, alice, from.ID, restored)
	if out, _, _ := run(t, alice, from.ID, sh("cat /workspace/w.txt /tmp/t.txt")); out != "kept\nscratch\n" {
		t.Errorf("files after restore: %q", out)
	}
	if out, _, _ := run(t, alice, from.ID, sh("readlink /tmp/link; stat -c %a /tmp/suid")); out != "/etc/passwd\n755\n" {
		t.Errorf("/tmp's link and set-id file after restore: %q", out)
	}
	if ps, err := alice.Processes(ctx, from.ID); err != nil || len(ps) != 1 || ps[0].Tag != "counter" {
		t.Errorf("processes after restore: %+v %v", ps, err)
	}
	// The two are apart: the source's count is its own.
	if n := count(t, alice, src.ID); n < afterSrc {
		t.Errorf("the source's counter went back: %d < %d", n, afterSrc)
	}
	// The checkpoint is root's alone, and goes with the snapshot.
	mem, _ := filepath.Glob(filepath.Join(d.data, "snapshots", "*", "memory"))
	if len(mem) != 1 {
		t.Fatalf("checkpoints on disk: %v", mem)
	}
	if st, err := os.Stat(mem[0]); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("checkpoint directory: %v %v", st.Mode(), err)
	}
	if err := alice.Destroy(ctx, from.ID); err != nil {
		t.Fatal(err)
	}
	if err := alice.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mem[0]); !os.IsNotExist(err) {
		t.Errorf("the checkpoint is left after its snapshot was deleted: %v", err)
	}
}

// The container wall cannot save memory: it says so, and saves nothing.
func TestCheckpointRefusedOnContainerWall(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alice.Destroy(ctx, sb.ID) }()
	_, err = alice.SnapshotWith(ctx, sb.ID, &api.CreateSnapshot{Memory: true})
	if err == nil || !strings.Contains(err.Error(), "gvisor") {
		t.Fatalf("memory snapshot on the container wall: %v", err)
	}
	if sns, err := alice.Snapshots(ctx); err != nil || len(sns) != 0 {
		t.Errorf("snapshots after the refusal: %+v %v", sns, err)
	}
}

// startCounting starts the counter in sandbox id (in the background), writes
// a file in its /workspace (w.txt: "kept") and its /tmp (t.txt: "scratch"),
// and returns a count the counter has gone past.
func startCounting(t *testing.T, c *client.Client, id string) int {
	t.Helper()
	s, err := c.ExecStream(context.Background(), id, &api.Exec{Cmd: []string{"python3", "-c", counter}, Background: true, Tag: "counter"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Next(); err != nil || ev.PID == 0 {
		t.Fatalf("start the counter: %+v %v", ev, err)
	}
	s.Close()
	if _, _, end := run(t, c, id, sh("echo kept > /workspace/w.txt && echo scratch > /tmp/t.txt")); end.ExitCode != 0 {
		t.Fatalf("write files: %+v", end)
	}
	return countPast(t, c, id, 20)
}
