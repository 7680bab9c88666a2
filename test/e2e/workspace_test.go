package e2e

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// treeHash summarises a directory: paths, modes, link targets, contents.
func treeHash(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v %d\n", strings.TrimPrefix(p, dir), fi.Mode(), fi.Size())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			fmt.Fprintln(h, l)
		case fi.Mode().IsRegular() && fi.Size() < 1<<20:
			b, _ := os.ReadFile(p)
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWorkspaceCopyOnWriteDiffExport(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		ws := t.TempDir()
		writeFiles(t, ws, map[string]string{
			"README.md":      "line one\nline two\nline three\n",
			"gone.txt":       "delete me\n",
			"dir/keep.txt":   "kept\n",
			"dir/old/a.txt":  "a\n",
			"bin/data.bin":   "\x00\x01\x02",
			"untouched.conf": "same\n",
		})
		before := treeHash(t, ws)
		export := filepath.Join(t.TempDir(), "out")
		script := `set -e
sed -i 's/line two/line 2/' README.md
rm gone.txt
rm -r dir/old
echo new > added.txt
printf '\001\002' > bin/data.bin
mkdir -p newdir && echo deep > newdir/deep.txt
chmod 4755 added.txt
ln -s /etc/passwd escape-link
ln -s README.md inside-link
mkfifo pipe
whoami > whoami.txt`
		r := w.run(t, "--workspace", ws, "--diff", "--export", export, "--", "sh", "-c", script)
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		if after := treeHash(t, ws); after != before {
			t.Fatal("the sandbox changed the host's workspace")
		}
		for _, want := range []string{
			"--- a/README.md\n+++ b/README.md\n", "-line two\n+line 2\n",
			"--- a/gone.txt\n+++ /dev/null\n", "-delete me\n",
			"--- /dev/null\n+++ b/added.txt\n", "+new\n",
			"--- a/dir/old/a.txt\n+++ /dev/null\n", "Binary files a/bin/data.bin and b/bin/data.bin differ",
			"+++ b/newdir/deep.txt", "added symlink escape-link -> /etc/passwd",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("diff lacks %q:\n%s", want, r.stdout)
			}
		}
		if strings.Contains(r.stdout, "untouched.conf") || strings.Contains(r.stdout, "keep.txt") {
			t.Errorf("diff names unchanged files:\n%s", r.stdout)
		}
		// The export is the workspace as the sandbox left it, made safe.
		check := map[string]string{"README.md": "line one\nline 2\nline three\n", "added.txt": "new\n", "newdir/deep.txt": "deep\n", "dir/keep.txt": "kept\n", "whoami.txt": "user\n"}
		for p, want := range check {
			b, err := os.ReadFile(filepath.Join(export, p))
			if err != nil || string(b) != want {
				t.Errorf("export %s = %q, %v; want %q", p, b, err, want)
			}
		}
		for _, p := range []string{"gone.txt", "dir/old", "escape-link", "pipe"} {
			if _, err := os.Lstat(filepath.Join(export, p)); err == nil {
				t.Errorf("export holds %s", p)
			}
		}
		if l, err := os.Readlink(filepath.Join(export, "inside-link")); err != nil || l != "README.md" {
			t.Errorf("inside-link: %q %v", l, err)
		}
		if fi, err := os.Stat(filepath.Join(export, "added.txt")); err != nil || fi.Mode()&os.ModeSetuid != 0 {
			t.Errorf("export kept setuid: %v %v", fi.Mode(), err)
		}
		if !strings.Contains(r.stderr, "skipped escape-link") {
			t.Errorf("skipped link not reported:\n%s", r.stderr)
		}
		// On the gVisor wall a named pipe is the Sentry's, in its memory:
		// it never reaches the host's layer, so the diff does not name it
		// and the export has none to skip.
		fifo := w.name == "container"
		if strings.Contains(r.stdout, "added fifo pipe") != fifo || strings.Contains(r.stderr, "skipped pipe") != fifo {
			t.Errorf("the fifo in the diff and the export's skipped: want %v:\n%s", fifo, r)
		}
		noResidue(t)
	})
}

func TestWorkspaceOwnerIsSandboxUser(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		ws := t.TempDir()
		writeFiles(t, ws, map[string]string{"mine.txt": "x\n", "theirs.txt": "y\n"})
		if err := os.Chown(filepath.Join(ws, "theirs.txt"), 4321, 4321); err != nil {
			t.Fatal(err)
		}
		r := w.run(t, "--workspace", ws, "--", "sh", "-c", "stat -c '%n %U' . mine.txt theirs.txt; echo more >> mine.txt && echo wrote")
		if r.code != 0 || !strings.Contains(r.stdout, ". user\n") || !strings.Contains(r.stdout, "mine.txt user\n") || !strings.Contains(r.stdout, "theirs.txt nobody\n") || !strings.Contains(r.stdout, "wrote") {
			t.Fatalf("%s", r)
		}
	})
}

func TestEmptyWorkspace(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		r := w.run(t, "--diff", "--", "sh", "-c", "ls -A /workspace | wc -l; echo hi > /workspace/x")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "0\n") || !strings.Contains(r.stdout, "+++ b/x") {
			t.Fatalf("%s", r)
		}
	})
}

func TestHostileWorkspace(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		ws := t.TempDir()
		// Planted by whoever prepared the workspace on the host.
		_ = os.Symlink("/etc/shadow", filepath.Join(ws, "shadow"))
		_ = os.Symlink("/", filepath.Join(ws, "rootdir"))
		if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, _ := os.Create(filepath.Join(ws, "sparse"))
		_ = f.Truncate(1 << 40) // 1 TiB of nothing
		f.Close()
		export := filepath.Join(t.TempDir(), "out")
		// The sandbox tries its own tricks in the upper layer.
		script := `echo x > fifo.new; mkfifo trap; ln -s /etc/shadow shadow2; ln -sf /root rootdir;
truncate -s 100G huge; echo data >> sparse; mkdir d; ln -s ../../../../etc d/up; echo done`
		start := time.Now()
		r := w.run(t, "--workspace", ws, "--diff", "--export", export, "--", "sh", "-c", script)
		if r.code != 0 || !strings.Contains(r.stdout, "done") {
			t.Fatalf("%s", r)
		}
		if d := time.Since(start); d > 60*time.Second {
			t.Fatalf("--diff/--export took %s on a hostile workspace", d)
		}
		shadow, _ := os.ReadFile("/etc/shadow")
		if len(shadow) > 0 && bytes.Contains([]byte(r.stdout), shadow[:min(len(shadow), 20)]) {
			t.Fatal("the diff contains the host's /etc/shadow")
		}
		var found []string
		_ = filepath.WalkDir(export, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			fi, _ := d.Info()
			if fi.Mode()&(fs.ModeNamedPipe|fs.ModeDevice|fs.ModeSocket) != 0 {
				found = append(found, "special "+p)
			}
			if fi.Mode()&fs.ModeSymlink != 0 {
				l, _ := os.Readlink(p)
				if filepath.IsAbs(l) || strings.HasPrefix(filepath.Join(filepath.Dir(p), l), export) == false {
					found = append(found, "escaping link "+p+" -> "+l)
				}
			}
			return nil
		})
		if len(found) > 0 {
			t.Fatalf("export holds %v", found)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(export, "huge"), &st); err != nil || st.Blocks > 1024 {
			t.Fatalf("sparse file exported with %d blocks (%v)", st.Blocks, err)
		}
		// Nothing was written outside the export directory.
		if _, err := os.Stat("/etc/shadow2"); err == nil {
			t.Fatal("export wrote outside its directory")
		}
		noResidue(t)
	})
}

func TestRepoCommitWorkspace(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		if _, err := exec.LookPath("git"); err != nil {
			t.Skip("git is not installed: cannot build a test repository")
		}
		repo := t.TempDir()
		marker := filepath.Join(t.TempDir(), "pwned")
		git := gitIn(t, repo)
		git("init", "-q", "-b", "main")
		writeFiles(t, repo, map[string]string{"app.py": "print('v1')\n", "tests/test_app.sh": "grep -q v1 app.py\n", ".gitattributes": "*.py filter=evil\n"})
		git("add", ".")
		git("commit", "-qm", "v1")
		first := git("rev-parse", "HEAD")
		writeFiles(t, repo, map[string]string{"app.py": "print('v2')\n"})
		git("commit", "-qam", "v2")
		// Everything that would run code or leak credentials if git ran here.
		git("config", "core.fsmonitor", "touch "+marker)
		git("config", "filter.evil.smudge", "touch "+marker+"; cat")
		git("config", "remote.origin.url", "https://user:ghp_supersecret@example.com/acme/shop.git")
		hook := filepath.Join(repo, ".git", "hooks", "post-checkout")
		if err := os.WriteFile(hook, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		r := w.run(t, "--repo", repo, "--commit", first, "--diff", "--", "sh", "-c",
			"cat app.py; sh tests/test_app.sh && echo tests-pass; git log --format=%H -1; git status --porcelain; cat .git/config; echo change >> app.py")
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		for _, want := range []string{"print('v1')", "tests-pass", first, "+change"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("missing %q:\n%s", want, r)
			}
		}
		if strings.Contains(r.stdout, "ghp_supersecret") || strings.Contains(r.stdout, "remote") || strings.Contains(r.stdout, "fsmonitor") {
			t.Errorf("the repository's config reached the sandbox:\n%s", r.stdout)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("a hook, filter or fsmonitor of the repository ran")
		}
		if got := git("rev-parse", "HEAD"); got == first {
			t.Fatal("the host repository was changed")
		}
		r = w.run(t, "--repo", repo, "--commit", "no-such-rev", "--", "true")
		if r.code != 125 || !strings.Contains(r.stderr, "--commit no-such-rev") {
			t.Fatalf("bad revision: %s", r)
		}
		noResidue(t)
		if ents, _ := os.ReadDir(filepath.Join(dataDir, "tmp")); len(ents) != 0 {
			t.Fatalf("workspace checkouts left: %v", ents)
		}
	})
}

// gitIn runs git in repo (with a fixed identity), failing the test on error.
func gitIn(t *testing.T, repo string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
}
