package e2e

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// Issue 12, items 3 and 4: what a sandbox makes in its /workspace must not
// multiply what the host reads (hard links), nor hide the other changes
// (a tree deeper than PATH_MAX).

// hardLinkScript makes /workspace/t/big (1 MiB of text) and doubles the
// directory with `cp -al` until the file has 2^doublings links.
func hardLinkScript(doublings int) string {
	return fmt.Sprintf(`set -e
mkdir -p /workspace/t && cd /workspace/t
yes 'a line of sixty-three bytes of text, repeated to make one MiB.' | head -c 1048576 > big
i=0
while [ $i -lt %d ]; do cp -al . ../n && mv ../n c$i; i=$((i+1)); done
echo "links: $(stat -c %%h big)"`, doublings)
}

// deepScript changes README and makes a tree whose paths pass PATH_MAX
// (two 15-level chains of 200-byte names, one moved under the other), a
// tree deeper than 256 levels, and a file after both.
const deepScript = `set -e
echo backdoor >> /workspace/README
cd /workspace
n=$(printf 'd%.0s' $(seq 200)); p=""
for i in $(seq 15); do p="$p$n/"; done
mkdir -p "x/$p" "y/$p"; echo bottom > "y/${p}bottom"
mv y "x/$p"
(i=0; while [ $i -lt 300 ]; do mkdir m; cd m; i=$((i+1)); done; echo bottom > bottom)
echo after > zz-after`

// vm reads a line of /proc/PID/status in bytes (VmRSS, VmHWM).
func vm(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// resetPeak starts PID's VmHWM again from its VmRSS (clear_refs 5).
func resetPeak(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
}

// downloadAll reads a whole download, counting its bytes and entries.
func downloadAll(t *testing.T, c *client.Client, id, p string) (size int64, names map[string]byte, skipped []string) {
	t.Helper()
	body, skipped, err := c.Download(context.Background(), id, p)
	if err != nil {
		t.Fatalf("download %s: %v", p, err)
	}
	defer body.Close()
	cr := &countReader{r: body}
	tr := tar.NewReader(cr)
	names = map[string]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("download %s: the archive: %v", p, err)
		}
		names[h.Name] = h.Typeflag
	}
	_, _ = io.Copy(io.Discard, cr)
	return cr.n, names, skipped
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// The attack: one 1 MiB file and 2048 links in /workspace (before: 300
// links made a 473 MB diff, a 473 MB patch beside the audit log, a daemon
// of 2.4 GB and a 36 s destroy). Every host-side reading counts the file
// once: the diff, the download and the snapshot stay near 1 MiB, the
// patch at its cap, the daemon's memory about flat, and destroy and the
// kill switch end within a generous limit.
func TestServeHardLinksCostOnce(t *testing.T) {
	forEachWall(t, serveHardLinksCostOnce)
}

func serveHardLinksCostOnce(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "links", api.Quotas{})
	pid := d.cmd.Process.Pid
	const doublings = 11 // 2048 links
	mk := func() string {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
		if err != nil {
			t.Fatal(err)
		}
		out, stderr, end := run(t, c, sb.ID, sh(hardLinkScript(doublings)))
		if end.ExitCode != 0 || !strings.Contains(out, "links: 2048") {
			t.Fatalf("making the links: %s %s", out, stderr)
		}
		return sb.ID
	}
	id := mk()
	resetPeak(t, pid)
	rss0 := vm(t, pid, "VmRSS")

	diff, err := c.Diff(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("diff: %d bytes", len(diff))
	if len(diff) > 4<<20 || !strings.Contains(diff, "(a hard link to t/big: the same content)") {
		t.Errorf("the diff is %d bytes (1 MiB of content, 2048 links), or does not name the links", len(diff))
	}
	size, names, _ := downloadAll(t, c, id, "/workspace")
	t.Logf("download: %d bytes, %d entries", size, len(names))
	// 1 MiB of content, and a header (at most 2 KiB) per entry.
	if size > 1<<20+int64(len(names))*2048 || names["t/c10/big"] != tar.TypeLink {
		t.Errorf("the download is %d bytes for %d entries, t/c10/big is type %q: the content was shipped per link", size, len(names), names["t/c10/big"])
	}
	sn, err := c.Snapshot(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %d bytes", sn.Bytes)
	if sn.Bytes > 2<<20 {
		t.Errorf("the snapshot copied %d bytes", sn.Bytes)
	}
	began := time.Now()
	if err := c.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	rm := time.Since(began)
	id2 := mk()
	began = time.Now()
	killed, err := c.KillAll(ctx, "links")
	kill := time.Since(began)
	if err != nil || len(killed) != 1 || killed[0] != id2 {
		t.Fatalf("kill-all: %v %v", killed, err)
	}
	grew := vm(t, pid, "VmHWM") - rss0
	t.Logf("rm %v, kill-all %v, daemon RSS %d MiB, peak growth %d MiB", rm, kill, rss0>>20, grew>>20)
	if rm > time.Minute || kill > time.Minute {
		t.Errorf("rm took %v, kill-all %v", rm, kill)
	}
	if grew > 256<<20 {
		t.Errorf("the daemon's peak memory grew by %d MiB", grew>>20)
	}
	ents, _ := os.ReadDir(filepath.Join(data, "audit", "patches"))
	for _, e := range ents {
		if fi, _ := e.Info(); fi.Size() > 1<<20 {
			t.Errorf("patch %s is %d bytes, past its 1 MiB cap", e.Name(), fi.Size())
		}
	}
	if len(ents) == 0 {
		t.Error("no patch beside the log")
	}
	recs, err := c.Audit(ctx, id, "sandbox.destroyed")
	if err != nil || len(recs) != 1 {
		t.Fatalf("destroy record: %v %v", recs, err)
	}
	var rec struct {
		Workspace struct {
			Changed int `json:"changed"`
			Patch   struct {
				Bytes     int64 `json:"bytes"`
				Truncated bool  `json:"truncated"`
			} `json:"patch"`
		} `json:"workspace"`
	}
	if err := json.Unmarshal(recs[0].Data, &rec); err != nil || rec.Workspace.Changed < 2048 || rec.Workspace.Patch.Bytes > 1<<20 {
		t.Errorf("destroy record: %+v %v\n%.2000s", rec, err, recs[0].Data)
	}
}

// The attack: a tree deeper than PATH_MAX (and one deeper than 256
// levels) beside a changed README. Before, the diff, the download, the
// destroy record and `run --diff` failed whole and the README edit never
// reached the reviewer; now each shows it and names the deep subtrees, and
// so does a snapshot.
func TestServeDeepTreeHidesNothing(t *testing.T) {
	forEachWall(t, serveDeepTreeHidesNothing)
}

func serveDeepTreeHidesNothing(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "deep", api.Quotas{})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	if out, stderr, end := run(t, c, sb.ID, sh(deepScript)); end.ExitCode != 0 {
		t.Fatalf("making the tree: %s %s", out, stderr)
	}
	long := strings.Repeat("d", 200)
	diff, err := c.Diff(ctx, sb.ID)
	if err != nil {
		t.Fatalf("the diff failed whole: %v", err)
	}
	for _, want := range []string{"+backdoor", "zz-after", "airlock: not read: x/" + long, "deeper than 256 levels"} {
		if !strings.Contains(diff, want) {
			t.Errorf("the diff lacks %q", want)
		}
	}
	_, names, skipped := downloadAll(t, c, sb.ID, "/workspace")
	if _, ok := names["README"]; !ok || !strings.Contains(strings.Join(skipped, "\n"), "x/"+long) {
		t.Errorf("download: README in it %v, skipped %.300q", ok, skipped)
	}
	sn, err := c.Snapshot(ctx, sb.ID, "")
	if err != nil {
		t.Fatalf("the snapshot failed whole: %v", err)
	}
	if !strings.Contains(strings.Join(sn.Skipped, "\n"), "x/"+long) {
		t.Errorf("the snapshot does not name the deep subtree: %.300q", sn.Skipped)
	}
	from, err := c.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := run(t, c, from.ID, sh("cat /workspace/README /workspace/zz-after")); out != "backdoor\nafter\n" {
		t.Errorf("a sandbox from the snapshot reads %q", out)
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	recs, err := c.Audit(ctx, sb.ID, "sandbox.destroyed")
	if err != nil || len(recs) != 1 {
		t.Fatalf("destroy record: %v %v", recs, err)
	}
	for _, want := range []string{`"path":"README"`, `"path":"zz-after"`, `"unread":[`, "x/" + long, "deeper than 256 levels"} {
		if !strings.Contains(string(recs[0].Data), want) {
			t.Errorf("the destroy record lacks %q", want)
		}
	}
}

// `run --diff` and `--export` of the same trees: the README edit is in the
// diff, the deep subtrees are named, the export has README and makes a
// file's links links again (before: 302 MB for 300 links).
func TestRunReadsHostileTrees(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		ws := t.TempDir()
		writeFiles(t, ws, map[string]string{"README": "hello\n"})
		export := filepath.Join(t.TempDir(), "out")
		r := w.run(t, "--workspace", ws, "--diff", "--export", export, "--", "sh", "-c", deepScript+"\n"+hardLinkScript(8))
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		long := strings.Repeat("d", 200)
		for _, want := range []string{" hello\n+backdoor\n", "+after\n", "airlock: not read: x/" + long, "deeper than 256 levels", "(a hard link to t/big: the same content)"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("run --diff lacks %q", want)
			}
		}
		if len(r.stdout) > 4<<20 {
			t.Errorf("run --diff wrote %d bytes", len(r.stdout))
		}
		if b, err := os.ReadFile(filepath.Join(export, "README")); err != nil || string(b) != "hello\nbackdoor\n" {
			t.Errorf("export README: %q %v", b, err)
		}
		a, err1 := os.Stat(filepath.Join(export, "t/big"))
		b, err2 := os.Stat(filepath.Join(export, "t/c7/c0/big"))
		if err1 != nil || err2 != nil || !os.SameFile(a, b) {
			t.Errorf("the export copied a link's content again: %v %v", err1, err2)
		}
		if !strings.Contains(r.stderr, "export: skipped x/"+long) {
			t.Errorf("the export does not name the deep subtree:\n%.2000s", r.stderr)
		}
		noResidue(t)
	})
}

// The attack: 80 distinct text files of about 1 MB, an 85 MB diff. The diff
// streams, stops diffing at its budget, names the rest and says so; the
// daemon does not hold it in memory.
func TestServeDiffSaysWhatItLeftOut(t *testing.T) {
	forEachWall(t, serveDiffSaysWhatItLeftOut)
}

func serveDiffSaysWhatItLeftOut(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "budget", api.Quotas{})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	script := `set -e; cd /workspace
yes 'a line of sixty-three bytes of text, repeated to make one MiB.' | head -c 1000000 > base
for i in $(seq 80); do sed "s/^/$i /" base > f$i; done; rm base`
	if out, stderr, end := run(t, c, sb.ID, sh(script)); end.ExitCode != 0 {
		t.Fatalf("%s %s", out, stderr)
	}
	pid := d.cmd.Process.Pid
	resetPeak(t, pid)
	rss0 := vm(t, pid, "VmRSS")
	diff, err := c.Diff(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	grew := vm(t, pid, "VmHWM") - rss0
	t.Logf("diff: %d bytes; daemon peak growth %d MiB", len(diff), grew>>20)
	if len(diff) > 70<<20 || !strings.Contains(diff, "not diffed: the diff is past its budget") || !strings.Contains(diff, "airlock: the diff reached its budget") {
		t.Errorf("the diff is %d bytes, or does not say what it left out", len(diff))
	}
	if grew > 128<<20 {
		t.Errorf("the daemon's peak memory grew by %d MiB for a streamed diff", grew>>20)
	}
}

// A sandbox fills its workspace with the longest paths it can make, of
// control bytes (six times their length in JSON), as many as a record
// lists, and also has them skipped (fifos): the destroy and download
// records stay small, and the daemon's audit log keeps every record
// across a restart. Before, the destroy record was about 24 MiB and the
// download's 20, and a restart cut the log at the first line past 16 MiB.
func TestServeHugeNamesKeepTheAuditLog(t *testing.T) {
	forEachWall(t, serveHugeNamesKeepTheAuditLog)
}

func serveHugeNamesKeepTheAuditLog(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "huge", api.Quotas{})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	// Per wall, how many named pipes go under the huge names, and whether
	// the download skips them. On the container wall they are in the
	// host's layer and skipped, each named in the record (1,100 make it
	// huge). On the gVisor wall a named pipe is the Sentry's, in its
	// memory: it never reaches the host's layer (as in TestServeSnapshots),
	// so there is nothing to skip; a few show it.
	fifos := map[string]int{"container": 1100, "gvisor": 10}[w.name]
	script := `n=$(printf '\001%.0s' $(seq 240)); d=.; for i in $(seq 15); do d="$d/$n"; done; mkdir -p "$d" && cd "$d" && for i in $(seq ` + strconv.Itoa(fifos) + `); do mkfifo "$n$i"; done`
	if out, stderr, end := run(t, c, sb.ID, sh(script)); end.ExitCode != 0 {
		t.Fatalf("making the names: %s %s", out, stderr)
	}
	_, _, skipped := downloadAll(t, c, sb.ID, "/workspace")
	if (len(skipped) > 0) != (w.name == "container") {
		t.Fatalf("the download skipped %d entries", len(skipped))
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(data, "audit", "*.log"))
	longest, kinds := 0, map[string]bool{}
	for _, p := range segs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			longest = max(longest, len(l))
			var r struct{ Kind string }
			if json.Unmarshal([]byte(l), &r) == nil {
				kinds[r.Kind] = true
			}
		}
	}
	if longest > 4<<20 {
		t.Errorf("an audit record of %d bytes", longest)
	}
	if !kinds["file.download"] || !kinds["sandbox.destroyed"] {
		t.Errorf("records: %v", kinds)
	}
}
