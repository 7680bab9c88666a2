package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

// cliOf runs the CLI against daemon d as the tenant whose key is key
// ("": the admin key).
func cliOf(d *daemonProc, key string) func(t *testing.T, args ...string) result {
	return func(t *testing.T, args ...string) result {
		t.Helper()
		cmd := exec.Command(airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", d.data}, args...)...)
		cmd.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock)
		if key != "" {
			cmd.Env = append(cmd.Env, "AIRLOCK_API_KEY="+key)
		}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		r := result{stdout: out.String(), stderr: errb.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("airlock %v: %v", args, err)
		}
		return r
	}
}

// newTenantKey creates a tenant through the CLI and returns its key.
func newTenantKey(t *testing.T, d *daemonProc, name string) string {
	t.Helper()
	r := cliOf(d, "")(t, "tenant", "create", name, "--root", testRoot(t))
	if r.code != 0 || !strings.HasPrefix(r.stdout, "airlock_tenant_") {
		t.Fatalf("tenant create: %s", r)
	}
	return strings.TrimSpace(r.stdout)
}

// Issue 14: every command follows README's one exit-code table: 0 done,
// 1 failed (a missing local file is no "could not create sandbox"), 2
// usage; run, exec and attach relay the command's status and answer 125
// for their own failures. Run command by command against a real daemon.
func TestExitCodes(t *testing.T) {
	forEachWall(t, exitCodes)
}

func exitCodes(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	key := newTenantKey(t, d, "codes")
	cli, admin := cliOf(d, key), cliOf(d, "")
	r := cli(t, "create", "--ttl", "10m")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	missing := filepath.Join(t.TempDir(), "missing.txt")
	wrong := filepath.Join(t.TempDir(), "no.sock")
	for _, c := range []struct {
		args  []string
		admin bool
		want  int
		says  string // on stderr
	}{
		{[]string{"ps"}, false, 0, ""},
		{[]string{"bogus"}, false, 2, `unknown command "bogus"`},
		{[]string{"tenant", "bogus"}, true, 2, `unknown command "bogus" for "airlock tenant"`},
		{[]string{"ps", "--bogus"}, false, 2, "unknown flag"},
		{[]string{"rm"}, false, 2, "requires at least 1 arg"},
		{[]string{"create", "--memory", "lots"}, false, 2, "--memory"},
		{[]string{"create", "--ttl", "9999h"}, false, 2, "ttl"},
		{[]string{"extend", id, "soon"}, false, 2, ""},
		{[]string{"logs", id, "x"}, false, 2, "PID"},
		{[]string{"rm", "nope"}, false, 1, "no sandbox"},
		{[]string{"cat", id, "/nonexistent"}, false, 1, ""},
		{[]string{"cp", missing, id + ":/workspace"}, false, 1, "on this host"},
		{[]string{"ps", "--address", wrong}, false, 1, "no daemon socket"},
		{[]string{"logs", id, "4000000"}, false, 1, "no output kept"},
		{[]string{"tenant", "rm", "nope"}, true, 1, ""},
		{[]string{"audit", "verify", t.TempDir()}, true, 1, ""},
		{[]string{"exec", id, "--", "sh", "-c", "exit 7"}, false, 7, ""},
		{[]string{"exec", id, "--", "no-such-command"}, false, 127, ""},
		{[]string{"exec", id, "--", "/etc/hostname"}, false, 126, ""},
		{[]string{"exec", "--timeout", "1s", id, "--", "sleep", "60"}, false, 124, "timeout"},
		{[]string{"exec", id, "--", "sh", "-c", "kill -9 $$"}, false, 137, ""},
		{[]string{"exec", "nope", "--", "true"}, false, 125, "no sandbox"},
		{[]string{"exec", "--bogus", id, "--", "true"}, false, 125, "unknown flag"},
		{[]string{"exec", id, "--cwd", "/tmp", "--", "pwd"}, false, 125, "put exec's flags before the id"},
		{[]string{"exec", "--address", wrong, id, "--", "true"}, false, 125, "no daemon socket"},
		{[]string{"attach", id, "4000000"}, false, 125, ""},
		{[]string{"run", "--memory", "lots", "--", "true"}, true, 125, "--memory"},
	} {
		run := cli
		if c.admin {
			run = admin
		}
		r := run(t, c.args...)
		if r.code != c.want || !strings.Contains(r.stderr, c.says) {
			t.Errorf("airlock %s: want exit %d saying %q, got %s", strings.Join(c.args, " "), c.want, c.says, r)
		}
	}
	// Under --json the error is JSON too, with the same status.
	if r := cli(t, "cat", "--address", wrong, id, "/x"); r.code != 1 {
		t.Errorf("cat with no daemon: %s", r)
	}
	var e struct {
		Error    string `json:"error"`
		ExitCode int    `json:"exit_code"`
	}
	if r := cli(t, "create", "--json", "--ttl", "9999h"); r.code != 2 || json.Unmarshal([]byte(r.stdout), &e) != nil || e.ExitCode != 2 || e.Error == "" {
		t.Errorf("create --json of a bad ttl: %s", r)
	}
	if r := cli(t, "exec", "--json", "nope", "--", "true"); r.code != 125 || json.Unmarshal([]byte(r.stdout), &e) != nil || e.ExitCode != 125 {
		t.Errorf("exec --json in no sandbox: %s", r)
	}
	if r := cli(t, "rm", id); r.code != 0 {
		t.Errorf("rm: %s", r)
	}
}

// Issue 14: --json on every command that prints a result: exec's end,
// rm (a list, [] of outcomes), diff, extend; errors as JSON.
func TestCLIJSON(t *testing.T) {
	forEachWall(t, cliJSON)
}

func cliJSON(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	cli := cliOf(d, newTenantKey(t, d, "jsons"))
	r := cli(t, "create", "--ttl", "10m")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	r = cli(t, "exec", "--json", id, "--", "sh", "-c", "echo out; exit 3")
	var end struct {
		SandboxID  string  `json:"sandbox_id"`
		PID        uint32  `json:"pid"`
		ExecID     string  `json:"exec_id"`
		ExitCode   *int    `json:"exit_code"`
		Status     string  `json:"status"`
		DurationMS float64 `json:"duration_ms"`
	}
	body, ok := strings.CutPrefix(r.stdout, "out\n")
	if r.code != 3 || !ok || json.Unmarshal([]byte(body), &end) != nil || end.SandboxID != id || end.PID == 0 || end.ExecID == "" || end.ExitCode == nil || *end.ExitCode != 3 || end.DurationMS <= 0 {
		t.Errorf("exec --json: %s", r)
	}
	r = cli(t, "exec", "--json", "-d", id, "--", "true")
	end.ExitCode = nil
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &end) != nil || end.PID == 0 || end.ExitCode != nil {
		t.Errorf("exec -d --json: %s", r)
	}
	r = cli(t, "exec", "--json", id, "--", "no-such-command")
	if r.code != 127 || json.Unmarshal([]byte(r.stdout), &end) != nil || end.ExitCode == nil || *end.ExitCode != 127 {
		t.Errorf("exec --json of a missing command: %s", r)
	}
	if r := cli(t, "exec", id, "--", "sh", "-c", "echo new > /workspace/n.txt"); r.code != 0 {
		t.Fatalf("exec: %s", r)
	}
	var diff struct {
		SandboxID string `json:"sandbox_id"`
		Patch     string `json:"patch"`
	}
	if r := cli(t, "diff", "--json", id); r.code != 0 || json.Unmarshal([]byte(r.stdout), &diff) != nil || diff.SandboxID != id || !strings.Contains(diff.Patch, "+new") {
		t.Errorf("diff --json: %s", r)
	}
	var sb api.Sandbox
	if r := cli(t, "extend", "--json", id, "20m"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &sb) != nil || sb.ID != id {
		t.Errorf("extend --json: %s", r)
	}
	var outcomes []struct {
		ID    string `json:"id"`
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	r = cli(t, "rm", "--json", id, "nope")
	if r.code != 1 || json.Unmarshal([]byte(r.stdout), &outcomes) != nil || len(outcomes) != 2 || !outcomes[0].OK || outcomes[1].OK || !strings.Contains(outcomes[1].Error, "no sandbox") || !strings.Contains(r.stderr, "no sandbox") {
		t.Errorf("rm --json of a sandbox and no sandbox: %s", r)
	}
	if r := cli(t, "ps", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("ps --json with none: %s", r)
	}
}

// Issue 14: airlock logs prints what a background command printed since
// it started, stdout and stderr apart; --follow goes on to its end; the
// daemon keeps the newest 1 MiB, and says how much went; another tenant
// finds no sandbox.
func TestServeLogs(t *testing.T) {
	forEachWall(t, serveLogs)
}

func serveLogs(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	akey := newTenantKey(t, d, "logsa")
	cli := cliOf(d, akey)
	bob := cliOf(d, newTenantKey(t, d, "logsb"))
	r := cli(t, "create", "--ttl", "10m")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	// The command waits for /tmp/go, which the test makes once the
	// follower has shown the first line.
	r = cli(t, "exec", "-d", id, "--", "sh", "-c", "echo one; echo err >&2; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo three; exit 5")
	if r.code != 0 {
		t.Fatalf("exec -d: %s", r)
	}
	pid := strings.TrimSpace(r.stdout)
	follow := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", d.data, "logs", "-f", id, pid)
	follow.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock, "AIRLOCK_API_KEY="+akey)
	var ferr bytes.Buffer
	follow.Stderr = &ferr
	fout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = follow.Process.Kill(); _ = follow.Wait() }()
	br := bufio.NewReader(fout)
	if line, err := br.ReadString('\n'); err != nil || line != "one\n" {
		t.Fatalf("logs -f: first line %q, %v (%s)", line, err, ferr.String())
	}
	if r := cli(t, "exec", id, "--", "touch", "/tmp/go"); r.code != 0 {
		t.Fatalf("touch: %s", r)
	}
	rest, _ := io.ReadAll(br)
	if err := follow.Wait(); err != nil || string(rest) != "three\n" || ferr.String() != "err\n" {
		t.Errorf("logs -f to the end: %v, stdout %q, stderr %q", err, rest, ferr.String())
	}
	if r := cli(t, "logs", id, pid); r.code != 0 || r.stdout != "one\nthree\n" || r.stderr != "err\n" {
		t.Errorf("logs of the ended command: %s", r)
	}
	if r := bob(t, "logs", id, pid); r.code != 1 || !strings.Contains(r.stderr, "no sandbox") {
		t.Errorf("another tenant's logs: %s", r)
	}

	// 3 MiB of output: the newest 1 MiB is kept, the rest counted.
	c := d.client(t, akey)
	ctx := context.Background()
	s, err := c.ExecStream(ctx, id, &api.Exec{Cmd: []string{"sh", "-c", "head -c 3145728 /dev/zero | tr '\\0' x; echo END"}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Next()
	s.Close()
	if err != nil || first.PID == 0 {
		t.Fatalf("background exec: %+v %v", first, err)
	}
	drain := func(follow bool) (out []byte, dropped int64, end *api.ExecEnd) {
		ls, err := c.Logs(ctx, id, first.PID, follow)
		if err != nil {
			t.Fatal(err)
		}
		defer ls.Close()
		for {
			ev, err := ls.Next()
			if err == io.EOF {
				return out, dropped, end
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, ev.Stdout...)
			dropped += ev.Dropped
			if ev.End != nil {
				end = ev.End
			}
		}
	}
	drain(true) // to its end
	out, dropped, end := drain(false)
	if len(out) != 1<<20 || !bytes.HasSuffix(out, []byte("xxxEND\n")) || dropped != 3<<20+4-1<<20 || end == nil || end.ExitCode != 0 {
		t.Errorf("3 MiB of output: kept %d bytes, %d dropped, end %+v", len(out), dropped, end)
	}
	if r := cli(t, "logs", id, strconv.FormatUint(uint64(first.PID), 10)); r.code != 0 || len(r.stdout) != 1<<20 || !strings.Contains(r.stderr, "bytes of earlier output are no longer kept") {
		t.Errorf("logs of 3 MiB: %d bytes, stderr %q", len(r.stdout), r.stderr)
	}
	if r := cli(t, "rm", id); r.code != 0 {
		t.Errorf("rm: %s", r)
	}
}
