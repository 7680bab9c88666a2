package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// snapshotRig is a daemon, a tenant's key and one of its sandboxes, its
// /workspace filled by the shell command fill.
type snapshotRig struct {
	d   *daemonProc
	key string
	c   *client.Client
	id  string
}

func newSnapshotRig(t *testing.T, w wallCase, tenant, fill string) *snapshotRig {
	t.Helper()
	d := w.startDaemon(t, newDataDir(t))
	tn, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: tenant, Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	c := d.client(t, tn.Key)
	sb, err := c.CreateSandbox(context.Background(), &api.CreateSandbox{TTL: "10m"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy(context.Background(), sb.ID) })
	if _, errs, end := run(t, c, sb.ID, sh(fill)); end.ExitCode != 0 {
		t.Fatalf("filling /workspace: %s", errs)
	}
	return &snapshotRig{d: d, key: tn.Key, c: c, id: sb.ID}
}

// cli is the airlock command, as the rig's tenant, on its daemon.
func (r *snapshotRig) cli(args ...string) *exec.Cmd {
	cmd := exec.Command(airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", r.d.data}, args...)...)
	cmd.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+r.d.sock, "AIRLOCK_API_KEY="+r.key)
	return cmd
}

func (r *snapshotRig) run(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	cmd := r.cli(args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("airlock %v: %v\n%s%s", args, err, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

// `airlock snapshot create --progress` prints what it copies on stderr,
// line by line off a terminal, and the snapshot's id alone on stdout;
// without --progress, off a terminal, stderr stays empty; --json prints
// the snapshot as before, and no progress even with --progress.
func TestSnapshotCreateDrawsItsProgress(t *testing.T) {
	forEachWall(t, snapshotCreateDrawsItsProgress)
}

func snapshotCreateDrawsItsProgress(t *testing.T, w wallCase) {
	r := newSnapshotRig(t, w, "snapprogress", "head -c "+strconv.Itoa(20<<20)+" /dev/zero > /workspace/big")
	out, errs := r.run(t, "--progress", "snapshot", "create", "--name", "p", r.id)
	id := strings.TrimSpace(out)
	if sns, err := r.c.Snapshots(context.Background()); err != nil || len(sns) != 1 || sns[0].ID != id || out != id+"\n" {
		t.Fatalf("stdout %q, snapshots %+v %v: want the snapshot's id alone", out, sns, err)
	}
	lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
	if len(lines) < 2 || lines[0] != "airlock: snapshot "+r.id+": 0.0 MiB" || !strings.HasPrefix(lines[len(lines)-1], "airlock: saved "+r.id+": 20.0 MiB, in ") {
		t.Errorf("stderr:\n%s\nwant the copy's start, then what it saved", errs)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "airlock: ") || strings.ContainsAny(l, "\r\x1b") {
			t.Errorf("stderr line %q: want a plain line", l)
		}
	}

	out, errs = r.run(t, "snapshot", "create", r.id)
	if out != id+"\n" || errs != "" {
		t.Errorf("without --progress: stdout %q, stderr %q: want the id and nothing drawn", out, errs)
	}

	for _, args := range [][]string{{"snapshot", "create", "--json", r.id}, {"--progress", "snapshot", "create", "--json", r.id}} {
		out, errs = r.run(t, args...)
		var sn map[string]any
		dec := json.NewDecoder(strings.NewReader(out))
		if err := dec.Decode(&sn); err != nil || dec.More() || sn["id"] != id || sn["bytes"] != float64(20<<20) || errs != "" {
			t.Errorf("%v: stdout %q (%v), stderr %q: want the snapshot's JSON alone", args, out, err, errs)
		}
		if _, ok := sn["progress"]; ok {
			t.Errorf("%v: %q has progress", args, out)
		}
	}
}

// A snapshot whose caller goes away during the copy stops, leaves no
// snapshot (no record, no files, no half-written copy) and thaws the
// sandbox. The workspace holds a sparse 4 GiB file, which the copy reads
// whole: it takes seconds, where the caller's end is seen at once.
func TestSnapshotCancelledLeavesNothing(t *testing.T) {
	forEachWall(t, snapshotCancelledLeavesNothing)
}

func snapshotCancelledLeavesNothing(t *testing.T, w wallCase) {
	r := newSnapshotRig(t, w, "snapcancel", "truncate -s 4G /workspace/sparse")
	cmd := r.cli("--progress", "snapshot", "create", r.id)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first, err := bufio.NewReader(stderr).ReadString('\n')
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil || !strings.HasPrefix(first, "airlock: snapshot "+r.id+": ") {
		t.Fatalf("first line %q (%v): want the copy's start", first, err)
	}
	r.d.waitLog(t, "snapshot not saved")
	if sns, err := r.c.Snapshots(context.Background()); err != nil || len(sns) != 0 {
		t.Errorf("snapshots after the caller went: %+v %v", sns, err)
	}
	if ents, err := os.ReadDir(filepath.Join(r.d.data, "snapshots")); err != nil || len(ents) != 0 {
		t.Errorf("snapshot files left: %v %v", ents, err)
	}
	if out, _, end := run(t, r.c, r.id, sh("echo thawed")); out != "thawed\n" || end.ExitCode != 0 {
		t.Errorf("the sandbox after the cancelled snapshot: %q %+v", out, end)
	}
}
