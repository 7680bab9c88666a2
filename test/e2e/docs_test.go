package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An example is one command line of a ```sh block in the README or in
// docs/*.md (continuation lines joined), where it stands.
type example struct {
	file string
	line int
	text string
}

func (e example) String() string { return fmt.Sprintf("%s:%d", e.file, e.line) }

// docExamples reads every ```sh block of the README and docs/*.md, in
// reading order: the README first, then the docs by name.
func docExamples(t *testing.T) []example {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	var all []example
	for _, f := range append([]string{"../../README.md"}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, shExamples(strings.TrimPrefix(f, "../../"), string(b))...)
	}
	return all
}

// shExamples returns the command lines of the ```sh blocks of one
// Markdown text. Blank and comment-only lines are left out.
func shExamples(name, md string) []example {
	var out []example
	in := false
	var cur *example
	for i, l := range strings.Split(md, "\n") {
		fence := strings.HasPrefix(strings.TrimSpace(l), "```")
		switch {
		case fence && !in:
			in = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "```")) == "sh"
			continue
		case fence:
			in = false
			continue
		case !in:
			continue
		}
		if cur != nil {
			cur.text += "\n" + l
		} else {
			s := strings.TrimSpace(l)
			if s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			cur = &example{file: name, line: i + 1, text: l}
		}
		if !strings.HasSuffix(l, `\`) {
			out = append(out, *cur)
			cur = nil
		}
	}
	return out
}

// How the walk treats an example that it cannot simply run. Every other
// example must exit 0 as written.
type docRule struct {
	// skip names why the example cannot run on this machine; its airlock
	// command lines are still parsed (every flag must exist).
	skip string
	// terminal runs it on a terminal, typing "exit".
	terminal bool
	// interrupt ends it with SIGINT after this long, as a person would
	// end a --watch; it must still be running then.
	interrupt time.Duration
}

// docRules, keyed by the example's text: the walk fails when a key no
// longer stands in the docs, so that this list stays true.
var docRules = map[string]docRule{
	"./scripts/install.sh && airlock run -- echo hello": {skip: "installs into /usr/local (TestInstallScript runs it in a private mount namespace)"},
	"./scripts/test.sh": {skip: "the suite itself"},
	`sudo airlock run -t -- bash                                   # a shell in a terminal the sandbox owns`:                                       {terminal: true},
	`sudo airlock run --image docker-archive:/tmp/python.tar -- python3 -V`:                                                                        {skip: "needs a saved python image (no registry here)"},
	`sudo airlock run --image python:3.12-slim --user root --writable-rootfs --allow pypi -- pip install requests`:                                 {skip: "pulls from docker.io and installs from PyPI"},
	`sudo airlock run --allow npm --net-log net.jsonl -- npm view is-number   # only these hosts, every attempt logged`:                            {skip: "reaches the npm registry from inside a sandbox"},
	`sudo airlock image rm python:3.12-slim`:                                                                                                       {skip: "removes the image the skipped pull above would have cached"},
	`sudo -E airlock exec -it "$id" -- bash     # a terminal inside`:                                                                               {terminal: true},
	`sudo -E airlock stats --watch 1s           # CPU and memory of each, every second (^C ends it)`:                                               {interrupt: 3 * time.Second},
	`sudo -E airlock port-forward "$id" 8080:8000   # like kubectl: http://127.0.0.1:8080/ reaches the sandbox's 8000 until ^C`:                    {interrupt: 2 * time.Second},
	`sudo -E airlock exec "$id" -- sh -c 'git fetch "https://x:$GIT_TOKEN@github.com/acme/shop.git" main && make test'`:                            {skip: "reaches github.com"},
	`sudo airlock kill-all                  # with the daemon running: every tenant's sandboxes end`:                                               {skip: "uninstalling: ends every sandbox of the host's daemon"},
	`sudo systemctl disable --now airlock; sudo rm -f /etc/systemd/system/airlock.service`:                                                         {skip: "uninstalling"},
	`sudo airlock gc                        # what dead sandboxes left (cgroups, locks, checkouts, workspace copies)`:                              {skip: "uninstalling"},
	`sudo chattr -i /run/airlock/exe/*; sudo rm -rf /run/airlock   # the sealed copies of airlock-init are immutable`:                              {skip: "uninstalling"},
	`sudo rm -rf /var/lib/airlock           # images, snapshots, the daemon's database, keys and audit log: keep a copy of audit/ if you need it`:  {skip: "uninstalling"},
	`sudo rm -f /usr/local/bin/airlock /usr/local/bin/airlock-init /usr/local/share/man/man1/airlock*.1; sudo rm -rf /usr/local/share/doc/airlock`: {skip: "uninstalling"},
	`rm -rf ~/.local/state/airlock          # airlock run's and airlock mcp's logs (sudo: root's too)`:                                             {skip: "uninstalling"},
	"cd bench && sudo go test -bench . -benchtime 100x":                                                                                            {skip: "the benchmarks (minutes of a quiet machine)"},
	"cd bench && sudo go test -bench Egress -benchtime 1x":                                                                                         {skip: "the benchmarks"},
	"cd bench && sudo go test -bench PortFront -benchtime 1x":                                                                                      {skip: "the benchmarks"},
	`claude mcp add airlock -- sudo airlock mcp --workspace "$PWD" --allow pypi`:                                                                   {skip: "needs Claude Code (TestMCPStdio drives airlock mcp with the MCP inspector)"},
	`sudo airlock serve --e2b-listen 127.0.0.1:3000 &`:                                                                                             {skip: "a second daemon beside the walk's (TestE2BSDK serves the E2B front and drives it with the E2B SDK)"},
	`node app.mjs    # s = await Sandbox.create(); await s.commands.run('python3 -m http.server 8000', {background: true}); s.getHost(8000)`:       {skip: "app.mjs stands for the user's program (TestE2BSDK runs the E2B SDK against the front, getHost(8000) included)"},
	"curl --connect-to ::127.0.0.1:3000 -H \"X-API-Key: $E2B_API_KEY\" http://8000-ID.127.0.0.1:3000/   # ID: the sandbox's, from getHost":         {skip: "ID stands for a sandbox made through the E2B front (TestE2BSDK fetches getHost(8000))"},
	`airlock run -- CMD                                   # --net none: only loopback`:                                                             {skip: "CMD stands for a command"},
	`airlock run --workspace "$PWD" --allow pypi --allow api.example.com -- pip install -r requirements.txt`:                                       {skip: "installs from PyPI"},
}

// TestDocsExamplesWork runs every shell example of the README and docs/ as
// written, in reading order, in one shell, as a new user on a fresh
// machine would: against a real daemon started by the README's own `sudo
// airlock serve &`, with the files the examples name made beforehand (a
// project with a Makefile, ~/src/shop, a token file). It runs in a mount
// namespace of its own where /srv and /run/airlock are empty, so the
// examples' paths (/srv/tenants/alice, the default socket) are used as
// written and the host's stay untouched. Only the state and data
// directories are the suite's (a wrapper named airlock passes them).
func TestDocsExamplesWork(t *testing.T) {
	examples := docExamples(t)
	seen := map[string]bool{}
	for _, e := range examples {
		seen[e.text] = true
	}
	for k := range docRules {
		if !seen[k] {
			t.Errorf("docRules names an example the docs no longer have: %q", k)
		}
	}
	w := newDocWorld(t)
	status := filepath.Join(w.dir, "status")
	var script strings.Builder
	fmt.Fprintf(&script, `set -a -o errtrace
set +e
mount --make-rprivate / && mount -t tmpfs -o mode=755 tmpfs /srv && mount -t tmpfs -o mode=755 tmpfs /run/airlock || exit 99
cd %q
__status=%q
trap 'echo "$__at err $?" >> "$__status"' ERR
`, w.project, status)
	for i, e := range examples {
		r := docRules[e.text]
		fmt.Fprintf(&script, "__at=%d; echo \"$__at start\" >> \"$__status\"; echo '=== %s' >&2\n", i, e)
		switch {
		case r.skip != "":
			for _, args := range airlockArgs(e.text) {
				fmt.Fprintf(&script, "airlock %s > /dev/null\n", args)
			}
		case r.terminal:
			fmt.Fprintf(&script, "printf 'exit\\n' | script -qec %s /dev/null\n", shQuote(e.text))
		case r.interrupt > 0:
			fmt.Fprintf(&script, "timeout -s INT %d bash -c %s || [ $? = 124 ]\n", int(r.interrupt.Seconds()), shQuote(e.text))
		case background(e.text):
			fmt.Fprintf(&script, "%s\necho $! >> %q\n", e.text, w.pids)
			if strings.Contains(e.text, "airlock serve") {
				script.WriteString("for i in $(seq 300); do [ -S /run/airlock/airlock.sock ] && break; sleep 0.1; done; [ -S /run/airlock/airlock.sock ]\n")
			}
		default:
			fmt.Fprintf(&script, "%s\n", e.text)
		}
		fmt.Fprintf(&script, "echo \"$__at end\" >> \"$__status\"\n")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "bash", "-c", script.String())
	cmd.Env = w.env
	cmd.Dir = w.project
	// A file, not a pipe: the daemon started in the background keeps
	// its output open after the walk's shell is gone.
	outFile, err := os.Create(filepath.Join(w.dir, "output"))
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	cmd.Stdout, cmd.Stderr = outFile, outFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	err = cmd.Run()
	out, _ := os.ReadFile(outFile.Name())
	if ctx.Err() != nil {
		t.Errorf("the examples did not finish in time")
	}
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 99 {
		t.Fatalf("could not make the private /srv and /run/airlock:\n%s", out)
	}
	started, ended, failed := map[int]bool{}, map[int]bool{}, map[int][]string{}
	b, _ := os.ReadFile(status)
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		i, _ := strconv.Atoi(f[0])
		switch f[1] {
		case "start":
			started[i] = true
		case "end":
			ended[i] = true
		case "err":
			failed[i] = append(failed[i], "exit "+strings.Join(f[2:], " "))
		}
	}
	sections := outputSections(string(out))
	for i, e := range examples {
		switch {
		case !started[i]:
			t.Errorf("%s: never ran: %s", e, e.text)
		case len(failed[i]) > 0:
			t.Errorf("%s: failed (%s): %s\n%s", e, strings.Join(failed[i], ", "), e.text, sections[e.String()])
		case !ended[i]:
			t.Errorf("%s: did not end: %s\n%s", e, e.text, sections[e.String()])
			return // what follows never ran
		}
	}
}

// outputSections splits the walk's output by the "=== file:line" line
// written before each example.
func outputSections(out string) map[string]string {
	m := map[string]string{}
	cur := ""
	for _, l := range strings.SplitAfter(out, "\n") {
		if s, ok := strings.CutPrefix(l, "=== "); ok {
			cur = strings.TrimSpace(s)
			continue
		}
		m[cur] += l
	}
	return m
}

var backgroundRE = regexp.MustCompile(`[^&]&\s*(#.*)?$`)

func background(line string) bool { return backgroundRE.MatchString(line) }

// airlockCmdRE finds airlock run as a command: first on the line, after
// sudo, or in $(...); not a name in another program's arguments.
var airlockCmdRE = regexp.MustCompile(`(?:^|sudo\s+(?:-E\s+)?|\$\()airlock\s+(.*)`)

// airlockArgs returns, for every airlock command of a line, its words up
// to the sandbox's command (--), to be parsed with --help.
func airlockArgs(line string) []string {
	var out []string
	for _, part := range regexp.MustCompile(`;|&&|\|`).Split(line, -1) {
		part = strings.TrimSpace(strings.SplitN(part, " #", 2)[0])
		m := airlockCmdRE.FindAllStringSubmatch(part, -1)
		if m == nil {
			continue
		}
		args := m[len(m)-1][1]
		if j := strings.Index(args, " -- "); j >= 0 {
			args = args[:j]
		}
		// --help straight after the command's name: exec refuses flags
		// after the sandbox id. Every flag is still parsed.
		cmd, rest, _ := strings.Cut(args, " ")
		out = append(out, cmd+" --help "+rest)
	}
	return out
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// A docWorld is what a user has before they read the docs: a project
// directory (a git repository with a Makefile), ~/src/shop, a token file;
// sudo, which here only runs its command (the test is root), and airlock
// on PATH, which passes the suite's state directory and a data directory
// of the test's own.
type docWorld struct {
	dir, home, project, pids, data string
	env                            []string
}

func newDocWorld(t *testing.T) *docWorld {
	t.Helper()
	for _, d := range []string{"/srv", "/run/airlock"} {
		privateMountPoint(t, d)
	}
	dir := t.TempDir()
	_ = os.Chmod(dir, 0o755)
	w := &docWorld{dir: dir, home: filepath.Join(dir, "home"), pids: filepath.Join(dir, "pids"), data: newDataDir(t)}
	w.project = filepath.Join(w.home, "src", "shop")
	bin := filepath.Join(dir, "bin")
	files := map[string]string{
		bin + "/sudo":                   "#!/bin/sh\n# Root already: run the command, keeping the environment either way.\n[ \"$1\" = -E ] && shift\nexec \"$@\"\n",
		bin + "/airlock":                fmt.Sprintf("#!/bin/sh\nexec %q --state-dir %q --data-dir %q \"$@\"\n", airlockBin, stateDir, w.data),
		w.project + "/Makefile":         "test:\n\tmkdir -p out\n\t./run-tests.sh > out/report.txt\n\tcat out/report.txt\n",
		w.project + "/run-tests.sh":     "#!/bin/sh\necho 'all 3 tests passed'\n",
		w.project + "/main.go":          "package main\n\nfunc main() { println(foo()) }\n",
		w.project + "/util.go":          "package main\n\nfunc foo() string { return \"foo\" }\n",
		w.project + "/fix.sh":           "#!/bin/sh\nsed -i 's/foo()/bar()/' main.go\n",
		w.project + "/untrusted":        "#!/bin/sh\necho 'doing what it does'\n",
		w.project + "/agent-task":       "#!/bin/sh\necho 'the agent at work'\n",
		w.home + "/.config/gh-ro-token": "ghp_documentationexampletoken000000000000\n",
		// An HTTP error is a failed example, as a person reading curl's
		// output would take it.
		w.home + "/.curlrc": "fail-with-body\nsilent\nshow-error\n",
	}
	for name, body := range files {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	w.env = append(os.Environ(), "HOME="+w.home, "PATH="+bin+":"+os.Getenv("PATH"),
		"GIT_AUTHOR_NAME=u", "GIT_AUTHOR_EMAIL=u@example.com", "GIT_COMMITTER_NAME=u", "GIT_COMMITTER_EMAIL=u@example.com")
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = w.project, w.env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q", "-b", "main")
	git("add", ".")
	git("commit", "-qm", "first")
	if err := os.WriteFile(filepath.Join(w.project, "README"), []byte("shop\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", ".")
	git("commit", "-qm", "second")
	// What the examples name but a repository would not hold.
	untracked := map[string]string{"notes.txt": "remember the milk\n", "data/prices.csv": "item,price\nmilk,1\n",
		"deploy-token": "ghp_deploytokenfordocumentation0000000000\n", "new-token": "ghp_rotatedtokenfordocumentation000000000\n"}
	for name, body := range untracked {
		p := filepath.Join(w.project, name)
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// docs/network.md's policy, as the file its example names.
	if b, err := os.ReadFile("../../docs/network.md"); err == nil {
		if m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(b); m != nil {
			_ = os.WriteFile(filepath.Join(w.project, "policy.yaml"), m[1], 0o644)
		}
	}
	// Whatever the walk left running (the daemon it started with &) ends
	// with the test: the kill switch first, from the daemon's mount
	// namespace (where its socket is), as the daemon leaves its sandboxes
	// for the next one to adopt when it is stopped; then the daemon.
	t.Cleanup(func() {
		b, _ := os.ReadFile(w.pids)
		for _, l := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(l); err == nil && pid > 1 {
				ks := exec.Command("nsenter", "-t", l, "-m", "--", airlockBin, "--state-dir", stateDir, "--data-dir", w.data, "kill-all")
				if out, err := ks.CombinedOutput(); err != nil {
					t.Logf("kill-all in the walk's daemon: %v\n%s", err, out)
				}
				_ = syscall.Kill(pid, syscall.SIGTERM)
				for i := 0; i < 600 && syscall.Kill(pid, 0) == nil; i++ {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
		_ = exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", w.data, "gc").Run()
	})
	return w
}

// TestInstallScript runs the README's quick start as written,
// `./scripts/install.sh && airlock run -- echo hello`, in a mount
// namespace of its own where the directories it installs into are empty
// and private: the binary it builds is the one that then runs (through the
// suite's state directory), and the host's /usr/local stays as it was.
func TestInstallScript(t *testing.T) {
	const quickStart = "./scripts/install.sh && airlock run -- echo hello"
	found := false
	for _, e := range docExamples(t) {
		found = found || e.text == quickStart
	}
	if !found {
		t.Fatalf("the README's quick start is no longer %q", quickStart)
	}
	for _, d := range []string{"/run/airlock", "/var/lib/airlock"} {
		privateMountPoint(t, d)
	}
	bin := t.TempDir()
	_ = os.Chmod(bin, 0o755)
	data := newDataDir(t)
	wrapper := fmt.Sprintf("#!/bin/sh\nexec /usr/local/bin/airlock --state-dir %q --data-dir %q \"$@\"\n", stateDir, data)
	if err := os.WriteFile(filepath.Join(bin, "airlock"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	script := `set -e
mount --make-rprivate /
for d in /usr/local/bin /usr/local/share /etc/systemd/system /run/airlock /var/lib/airlock; do
	if [ -d "$d" ]; then mount -t tmpfs -o mode=755 tmpfs "$d"; fi
done
` + quickStart + `
test -x /usr/local/bin/airlock
test -x /usr/local/bin/airlock-init
ls /usr/local/share/doc/airlock/
`
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "sh", "-c", script)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", quickStart, err, out)
	}
	for _, want := range []string{"\nhello\n", "airlock: installed /usr/local/bin/airlock and /usr/local/bin/airlock-init", "security-model.md"} {
		if !strings.Contains("\n"+string(out), want) {
			t.Errorf("the quick start's output lacks %q:\n%s", want, out)
		}
	}
}

// privateMountPoint makes sure directory d exists to mount over (a
// private mount namespace hides what is mounted there); one it had to make
// is removed at the test's end.
func privateMountPoint(t *testing.T, d string) {
	t.Helper()
	if _, err := os.Stat(d); os.IsNotExist(err) {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(d) })
	}
}
