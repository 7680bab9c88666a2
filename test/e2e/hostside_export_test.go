package e2e

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

// Issue 12, items 10-12: what the host writes or shows of a sandbox's
// links, names and modes.

// linkChain is the attack: d -> . makes d/d/.../.. climb, in the
// kernel's eyes, past every directory it appears to stay under.
const linkChain = `ln -s . d; ln -s d/d/d/d/d/d/d/d/../../../../../../../.. e; mkdir -p sub; ln -s ../d/.. sub/up; ln -s ../README sub/ok`

// outside returns the links under dir that the kernel resolves outside it.
func outside(t *testing.T, dir string) []string {
	t.Helper()
	var bad []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		if r, err := filepath.EvalSymlinks(p); err == nil && r != dir && !strings.HasPrefix(r, dir+"/") {
			bad = append(bad, p+" -> "+r)
		}
		return nil
	})
	return bad
}

func TestExportLinkChainStaysInside(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		export := filepath.Join(t.TempDir(), "out")
		// The sandbox makes its files writable by everyone; the user's umask
		// (0 here) must not be what keeps them from being so on the host.
		old := syscall.Umask(0)
		r := w.run(t, "--export", export, "--", "sh", "-c", "echo r > README; "+worldWritable+linkChain)
		syscall.Umask(old)
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		noneWritableByOthers(t, export)
		if bad := outside(t, export); len(bad) > 0 {
			t.Fatalf("the export holds links that resolve outside it: %v", bad)
		}
		if _, err := os.ReadFile(filepath.Join(export, "e", "etc", "shadow")); err == nil {
			t.Fatal("the host's /etc/shadow is readable through the export")
		}
		for _, p := range []string{"e", "sub/up"} {
			if _, err := os.Lstat(filepath.Join(export, p)); err == nil {
				t.Errorf("exported %s", p)
			}
			if !strings.Contains(r.stderr, "skipped "+p+" (symlink to ") {
				t.Errorf("%s not named:\n%s", p, r.stderr)
			}
		}
		for _, p := range []string{"d", "sub/ok"} {
			if _, err := os.Readlink(filepath.Join(export, p)); err != nil {
				t.Errorf("%s not exported: %v", p, err)
			}
		}
		noResidue(t)
	})
}

// worldWritable makes a file and a directory (with a file) writable by
// every user.
const worldWritable = `chmod 666 README; mkdir wide; echo w > wide/f; chmod 777 wide wide/f; `

// noneWritableByOthers fails the test if what was written under dir from
// worldWritable is writable by group or others, or was not written.
func noneWritableByOthers(t *testing.T, dir string) {
	t.Helper()
	for p, want := range map[string]fs.FileMode{"README": 0o644, "wide": fs.ModeDir | 0o755, "wide/f": 0o755} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s on the host: %v, want %v (%v)", p, fi.Mode(), want, err)
		}
	}
}

// hostileNames makes files whose names would erase a line, write the
// reviewer's clipboard (OSC 52) and forge a diff header.
const hostileNames = `for n in "$(printf 'erase\033[2K')" "$(printf 'clip\033]52;c;cm0gLXJmIH4=\007')"; do echo hi > "$n"; done; mkdir "$(printf 'x\n+++ b')" && echo hi > "$(printf 'x\n+++ b')/forged"; ln -s "$(printf 't\033[2J')" "$(printf 'l\033[1A')"`

// rawBytes fails the test if text holds a terminal control byte or a
// forged diff line.
func rawBytes(t *testing.T, what, text string) {
	t.Helper()
	if strings.ContainsAny(text, "\x1b\a") || strings.Contains(text, "\n+++ b/forged") {
		t.Errorf("%s: raw sandbox-chosen bytes reach the terminal:\n%q", what, text)
	}
}

func TestRunDiffQuotesHostileNames(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := w.run(t, "--diff", "--", "sh", "-c", hostileNames)
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		rawBytes(t, "run --diff stdout", r.stdout)
		rawBytes(t, "run --diff stderr", r.stderr)
		for _, want := range []string{`+++ "b/x\n+++ b/forged"`, `+++ "b/erase\033[2K"`, `+++ "b/clip\033]52;c;cm0gLXJmIH4=\a"`, `added symlink "l\033[1A" -> "t\033[2J"`} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("diff lacks %s:\n%s", want, r.stdout)
			}
		}
		noResidue(t)
	})
}

// Through the daemon: ls, diff, cp and the audit report quote the names,
// and cp out of the sandbox writes none of the chain's links.
func TestServeHostileNamesAndLinks(t *testing.T) {
	forEachWall(t, serveHostileNamesAndLinks)
}

func serveHostileNamesAndLinks(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	tn, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: "names"})
	if err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) result {
		t.Helper()
		cmd := exec.Command(airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", data}, args...)...)
		cmd.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock, "AIRLOCK_API_KEY="+tn.Key)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		r := result{stdout: out.String(), stderr: errb.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		}
		return r
	}
	r := cli("create", "--ttl", "5m")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	if r = cli("exec", id, "--", "sh", "-c", "mkdir out && cd out && echo r > README && "+worldWritable+hostileNames+"; "+linkChain); r.code != 0 {
		t.Fatalf("exec: %s", r)
	}
	r = cli("ls", "--depth", "2", id, "/workspace/out")
	if r.code != 0 || !strings.Contains(r.stdout, `"/workspace/out/x\n+++ b/forged"`) {
		t.Errorf("ls: %s", r)
	}
	rawBytes(t, "ls", r.stdout+r.stderr)
	r = cli("diff", id)
	if r.code != 0 || !strings.Contains(r.stdout, `+++ "b/out/x\n+++ b/forged"`) {
		t.Errorf("diff: %s", r)
	}
	rawBytes(t, "diff", r.stdout+r.stderr)

	local := t.TempDir()
	old := syscall.Umask(0) // not what keeps the sandbox's modes off the host
	r = cli("cp", id+":/workspace/out", local)
	syscall.Umask(old)
	if r.code != 0 {
		t.Fatalf("cp out: %s", r)
	}
	noneWritableByOthers(t, filepath.Join(local, "out"))
	rawBytes(t, "cp", r.stdout+r.stderr)
	if bad := outside(t, local); len(bad) > 0 {
		t.Fatalf("cp wrote links that resolve outside %s: %v", local, bad)
	}
	for _, p := range []string{"out/e", "out/sub/up"} {
		if _, err := os.Lstat(filepath.Join(local, p)); err == nil {
			t.Errorf("cp wrote %s", p)
		}
		if !strings.Contains(r.stderr, "skipped "+p+" (symlink to ") {
			t.Errorf("cp did not name %s:\n%s", p, r.stderr)
		}
	}
	if b, err := os.ReadFile(filepath.Join(local, "out", "sub", "ok")); err != nil || string(b) != "r\n" {
		t.Errorf("a link inside: %q %v", b, err)
	}
	// A nested path keeps its base name: out/sub lands as sub, its hard
	// link as a link (the archive names both by their path below
	// /workspace).
	if r = cli("exec", id, "--", "sh", "-c", "echo h > out/sub/f && ln out/sub/f out/sub/hard"); r.code != 0 {
		t.Fatalf("exec: %s", r)
	}
	nested := t.TempDir()
	if r = cli("cp", id+":/workspace/out/sub", nested); r.code != 0 {
		t.Fatalf("cp of a nested path: %s", r)
	}
	a, err1 := os.Stat(filepath.Join(nested, "sub", "f"))
	b, err2 := os.Stat(filepath.Join(nested, "sub", "hard"))
	if err1 != nil || err2 != nil || !os.SameFile(a, b) {
		t.Errorf("cp of a nested path: %v %v", err1, err2)
	}

	if r = cli("rm", id); r.code != 0 {
		t.Fatalf("rm: %s", r)
	}
	r = auditCLI(t, data, "report", id)
	if r.code != 0 || !strings.Contains(r.stdout, `"out/x\n+++ b/forged"`) {
		t.Errorf("audit report: %s", r)
	}
	rawBytes(t, "audit report", r.stdout+r.stderr)
	noResidue(t)
}

// A sandbox makes a setuid copy of a shell and a world-writable setgid
// directory; the snapshot's files on the host (owned by root: the
// snapshot maps the workspace to its owner) carry no set-id bit.
func TestServeSnapshotStripsSetID(t *testing.T) {
	forEachWall(t, serveSnapshotStripsSetID)
}

func serveSnapshotStripsSetID(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "setid", api.Quotas{})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	out, _, end := run(t, c, sb.ID, &api.Exec{User: "root", Cmd: []string{"sh", "-c", "cp /bin/sh suid && chmod 6755 suid && mkdir -m 2777 shared && mkdir -m 1777 tmp && stat -c '%a %n' suid shared tmp"}})
	if end.ExitCode != 0 || !strings.Contains(out, "6755 suid") || !strings.Contains(out, "2777 shared") {
		t.Fatalf("the sandbox could not set up the attack: %d %s", end.ExitCode, out)
	}
	sn, err := c.Snapshot(ctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	// Snapshot files are kept by content digest, which the API does not
	// show: this daemon holds exactly one snapshot.
	ents, err := os.ReadDir(filepath.Join(data, "snapshots"))
	if err != nil || len(ents) != 1 {
		t.Fatalf("snapshot directories: %v %v", ents, err)
	}
	dir := filepath.Join(data, "snapshots", ents[0].Name(), "workspace")
	for p, want := range map[string]uint32{"suid": 0o755, "shared": 0o777, "tmp": 0o1777} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(dir, p), &st); err != nil {
			t.Fatal(err)
		}
		if got := st.Mode & 0o7777; got != want {
			t.Errorf("snapshot %s: mode %o, want %o (uid %d)", p, got, want, st.Uid)
		}
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	noResidue(t)
}

// The MCP tools' text (list_files, search_files, diff) and the diff
// `airlock mcp` prints when the session ends show the names quoted.
func TestMCPQuotesHostileNames(t *testing.T) {
	forEachWall(t, mcpQuotesHostileNames)
}

func mcpQuotesHostileNames(t *testing.T, w wallCase) {
	cs, cmd, stderr := w.mcpStdio(t)
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": hostileNames + "; printf 'a\\nhi\\n' > one.txt"}); isErr || !strings.Contains(out, "exit code: 0") {
		t.Fatalf("run_command: %s", out)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"list_files", map[string]any{}, `"/workspace/x\n+++ b/forged"`},
		{"search_files", map[string]any{"pattern": "hi"}, `"/workspace/x\n+++ b/forged":1:hi`},
		{"search_files", map[string]any{"pattern": "hi", "path": "one.txt"}, "/workspace/one.txt:2:hi"},
		{"diff", map[string]any{}, `+++ "b/x\n+++ b/forged"`},
	} {
		out, isErr := call(t, cs, c.tool, c.args)
		if isErr || !strings.Contains(out, c.want) {
			t.Errorf("%s: want %s in\n%s", c.tool, c.want, out)
		}
		rawBytes(t, c.tool, out)
	}
	_ = cs.Close()
	waitMCPExit(t, cmd)
	if !strings.Contains(stderr.String(), `+++ "b/x\n+++ b/forged"`) {
		t.Errorf("no diff on stderr:\n%s", stderr)
	}
	rawBytes(t, "airlock mcp's stderr", stderr.String())
	noResidue(t)
}
