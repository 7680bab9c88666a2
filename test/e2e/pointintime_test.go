package e2e

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// A sandbox's /workspace is the host directory as it was at create, and
// its diff is exactly what the sandbox changed since: the host changing
// its directory meanwhile shows in neither.

// pointInTimeFiles is the host directory before create.
var pointInTimeFiles = map[string]string{
	"keep.txt":     "kept\n",
	"change.txt":   "old\n",
	"delete.txt":   "deleted on the host\n",
	"same.txt":     "v1\n",
	"sub/deep.txt": "deep\n",
}

// changeHost changes ws after create: a file changed, one deleted, one
// added, and same.txt given the content the sandbox also gives it.
func changeHost(t *testing.T, ws string) {
	t.Helper()
	writeFiles(t, ws, map[string]string{"change.txt": "changed on the host\n", "added.txt": "added on the host\n", "same.txt": "v2\n", "sub/deep.txt": "host deep\n"})
	if err := os.Remove(filepath.Join(ws, "delete.txt")); err != nil {
		t.Fatal(err)
	}
}

// seenAtCreate is what the sandbox must print for `cat` of every file, in
// this order, after the host changed its directory.
const seenAtCreate = "kept\nold\ndeleted on the host\nv2\ndeep\nno added.txt\n"
const catAll = "cat keep.txt change.txt delete.txt same.txt sub/deep.txt; test -e added.txt || echo no added.txt"

// checkSinceCreate checks a diff holds the sandbox's change of same.txt
// (to what the host now also has) and nothing of the host's changes.
func checkSinceCreate(t *testing.T, diff string) {
	t.Helper()
	if !strings.Contains(diff, "--- a/same.txt\n+++ b/same.txt\n") || !strings.Contains(diff, "-v1\n+v2\n") {
		t.Errorf("the diff lacks the sandbox's change of same.txt:\n%s", diff)
	}
	for _, host := range []string{"change.txt", "delete.txt", "added.txt", "deep.txt", "keep.txt"} {
		if strings.Contains(diff, host) {
			t.Errorf("the diff names %s, which only the host changed:\n%s", host, diff)
		}
	}
}

func tmpEntries(t *testing.T, data string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(data, "tmp"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// startRun starts `airlock run` with script as its command and waits for
// the script to print "ready"; the script then reads a line of its stdin.
// It returns the command, the writer of its stdin and the rest of its
// stdout.
func startRun(t *testing.T, args []string, script string) (*exec.Cmd, io.WriteCloser, *bufio.Reader) {
	t.Helper()
	full := append(append([]string{"--state-dir", stateDir, "--data-dir", dataDir, "run"}, args...), "--", "sh", "-c", script)
	cmd := exec.Command(airlockBin, full...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("the sandbox said %q (%v); stderr:\n%s", line, err, stderr.String())
	}
	return cmd, stdin, out
}

func TestRunWorkspaceIsPointInTime(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		ws := t.TempDir()
		writeFiles(t, ws, pointInTimeFiles)
		cmd, stdin, out := startRun(t, append(w.flags, "--workspace", ws, "--diff"), "echo v2 > same.txt; echo ready; read go; "+catAll)
		changeHost(t, ws)
		if _, err := io.WriteString(stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("airlock run: %v\n%s", err, rest)
		}
		got := string(rest)
		if !strings.HasPrefix(got, seenAtCreate) {
			t.Fatalf("the sandbox saw the host's later changes:\n%s", got)
		}
		checkSinceCreate(t, strings.TrimPrefix(got, seenAtCreate))
		noResidue(t)
		if left := tmpEntries(t, dataDir); len(left) != 0 {
			t.Fatalf("workspace copies left: %v", left)
		}
	})
}

// An `airlock run` killed mid-run leaves its copy; gc removes it once the
// sandbox is gone.
func TestRunWorkspaceCopyGoneAfterCrashAndGC(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		ws := t.TempDir()
		writeFiles(t, ws, pointInTimeFiles)
		before := tmpEntries(t, dataDir)
		cmd, _, _ := startRun(t, append(w.flags, "--workspace", ws), "echo ready; read go")
		var copies []string
		for _, e := range tmpEntries(t, dataDir) {
			if !slices.Contains(before, e) {
				copies = append(copies, e)
			}
		}
		if len(copies) != 1 {
			t.Fatalf("copies made by this run: %v", copies)
		}
		if b, err := os.ReadFile(filepath.Join(dataDir, "tmp", copies[0], "change.txt")); err != nil || string(b) != "old\n" {
			t.Fatalf("the copy's change.txt: %q %v", b, err)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := airlock(t, "", "gc")
			if _, err := os.Lstat(filepath.Join(dataDir, "tmp", copies[0])); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gc left the copy of a dead sandbox: %s", r)
			}
			time.Sleep(100 * time.Millisecond)
		}
		noResidue(t)
	})
}

func TestServeWorkspaceIsPointInTime(t *testing.T) {
	forEachWall(t, serveWorkspaceIsPointInTime)
}

func serveWorkspaceIsPointInTime(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	ws := t.TempDir()
	writeFiles(t, ws, pointInTimeFiles)
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	if got := tmpEntries(t, data); !slices.Equal(got, []string{sb.ID}) {
		t.Errorf("copies while the sandbox lives: %v, want [%s]", got, sb.ID)
	}
	run(t, alice, sb.ID, &api.Exec{Cmd: []string{"sh", "-c", "echo v2 > same.txt"}, Cwd: "/workspace"})
	changeHost(t, ws)
	if out, _, _ := run(t, alice, sb.ID, &api.Exec{Cmd: []string{"sh", "-c", catAll}, Cwd: "/workspace"}); out != seenAtCreate {
		t.Errorf("the sandbox saw the host's later changes:\n%s", out)
	}
	diff, err := alice.Diff(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	checkSinceCreate(t, diff)
	if err := alice.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := tmpEntries(t, data); len(got) != 0 {
		t.Errorf("copies left after destroy: %v", got)
	}
	noResidue(t)
}
