package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// filesTenant is a tenant of d for the file tests: its client and its key
// for the CLI.
func filesTenant(t *testing.T, d *daemonProc, name string) (*client.Client, string) {
	t.Helper()
	tn, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: name, Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	return d.client(t, tn.Key), tn.Key
}

// cliAs runs the CLI on d with key, stdin from in (nil: empty) and stdout
// to out (nil: kept in the result).
func cliAs(t *testing.T, d *daemonProc, key string, in io.Reader, out io.Writer, args ...string) result {
	t.Helper()
	cmd := exec.Command(airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", d.data}, args...)...)
	cmd.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock, "AIRLOCK_API_KEY="+key)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, &stdout, &stderr
	if out != nil {
		cmd.Stdout = out
	}
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("airlock %v: %v", args, err)
	}
	return r
}

// sandboxTree is what dir holds inside the sandbox: every path below it,
// sorted, "/" after a directory, "=content" after a file.
func sandboxTree(t *testing.T, c *client.Client, id, dir string) string {
	t.Helper()
	script := `cd "$1" && find . -mindepth 1 | sort | while read -r p; do if [ -d "$p" ]; then echo "${p#./}/"; else echo "${p#./}=$(cat "$p")"; fi; done`
	out, _, end := run(t, c, id, &api.Exec{Cmd: []string{"sh", "-c", script, "sh", dir}})
	if end.ExitCode != 0 {
		t.Fatalf("tree of %s: exit %d", dir, end.ExitCode)
	}
	return strings.Join(strings.Fields(out), " ")
}

// localTree is sandboxTree of a local directory.
func localTree(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case rel == ".":
		case d.IsDir():
			out = append(out, rel+"/")
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out = append(out, rel+"="+string(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// Regression (issue 14): cp failed unless DEST existed, and a file nested
// more than one level under /workspace could not be copied out. cp now
// follows docker cp's table, one row per case, both ways.
func TestServeCpLikeDockerCp(t *testing.T) {
	forEachWall(t, serveCpLikeDockerCp)
}

func serveCpLikeDockerCp(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	c, key := filesTenant(t, d, "cpdocker")
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	local := t.TempDir()
	src := filepath.Join(local, "srcdir")
	for p, body := range map[string]string{"srcdir/f.txt": "f", "srcdir/sub/g.txt": "g", "one.txt": "one"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(local, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(local, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	one := filepath.Join(local, "one.txt")

	// Into the sandbox: each row in its own directory /workspace/in/ROW,
	// made with what the row needs there first.
	in := []struct {
		row, setup, src, dest string // dest relative to the row's directory
		ok                    bool
		want                  string // the row's directory after
	}{
		{"file-to-dir", "mkdir d", one, "d", true, "d/ d/one.txt=one"},
		{"file-to-file", "echo old > t.txt", one, "t.txt", true, "t.txt=one"},
		{"file-to-new-name", "", one, "new.txt", true, "new.txt=one"},
		{"file-to-missing-dir-slash", "", one, "nodir/", false, ""},
		{"file-to-missing-parent", "", one, "nodir/new.txt", false, ""},
		{"dir-to-missing-parent", "", src, "nodir/new", false, ""},
		{"dir-to-dir", "mkdir d", src, "d", true, "d/ d/srcdir/ d/srcdir/f.txt=f d/srcdir/sub/ d/srcdir/sub/g.txt=g"},
		{"dir-to-dir-merges", "mkdir -p d/srcdir && echo k > d/srcdir/keep.txt && echo old > d/srcdir/f.txt", src, "d", true, "d/ d/srcdir/ d/srcdir/f.txt=f d/srcdir/keep.txt=k d/srcdir/sub/ d/srcdir/sub/g.txt=g"},
		{"dir-to-new-dir", "", src, "new", true, "new/ new/f.txt=f new/sub/ new/sub/g.txt=g"},
		{"dir-contents-to-dir", "mkdir d", src + "/.", "d", true, "d/ d/f.txt=f d/sub/ d/sub/g.txt=g"},
		{"dir-to-file", "echo old > t.txt", src, "t.txt", false, "t.txt=old"},
		{"file-deep", "mkdir -p a/b/c", one, "a/b/c/x.txt", true, "a/ a/b/ a/b/c/ a/b/c/x.txt=one"},
		{"dir-deep", "mkdir -p a/b/c", src, "a/b/c", true, "a/ a/b/ a/b/c/ a/b/c/srcdir/ a/b/c/srcdir/f.txt=f a/b/c/srcdir/sub/ a/b/c/srcdir/sub/g.txt=g"},
	}
	for _, r := range in {
		dir := "/workspace/in/" + r.row
		if _, _, end := run(t, c, id, sh("mkdir -p "+dir+" && cd "+dir+" && "+orTrue(r.setup))); end.ExitCode != 0 {
			t.Fatalf("%s: setup", r.row)
		}
		res := cliAs(t, d, key, nil, nil, "cp", r.src, id+":"+dir+"/"+r.dest)
		if (res.code == 0) != r.ok {
			t.Errorf("in %s: %s", r.row, res)
		}
		if got := sandboxTree(t, c, id, dir); got != r.want {
			t.Errorf("in %s:\n got %s\nwant %s", r.row, got, r.want)
		}
	}

	if r := cliAs(t, d, key, nil, nil, "cp", one, "nope:/workspace/x"); r.code == 0 || !strings.Contains(r.stderr, "no sandbox") {
		t.Errorf("cp into a missing sandbox: %s", r)
	}

	// Out of the sandbox: each row into its own local directory.
	if _, _, end := run(t, c, id, sh("mkdir -p /workspace/out/d/deep && echo -n r > /workspace/out/r.txt && echo -n x > /workspace/out/d/x.txt && echo -n y > /workspace/out/d/deep/y.txt && echo -n sandbox-host > /tmp/host.txt")); end.ExitCode != 0 {
		t.Fatal("setup of out")
	}
	out := []struct {
		row, setup, src, dest string // setup: "dir d" or "file t.txt"; dest relative to the row's directory
		ok                    bool
		want                  string
		says                  string // on stderr when it fails
	}{
		{"file-to-dir", "dir d", "/workspace/out/r.txt", "d", true, "d/ d/r.txt=r", ""},
		{"file-to-here", "", "/workspace/out/r.txt", ".", true, "r.txt=r", ""},
		{"file-to-file", "file t.txt", "/workspace/out/r.txt", "t.txt", true, "t.txt=r", ""},
		{"file-to-new-name", "", "/workspace/out/r.txt", "new.txt", true, "new.txt=r", ""},
		{"file-to-missing-dir-slash", "", "/workspace/out/r.txt", "nodir/", false, "", "no directory"},
		{"file-to-missing-parent", "", "/workspace/out/r.txt", "nodir/new.txt", false, "", "no directory"},
		{"dir-to-missing-parent", "", "/workspace/out/d", "nodir/new", false, "", "no directory"},
		{"file-deep", "", "/workspace/out/d/deep/y.txt", ".", true, "y.txt=y", ""},
		{"dir-to-dir", "dir d", "/workspace/out/d", "d", true, "d/ d/d/ d/d/deep/ d/d/deep/y.txt=y d/d/x.txt=x", ""},
		{"dir-to-new-dir", "", "/workspace/out/d", "new", true, "new/ new/deep/ new/deep/y.txt=y new/x.txt=x", ""},
		{"dir-contents-to-dir", "dir d", "/workspace/out/d/.", "d", true, "d/ d/deep/ d/deep/y.txt=y d/x.txt=x", ""},
		{"dir-to-file", "file t.txt", "/workspace/out/d", "t.txt", false, "t.txt=old", "not a directory"},
		{"dir-deep", "", "/workspace/out/d/deep", ".", true, "deep/ deep/y.txt=y", ""},
		{"workspace", "", "/workspace/out", "ws", true, "ws/ ws/d/ ws/d/deep/ ws/d/deep/y.txt=y ws/d/x.txt=x ws/r.txt=r", ""},
		{"file-outside-workspace", "", "/tmp/host.txt", ".", true, "host.txt=sandbox-host", ""},
		{"dir-outside-workspace", "", "/tmp", "t", false, "", "copy it there first"},
		{"missing", "", "/workspace/out/nope", ".", false, "", "no such file"},
	}
	for _, r := range out {
		dir := filepath.Join(t.TempDir(), r.row)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		switch kind, name, _ := strings.Cut(r.setup, " "); kind {
		case "dir":
			_ = os.Mkdir(filepath.Join(dir, name), 0o755)
		case "file":
			_ = os.WriteFile(filepath.Join(dir, name), []byte("old"), 0o644)
		}
		dest := filepath.Join(dir, r.dest)
		if strings.HasSuffix(r.dest, "/") {
			dest += "/"
		}
		res := cliAs(t, d, key, nil, nil, "cp", id+":"+r.src, dest)
		if (res.code == 0) != r.ok || !strings.Contains(res.stderr, r.says) {
			t.Errorf("out %s: %s", r.row, res)
		}
		if got := localTree(t, dir); got != r.want {
			t.Errorf("out %s:\n got %s\nwant %s", r.row, got, r.want)
		}
	}
}

// orTrue is a shell command that does nothing for an empty one.
func orTrue(cmd string) string {
	if cmd == "" {
		return "true"
	}
	return cmd
}

// sha256File is the hex SHA-256 of a local file.
func sha256File(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// sandboxSHA256 is the hex SHA-256 of a file in the sandbox.
func sandboxSHA256(t *testing.T, c *client.Client, id, p string) string {
	t.Helper()
	out, _, end := run(t, c, id, &api.Exec{Cmd: []string{"sha256sum", p}})
	if end.ExitCode != 0 {
		t.Fatalf("sha256sum %s: exit %d", p, end.ExitCode)
	}
	sum, _, _ := strings.Cut(out, " ")
	return sum
}

// Regression (issue 14): write, cp and the files API refused files over
// 64 MiB (and write's error pointed at cp, which refused too). A 90 MiB
// file goes in and out by write, cat and cp, whole; the file.write record
// has its size and digest, computed as it streamed.
func TestServeLargeFiles(t *testing.T) {
	forEachWall(t, serveLargeFiles)
}

func serveLargeFiles(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	c, key := filesTenant(t, d, "bigfiles")
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{DiskBytes: 1 << 30, MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	local := t.TempDir()
	big := filepath.Join(local, "big.bin")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	const size = 90 << 20
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := sha256File(t, big)
	hwm0 := peakRSS(t, d.cmd.Process.Pid)

	in, err := os.Open(big)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if r := cliAs(t, d, key, in, nil, "write", id, "/workspace/written.bin"); r.code != 0 {
		t.Fatalf("write: %s", r)
	}
	if got := sandboxSHA256(t, c, id, "/workspace/written.bin"); got != want {
		t.Errorf("write: sha256 %s, want %s", got, want)
	}
	catOut := filepath.Join(local, "cat.bin")
	cf, err := os.Create(catOut)
	if err != nil {
		t.Fatal(err)
	}
	r := cliAs(t, d, key, nil, cf, "cat", id, "/workspace/written.bin")
	cf.Close()
	if r.code != 0 || sha256File(t, catOut) != want {
		t.Errorf("cat: %s (sha256 %s)", r, sha256File(t, catOut))
	}
	// cp in, with the meter asked for; and out, from /workspace (the
	// host side) and from elsewhere (the agent).
	if r := cliAs(t, d, key, nil, nil, "cp", "--progress", big, id+":/workspace/cp.bin"); r.code != 0 || !strings.Contains(r.stderr, "90.0 MiB copied") {
		t.Errorf("cp in: %s", r)
	}
	if got := sandboxSHA256(t, c, id, "/workspace/cp.bin"); got != want {
		t.Errorf("cp in: sha256 %s, want %s", got, want)
	}
	if r := cliAs(t, d, key, nil, nil, "cp", id+":/workspace/cp.bin", filepath.Join(local, "out.bin")); r.code != 0 || r.stderr != "" {
		t.Errorf("cp out (no meter when stderr is no terminal): %s", r)
	}
	if got := sha256File(t, filepath.Join(local, "out.bin")); got != want {
		t.Errorf("cp out: sha256 %s, want %s", got, want)
	}
	run(t, c, id, &api.Exec{Cmd: []string{"mv", "/workspace/cp.bin", "/tmp/cp.bin"}})
	if r := cliAs(t, d, key, nil, nil, "cp", id+":/tmp/cp.bin", filepath.Join(local, "tmp.bin")); r.code != 0 {
		t.Errorf("cp out of /tmp: %s", r)
	}
	if got := sha256File(t, filepath.Join(local, "tmp.bin")); got != want {
		t.Errorf("cp out of /tmp: sha256 %s, want %s", got, want)
	}
	// Streamed: none of it was whole in the daemon's memory.
	if grew := peakRSS(t, d.cmd.Process.Pid) - hwm0; grew > size/2 {
		t.Errorf("the daemon's peak memory grew by %d MiB moving a %d MiB file", grew>>20, size>>20)
	} else {
		t.Logf("the daemon's peak memory grew by %d MiB moving a %d MiB file", grew>>20, size>>20)
	}
	// The write's record: the size and digest of what was written.
	recs, err := d.admin.Audit(ctx, id, "file.write")
	if err != nil || len(recs) != 1 {
		t.Fatalf("file.write records: %v %v", recs, err)
	}
	var rec struct {
		Path    string `json:"path"`
		Content struct {
			Size   int64  `json:"bytes"`
			SHA256 string `json:"sha256"`
		} `json:"content"`
	}
	if err := json.Unmarshal(recs[0].Data, &rec); err != nil || rec.Path != "/workspace/written.bin" || rec.Content.Size != size || rec.Content.SHA256 != want {
		t.Errorf("file.write record: %s %v", recs[0].Data, err)
	}
}

// peakRSS is a process's peak resident memory (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// failingReader reads r, then fails with err once n bytes went.
type failingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	if int64(len(p)) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= int64(n)
	return n, err
}

// bigTar is a tar stream of dirs then one file of size zero bytes, named
// name, made as it is read.
func bigTar(dirs []string, name string, size int64) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		for _, d := range dirs {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
			pw.CloseWithError(err)
			return
		}
		if _, err := io.CopyN(tw, zeros{}, size); err != nil {
			pw.CloseWithError(err)
			return
		}
		pw.CloseWithError(tw.Close())
	}()
	return pr
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Regression (issue 14): a refused directory upload left a partial
// directory. An upload or a write that fails midway (a broken archive, a
// full disk, a client that goes away, a secret the policy blocks) leaves
// the target exactly as it was, and no stage behind.
func TestServeFailedUploadChangesNothing(t *testing.T) {
	forEachWall(t, serveFailedUploadChangesNothing)
}

func serveFailedUploadChangesNothing(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	c, key := filesTenant(t, d, "failedup")
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if _, _, end := run(t, c, id, sh("mkdir -p /workspace/t/src && echo keep > /workspace/t/src/keep.txt && echo f > /workspace/t/f.txt")); end.ExitCode != 0 {
		t.Fatal("setup")
	}
	before := sandboxTree(t, c, id, "/workspace")
	unchanged := func(what string) {
		t.Helper()
		if got := sandboxTree(t, c, id, "/workspace"); got != before {
			t.Errorf("%s: /workspace changed:\n got %s\nwant %s", what, got, before)
		}
	}
	var good bytes.Buffer
	tw := tar.NewWriter(&good)
	_ = tw.WriteHeader(&tar.Header{Name: "src/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "src/new.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4 << 20})
	_, _ = tw.Write(bytes.Repeat([]byte("n"), 4<<20))
	_ = tw.WriteHeader(&tar.Header{Name: "src/sub/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "src/sub/more.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("m"))
	_ = tw.Close()
	archive := good.Bytes()

	// The archive cut short inside its first file.
	if _, err := c.Upload(ctx, id, "/workspace/t", bytes.NewReader(archive[:2<<20])); code(err) != api.CodeInvalidArgument {
		t.Errorf("a cut archive: %v", err)
	}
	unchanged("a cut archive")
	// Garbage after a whole first file.
	bad := append(append([]byte{}, archive[:512+4<<20]...), bytes.Repeat([]byte{0xff}, 1024)...)
	if _, err := c.Upload(ctx, id, "/workspace/t", bytes.NewReader(bad)); code(err) != api.CodeInvalidArgument {
		t.Errorf("garbage in the archive: %v", err)
	}
	unchanged("garbage")
	// More than the sandbox's disk holds, into a directory to be made.
	if _, err := c.Upload(ctx, id, "/workspace/t/new/deeper", bigTar([]string{"a", "a/b"}, "a/b/huge", 100<<20)); err == nil {
		t.Error("an upload past the disk: no error")
	}
	unchanged("a full disk")
	// A write past the disk leaves the file it replaces.
	if err := c.WriteFileFrom(ctx, id, "/workspace/t/f.txt", io.LimitReader(zeros{}, 100<<20), 0o644); err == nil {
		t.Error("a write past the disk: no error")
	}
	unchanged("a write past the disk")
	// A client whose body fails midway: the request breaks off.
	if _, err := c.Upload(ctx, id, "/workspace/t", &failingReader{r: bytes.NewReader(archive), n: 3 << 20, err: errors.New("the client's disk failed")}); err == nil {
		t.Error("a broken request: no error")
	}
	if err := c.WriteFileFrom(ctx, id, "/workspace/t/f.txt", &failingReader{r: zeros{}, n: 3 << 20, err: errors.New("the client's disk failed")}, 0o644); err == nil {
		t.Error("a broken write: no error")
	}
	// What a request that broke off left is not in place (its stage may
	// still be going: the daemon learns of a broken request as the agent
	// does, at once, and nothing waits for the agent's cleanup).
	if got := sandboxTree(t, c, id, "/workspace/t/src"); got != "keep.txt=keep" {
		t.Errorf("after broken requests: %s", got)
	}
	if b, err := c.ReadFile(ctx, id, "/workspace/t/f.txt"); err != nil || string(b) != "f\n" {
		t.Errorf("after broken writes: %q %v", b, err)
	}
	// cp of a local directory that holds a credential, under the block
	// policy: refused at the second file, nothing in place.
	local := t.TempDir()
	_ = os.MkdirAll(filepath.Join(local, "src"), 0o755)
	_ = os.WriteFile(filepath.Join(local, "src", "a.txt"), []byte("fine"), 0o644)
	_ = os.WriteFile(filepath.Join(local, "src", "b.txt"), []byte("token ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM\n"), 0o644)
	r := cliAs(t, d, key, nil, nil, "cp", filepath.Join(local, "src"), id+":/workspace/t2")
	if r.code == 0 || !strings.Contains(r.stderr, "credential") {
		t.Errorf("cp of a credential: %s", r)
	}
	if _, err := c.Stat(ctx, id, "/workspace/t2"); code(err) != api.CodeNotFound {
		t.Errorf("a refused cp made its directory: %v", err)
	}
	// An upload that would merge into another filesystem than its stage's
	// (a writable root's /tmp is the scratch's) is refused before
	// anything moves: rename cannot cross it.
	wr, err := c.CreateSandbox(ctx, &api.CreateSandbox{WritableRootfs: true})
	if err != nil {
		t.Fatal(err)
	}
	var cross bytes.Buffer
	tw = tar.NewWriter(&cross)
	_ = tw.WriteHeader(&tar.Header{Name: "top.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("t"))
	_ = tw.WriteHeader(&tar.Header{Name: "tmp/x.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	if _, err := c.Upload(ctx, wr.ID, "/", &cross); code(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "another filesystem") {
		t.Errorf("an upload across a mount: %v", err)
	}
	if out, _, _ := run(t, c, wr.ID, sh(`ls -A / /tmp | grep -c 'top.txt\|x.txt\|airlock-upload'`)); strings.TrimSpace(out) != "0" {
		t.Errorf("an upload across a mount left %s file(s)", out)
	}
	// And a good one goes in whole, merged into what is there.
	if _, err := c.Upload(ctx, id, "/workspace/t", bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	if got := sandboxTree(t, c, id, "/workspace/t/src/sub"); got != "more.txt=m" {
		t.Errorf("a whole upload: %s", got)
	}
	if b, err := c.ReadFile(ctx, id, "/workspace/t/src/keep.txt"); err != nil || string(b) != "keep\n" {
		t.Errorf("a whole upload dropped keep.txt: %q %v", b, err)
	}
}
