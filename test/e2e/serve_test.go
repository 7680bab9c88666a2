package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// daemonProc is one `airlock serve` started by a test.
type daemonProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	data  string
	sock  string
	log   *syncBuffer
	admin *client.Client
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newDataDir makes a data directory for a daemon (its database, keys and
// image store), beside the suite's own.
func newDataDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp(filepath.Dir(dataDir), "serve-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(d, 0o711)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startDaemon runs `airlock serve` on data and waits until it answers. At
// the test's end every sandbox left is destroyed and the daemon stopped.
func startDaemon(t *testing.T, data string, extra ...string) *daemonProc {
	t.Helper()
	return startDaemonWith(t, airlockBin, data, extra...)
}

func startDaemonWith(t *testing.T, bin, data string, extra ...string) *daemonProc {
	t.Helper()
	return startDaemonOpts(t, daemonOpts{bin: bin}, data, extra...)
}

// daemonOpts start a daemon elsewhere than the defaults: another binary,
// inside a network namespace (the fake internet's stand-in host), with
// extra environment, on another state directory than the suite's, with a
// wall of a walls case as the default of its creates (wallserve_test.go).
type daemonOpts struct {
	bin      string
	fi       *fakeInternet
	env      []string
	stateDir string
	wall     wallCase
}

func startDaemonOpts(t *testing.T, o daemonOpts, data string, extra ...string) *daemonProc {
	t.Helper()
	d := &daemonProc{t: t, data: data, sock: filepath.Join(data, "airlock.sock"), log: &syncBuffer{}}
	state := stateDir
	if o.stateDir != "" {
		state = o.stateDir
	}
	args := append(append([]string{"--state-dir", state, "--data-dir", data, "serve", "--socket", d.sock}, o.wall.serve...), extra...)
	d.cmd = exec.Command(o.bin, args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if o.env != nil {
		d.cmd.Env = append(os.Environ(), o.env...)
	}
	// A test binary that dies (a timeout) takes its daemons with it; their
	// sandboxes are reaped by the next run (reapStaleRuns).
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	if o.fi != nil {
		inNS(t, o.fi.Host, func() { err = d.cmd.Start() })
	} else {
		err = d.cmd.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			if d.admin != nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, _ = d.admin.KillAll(ctx, "")
				cancel()
			}
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			<-done
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("unix", d.sock); err == nil {
			c.Close()
			break
		}
		select {
		case <-done:
			t.Fatalf("daemon exited:\n%s", d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not start:\n%s", d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	key, err := os.ReadFile(filepath.Join(data, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	d.admin = d.client(t, strings.TrimSpace(string(key)))
	if err := d.admin.Health(context.Background()); err != nil {
		t.Fatalf("health: %v", err)
	}
	if o.wall.name != "" {
		// Before the daemon stops (cleanups run last first).
		t.Cleanup(func() {
			select {
			case <-done:
			default:
				d.madeOnlyOn(t, o.wall.name)
			}
		})
	}
	return d
}

func (d *daemonProc) client(t *testing.T, key string) *client.Client {
	c, err := client.New(client.Config{Address: d.sock, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// kill9 ends the daemon with SIGKILL, leaving its sandboxes running.
func (d *daemonProc) kill9() {
	_ = d.cmd.Process.Kill()
	for i := 0; i < 500 && d.cmd.ProcessState == nil; i++ {
		time.Sleep(10 * time.Millisecond)
	}
}

// testRoot is the directory that holds every t.TempDir() of the test: the
// host root its tenants are granted, so their workspaces lie under it.
func testRoot(t *testing.T) string { return filepath.Dir(t.TempDir()) }

// tenant creates a tenant, granted the test's temporary directories as
// its host root, and returns a client with its key.
func (d *daemonProc) tenant(t *testing.T, name string, q api.Quotas) *client.Client {
	t.Helper()
	tn, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: name, Quotas: q, Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if tn.Key == "" {
		t.Fatal("no key in the answer to a tenant's creation")
	}
	return d.client(t, tn.Key)
}

func code(err error) api.Code {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func wantCode(t *testing.T, what string, err error, c api.Code) {
	t.Helper()
	if code(err) != c {
		t.Errorf("%s: got %v, want code %s", what, err, c)
	}
}

func run(t *testing.T, c *client.Client, id string, req *api.Exec) (string, string, *api.ExecEnd) {
	t.Helper()
	var out, errb bytes.Buffer
	end, err := c.Exec(context.Background(), id, req, &out, &errb)
	if err != nil {
		t.Fatalf("exec %v: %v", req.Cmd, err)
	}
	return out.String(), errb.String(), end
}

func sh(script string) *api.Exec { return &api.Exec{Cmd: []string{"sh", "-c", script}} }

func TestServeSandboxLifecycle(t *testing.T) {
	forEachWall(t, serveSandboxLifecycle)
}

func serveSandboxLifecycle(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	alice := d.tenant(t, "alice", api.Quotas{})
	bob := d.tenant(t, "bob", api.Quotas{})
	ws := workspace(t)
	if err := os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("hello\nworld\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{
		Workspace: ws, Metadata: map[string]string{"k": "v"}, TTL: "10m",
		Trigger: api.Trigger{TaskID: "task-1", PromptDigest: "sha256:ab", Inputs: map[string]string{"a": "b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.Tenant != "alice" || sb.Trigger.TaskID != "task-1" || sb.Metadata["k"] != "v" {
		t.Errorf("created: %+v", sb)
	}
	id := sb.ID

	t.Run("exec", func(t *testing.T) { lifecycleExec(t, alice, id) })

	t.Run("background", func(t *testing.T) { lifecycleBackground(t, ctx, alice, id) })

	t.Run("files", func(t *testing.T) { lifecycleFiles(t, ctx, alice, id) })

	t.Run("watch", func(t *testing.T) { lifecycleWatch(t, ctx, alice, id) })

	t.Run("diff", func(t *testing.T) { lifecycleDiff(t, ctx, alice, ws, id) })

	t.Run("isolation", func(t *testing.T) { lifecycleIsolation(t, w, d, alice, id) })

	t.Run("tenants", func(t *testing.T) { lifecycleTenants(t, ctx, alice, bob, id) })

	t.Run("pause", func(t *testing.T) { lifecyclePause(t, ctx, alice, id) })

	if err := alice.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	got, err := alice.Sandbox(ctx, id)
	if err != nil || got.State != api.StateEnded || got.EndReason != "destroyed by request" {
		t.Errorf("after destroy: %+v %v", got, err)
	}
	wantCode(t, "exec after destroy", func() error { _, err := alice.Exec(ctx, id, sh("true"), nil, nil); return err }(), api.CodeNotFound)
	if _, err := os.Stat(filepath.Join(stateDir, "agents", id+".sock")); !os.IsNotExist(err) {
		t.Errorf("the agent's socket is left: %v", err)
	}
	noResidue(t)
}

func lifecycleExec(t *testing.T, alice *client.Client, id string) {
	out, errOut, end := run(t, alice, id, sh("echo out; echo err >&2; id -u; pwd; exit 3"))
	if out != "out\n1000\n/workspace\n" || errOut != "err\n" || end.ExitCode != 3 {
		t.Errorf("got %q %q %+v", out, errOut, end)
	}
	out, _, end = run(t, alice, id, &api.Exec{Cmd: []string{"sh", "-c", "id -u; echo $FOO; pwd"}, User: "root", Env: map[string]string{"FOO": "bar"}, Cwd: "/tmp"})
	if out != "0\nbar\n/tmp\n" || end.ExitCode != 0 {
		t.Errorf("root/env/cwd: %q %+v", out, end)
	}
	out, _, _ = run(t, alice, id, &api.Exec{Cmd: []string{"cat"}, Stdin: []byte("piped")})
	if out != "piped" {
		t.Errorf("stdin: %q", out)
	}
	_, _, end = run(t, alice, id, &api.Exec{Cmd: []string{"no-such-command"}})
	if end.ExitCode != 127 {
		t.Errorf("missing command: %+v", end)
	}
	_, _, end = run(t, alice, id, &api.Exec{Cmd: []string{"sleep", "30"}, Timeout: "300ms"})
	if !end.TimedOut || end.ExitCode != 124 {
		t.Errorf("timeout: %+v", end)
	}
	out, _, _ = run(t, alice, id, &api.Exec{Cmd: []string{"sh", "-c", "stty size"}, TTY: &api.TTY{Rows: 33, Cols: 101}})
	if !strings.Contains(out, "33 101") {
		t.Errorf("tty: %q", out)
	}
}

func lifecycleBackground(t *testing.T, ctx context.Context, alice *client.Client, id string) {
	s, err := alice.ExecStream(ctx, id, &api.Exec{Cmd: []string{"sh", "-c", "read line; echo got $line; sleep 60"}, Background: true, KeepStdin: true, Tag: "bg"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Next()
	s.Close()
	if err != nil || first.PID == 0 {
		t.Fatalf("start: %+v %v", first, err)
	}
	ps, err := alice.Processes(ctx, id)
	if err != nil || len(ps) != 1 || ps[0].PID != first.PID || ps[0].Tag != "bg" {
		t.Fatalf("processes: %+v %v", ps, err)
	}
	att, err := alice.Attach(ctx, id, first.PID)
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	if ev, err := att.Next(); err != nil || ev.PID != first.PID {
		t.Fatalf("attach: %+v %v", ev, err)
	}
	if err := alice.Input(ctx, id, first.PID, []byte("ping\n"), false); err != nil {
		t.Fatal(err)
	}
	ev, err := att.Next()
	if err != nil || string(ev.Stdout) != "got ping\n" {
		t.Fatalf("attached output: %+v %v", ev, err)
	}
	if err := alice.Signal(ctx, id, first.PID, "KILL"); err != nil {
		t.Fatal(err)
	}
	end, err := client.Drain(att, nil, nil)
	if err != nil || end.ExitCode != 137 {
		t.Errorf("after KILL: %+v %v", end, err)
	}
	wantCode(t, "signal a gone process", alice.Signal(ctx, id, first.PID, "TERM"), api.CodeNotFound)
}

func lifecycleFiles(t *testing.T, ctx context.Context, alice *client.Client, id string) {
	if err := alice.WriteFile(ctx, id, "/workspace/new/dir/f.txt", []byte("one two three\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := alice.ReadFile(ctx, id, "/workspace/new/dir/f.txt")
	if err != nil || string(b) != "one two three\n" {
		t.Fatalf("read back: %q %v", b, err)
	}
	out, _, _ := run(t, alice, id, sh("stat -c '%u %a' /workspace/new/dir/f.txt"))
	if out != "1000 600\n" {
		t.Errorf("owner and mode of a written file: %q", out)
	}
	if err := alice.Edit(ctx, id, "/workspace/new/dir/f.txt", "two", "2"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "edit of a missing text", alice.Edit(ctx, id, "/workspace/new/dir/f.txt", "four", "4"), api.CodeFailedPrecondition)
	if err := alice.WriteFile(ctx, id, "/workspace/dup.txt", []byte("x x"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "edit of a text that is not unique", alice.Edit(ctx, id, "/workspace/dup.txt", "x", "y"), api.CodeFailedPrecondition)
	b, _ = alice.ReadFile(ctx, id, "/workspace/new/dir/f.txt")
	if string(b) != "one 2 three\n" {
		t.Errorf("after edit: %q", b)
	}
	st, err := alice.Stat(ctx, id, "/workspace/hello.txt")
	if err != nil || st.Type != "file" || st.Size != 12 {
		t.Errorf("stat: %+v %v", st, err)
	}
	es, err := alice.ListDir(ctx, id, "/workspace/new", 1)
	if err != nil || len(es) != 1 || es[0].Path != "/workspace/new/dir" || es[0].Type != "dir" {
		t.Errorf("list depth 1: %+v %v", es, err)
	}
	es, _ = alice.ListDir(ctx, id, "/workspace/new", 2)
	if len(es) != 2 {
		t.Errorf("list depth 2: %+v", es)
	}
	if _, err := alice.MakeDir(ctx, id, "/workspace/m/n"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "mkdir of an existing dir", func() error { _, err := alice.MakeDir(ctx, id, "/workspace/m/n"); return err }(), api.CodeAlreadyExists)
	if _, err := alice.Move(ctx, id, "/workspace/m/n", "/workspace/m/o"); err != nil {
		t.Fatal(err)
	}
	if err := alice.Remove(ctx, id, "/workspace/m"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "stat of a removed dir", func() error { _, err := alice.Stat(ctx, id, "/workspace/m"); return err }(), api.CodeNotFound)
	wantCode(t, "read of a missing file", func() error { _, err := alice.ReadFile(ctx, id, "/nope"); return err }(), api.CodeNotFound)
	wantCode(t, "write to the read-only image", alice.WriteFile(ctx, id, "/usr/evil", []byte("x"), 0o644), api.CodePermissionDenied)

	// Upload a tar, download it again.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	_ = tw.WriteHeader(&tar.Header{Name: "up/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "up/a.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	_, _ = tw.Write([]byte("abc"))
	_ = tw.WriteHeader(&tar.Header{Name: "../../escape.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("e"))
	_ = tw.WriteHeader(&tar.Header{Name: "up/link", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"})
	_ = tw.Close()
	skipped, err := alice.Upload(ctx, id, "/workspace/in", &tb)
	if err != nil || len(skipped) != 1 {
		t.Fatalf("upload: %v %v", skipped, err)
	}
	if b, _ := alice.ReadFile(ctx, id, "/workspace/in/escape.txt"); string(b) != "e" {
		t.Errorf("a ../ name must land inside the target directory, got %q", b)
	}
	run(t, alice, id, sh("ln -s /etc/passwd /workspace/in/up/pw"))
	body, _, err := alice.Download(ctx, id, "/workspace/in")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	tr := tar.NewReader(body)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		data, _ := io.ReadAll(tr)
		names[h.Name] = string(data) + h.Linkname
	}
	body.Close()
	if names["in/up/a.txt"] != "abc" || names["in/up/pw"] != "/etc/passwd" {
		t.Errorf("download: %v", names)
	}
	wantCode(t, "download outside /workspace", func() error { _, _, err := alice.Download(ctx, id, "/etc"); return err }(), api.CodeInvalidArgument)
}

func lifecycleWatch(t *testing.T, ctx context.Context, alice *client.Client, id string) {
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	w, err := alice.Watch(wctx, id, "/workspace", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if ev, err := w.Next(); err != nil || ev.Op != "start" {
		t.Fatalf("watch start: %+v %v", ev, err)
	}
	run(t, alice, id, sh("echo x > /workspace/watched.txt"))
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("no event for the new file: %v", err)
		}
		if ev.Path == "/workspace/watched.txt" && ev.Op == "create" {
			break
		}
	}
}

func lifecycleDiff(t *testing.T, ctx context.Context, alice *client.Client, ws string, id string) {
	run(t, alice, id, sh("echo changed >> /workspace/hello.txt"))
	d, err := alice.Diff(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d, "+changed") || !strings.Contains(d, "new/dir/f.txt") {
		t.Errorf("diff:\n%s", d)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "hello.txt")); string(b) != "hello\nworld\n" {
		t.Errorf("the host workspace changed: %q", b)
	}
}

// lifecycleIsolation: the attack helper's cases in a long-lived sandbox
// on w; what the gVisor wall answers otherwise is attackCases'.
func lifecycleIsolation(t *testing.T, w wallCase, d *daemonProc, alice *client.Client, id string) {
	for _, c := range []string{"read-host", "write-outside", "host-procs", "ptrace", "fds", "mount", "userns", "keyctl", "tiocsti", "caps"} {
		req := &api.Exec{Cmd: []string{"/workspace/attack", c}}
		if c == "tiocsti" {
			req.TTY = &api.TTY{Rows: 24, Cols: 80} // the attack needs a terminal
		}
		out, _, end := run(t, alice, id, req)
		if found, code := findings(out, allowedOn(w, c)); len(found) > 0 || end.ExitCode != code {
			t.Errorf("attack %s on the %s wall: %q\n%s %+v", c, w.name, found, out, end)
		}
	}
	out, _, end := run(t, alice, id, &api.Exec{Cmd: []string{"/workspace/attack", "agent", filepath.Join(stateDir, "agents", id+".sock"), d.sock}})
	if strings.Contains(out, "VULNERABLE") || end.ExitCode != 0 {
		t.Errorf("agent socket: %s %+v", out, end)
	}
}

func lifecycleTenants(t *testing.T, ctx context.Context, alice *client.Client, bob *client.Client, id string) {
	// Another tenant's sandbox does not exist for bob: 404 everywhere.
	wantCode(t, "get", func() error { _, err := bob.Sandbox(ctx, id); return err }(), api.CodeNotFound)
	wantCode(t, "exec", func() error { _, err := bob.Exec(ctx, id, sh("true"), nil, nil); return err }(), api.CodeNotFound)
	wantCode(t, "read", func() error { _, err := bob.ReadFile(ctx, id, "/etc/hostname"); return err }(), api.CodeNotFound)
	wantCode(t, "destroy", bob.Destroy(ctx, id), api.CodeNotFound)
	wantCode(t, "pause", func() error { _, err := bob.Pause(ctx, id); return err }(), api.CodeNotFound)
	wantCode(t, "kill-all of another tenant", func() error { _, err := bob.KillAll(ctx, "alice"); return err }(), api.CodeNotFound)
	if l, _ := bob.Sandboxes(ctx); len(l) != 0 {
		t.Errorf("bob sees %d sandboxes", len(l))
	}
	wantCode(t, "tenant key on an admin call", func() error { _, err := bob.CreateTenant(ctx, &api.CreateTenant{Name: "x"}); return err }(), api.CodePermissionDenied)
	if _, err := alice.Sandbox(ctx, id); err != nil {
		t.Errorf("alice lost her sandbox: %v", err)
	}
}

func lifecyclePause(t *testing.T, ctx context.Context, alice *client.Client, id string) {
	if _, err := alice.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "exec while paused", func() error { _, err := alice.Exec(ctx, id, sh("true"), nil, nil); return err }(), api.CodeFailedPrecondition)
	if _, err := alice.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, _, end := run(t, alice, id, sh("true")); end.ExitCode != 0 {
		t.Errorf("after resume: %+v", end)
	}
	sb, err := alice.Extend(ctx, id, "3h")
	if err != nil || time.Until(sb.Expires) < 2*time.Hour {
		t.Errorf("extend: %+v %v", sb, err)
	}
}

func TestServeQuotasAndKillSwitch(t *testing.T) {
	forEachWall(t, serveQuotasAndKillSwitch)
}

func serveQuotasAndKillSwitch(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	small := d.tenant(t, "small", api.Quotas{MaxSandboxes: 2, MaxMemory: 3 << 30, MaxCPUs: 1.5})
	a, err := small.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 1 << 30, CPUs: 1}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = small.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 1 << 30, CPUs: 1}})
	wantCode(t, "past the CPU quota", err, api.CodeQuotaExceeded)
	_, err = small.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 3 << 30, CPUs: 0.25}})
	wantCode(t, "past the memory quota", err, api.CodeQuotaExceeded)
	if _, err := small.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 256 << 20, CPUs: 0.25}}); err != nil {
		t.Fatal(err)
	}
	_, err = small.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 256 << 20, CPUs: 0.25}})
	wantCode(t, "past the sandbox count", err, api.CodeQuotaExceeded)
	if !strings.Contains(err.Error(), "quota") {
		t.Errorf("the refusal should say which quota: %v", err)
	}

	other := d.tenant(t, "other", api.Quotas{})
	o, err := other.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	// The admin's kill switch for one tenant leaves the other alone.
	ids, err := d.admin.KillAll(ctx, "small")
	if err != nil || len(ids) != 2 {
		t.Fatalf("kill-all small: %v %v", ids, err)
	}
	if l, _ := small.Sandboxes(ctx); len(l) != 0 {
		t.Errorf("small has %d sandboxes after its kill switch", len(l))
	}
	if got, _ := small.Sandbox(ctx, a.ID); got == nil || got.State != api.StateEnded || !strings.Contains(got.EndReason, "kill switch") {
		t.Errorf("ended by the kill switch: %+v", got)
	}
	if _, _, end := run(t, other, o.ID, sh("true")); end.ExitCode != 0 {
		t.Errorf("other's sandbox: %+v", end)
	}
	// Everything, for everyone: answers when all are gone.
	if ids, err := d.admin.KillAll(ctx, ""); err != nil || len(ids) != 1 {
		t.Fatalf("kill-all: %v %v", ids, err)
	}
	// A removed tenant's key stops working at once.
	if _, err := other.Sandboxes(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.admin.DeleteTenant(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	_, err = other.Sandboxes(ctx)
	wantCode(t, "a removed tenant's key", err, api.CodeUnauthenticated)
	noResidue(t)
}

func TestServeCPUBudget(t *testing.T) {
	forEachWall(t, serveCPUBudget)
}

func serveCPUBudget(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	c := d.tenant(t, "cpu", api.Quotas{CPUSeconds: 1, CPUPeriod: "1h"})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	// Burn more than a CPU second; the sandbox is stopped within ticks.
	_, _, end := run(t, c, sb.ID, &api.Exec{Cmd: []string{"sh", "-c", "while :; do :; done"}, Timeout: "20s"})
	if !end.SandboxEnded || !strings.Contains(end.EndReason, "cpu budget") {
		t.Errorf("the busy command's end: %+v", end)
	}
	_, err = c.CreateSandbox(ctx, &api.CreateSandbox{})
	wantCode(t, "create past the CPU budget", err, api.CodeQuotaExceeded)
	noResidue(t)
}

func TestServeExpiry(t *testing.T) {
	forEachWall(t, serveExpiry)
}

func serveExpiry(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	c := d.tenant(t, "exp", api.Quotas{})
	ttl, err := c.CreateSandbox(ctx, &api.CreateSandbox{TTL: "2s"})
	if err != nil {
		t.Fatal(err)
	}
	idle, err := c.CreateSandbox(ctx, &api.CreateSandbox{IdleTimeout: "2s"})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := c.CreateSandbox(ctx, &api.CreateSandbox{IdleTimeout: "2s"})
	if err != nil {
		t.Fatal(err)
	}
	ended := func(id string) bool {
		got, err := c.Sandbox(ctx, id)
		return err == nil && got.State == api.StateEnded
	}
	// busy is used every half second, never idle, for twice the idle
	// timeout at least and until the others have ended (a destroy takes
	// its wall's time: ~1.5 s on gVisor, where runsc and the Sentry go).
	for i := 0; i < 8 || !ended(ttl.ID) || !ended(idle.ID); i++ {
		if i == 120 {
			t.Fatal("the expired sandboxes did not end within a minute")
		}
		run(t, c, busy.ID, sh("true"))
		time.Sleep(500 * time.Millisecond)
	}
	for _, x := range []struct{ id, reason string }{{ttl.ID, "TTL expired"}, {idle.ID, "idle for 2s"}} {
		got, err := c.Sandbox(ctx, x.id)
		if err != nil || got.State != api.StateEnded || got.EndReason != x.reason {
			t.Errorf("%s: %+v %v", x.reason, got, err)
		}
	}
	if got, _ := c.Sandbox(ctx, busy.ID); got == nil || got.State != api.StateRunning {
		t.Errorf("a used sandbox expired: %+v", got)
	}
}

// Regression (issue 14): one command past the memory limit ended a
// long-lived sandbox, its files and its diff with it. The commands meet
// their own limits (a child cgroup, a reserve below the sandbox's): the
// command is stopped, the reply says why, and the sandbox, its files and
// its agent live on. The same for a fork bomb.
func TestServeLimitsStopTheCommandNotTheSandbox(t *testing.T) {
	forEachWall(t, serveLimitsStopTheCommandNotTheSandbox)
}

// limitBombs are the commands that meet a long-lived sandbox's limits
// (memory 64 MiB, pids 64), and what each wall's answer says. On the
// container wall, the commands' child cgroup's limit and that the sandbox
// lives on. The gVisor wall has no such cgroup: the host's sees the
// Sentry and its host threads, not the commands (docs/security-model.md
// "Walls", what gvisor-init skips), so a command past the memory limit
// ends the whole sandbox, which the answer says (137, the sandbox ended,
// the limit in its end reason); the pids limit is the Sentry's own
// (RLIMIT_NPROC), so the fork bomb's shell fails to fork and the sandbox
// lives on, though the answer cannot name the limit. The host is not at
// stake either way.
var limitBombs = []struct {
	name      string
	cmd       []string
	container func(end *api.ExecEnd) bool
	gvisor    func(end *api.ExecEnd) bool
}{
	{"memory bomb", []string{"python3", "-c", "x = bytearray(1 << 30)"},
		func(end *api.ExecEnd) bool {
			return end.ExitCode == 137 && end.Limit == "memory" && !end.SandboxEnded && strings.Contains(end.Status, "memory limit (48MiB for the commands) exceeded")
		},
		func(end *api.ExecEnd) bool {
			return end.ExitCode == 137 && end.SandboxEnded && strings.Contains(end.EndReason, "its memory limit (64MiB) had been reached")
		}},
	// The fork bomb meets the commands' pids limit; its shell fails to fork.
	{"fork bomb", []string{"sh", "-c", "while :; do sleep 100 & done"},
		func(end *api.ExecEnd) bool {
			return end.ExitCode != 0 && end.Limit == "pids" && !end.SandboxEnded && strings.Contains(end.Status, "pids limit (32 for the commands) reached")
		},
		func(end *api.ExecEnd) bool { return end.ExitCode != 0 && !end.SandboxEnded }},
}

func serveLimitsStopTheCommandNotTheSandbox(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	c := d.tenant(t, "lim", api.Quotas{})
	create := func() string {
		sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Workspace: workspace(t), Limits: api.Limits{Pids: 64, MemoryBytes: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Destroy(ctx, sb.ID) })
		if _, _, end := run(t, c, sb.ID, sh("echo kept > /workspace/kept.txt")); end.ExitCode != 0 {
			t.Fatalf("write: %+v", end)
		}
		return sb.ID
	}
	if w.name == "gvisor" {
		for _, b := range limitBombs {
			id := create()
			_, _, end := run(t, c, id, &api.Exec{Cmd: b.cmd, Timeout: "60s"})
			got, err := c.Sandbox(ctx, id)
			ended := err == nil && got.State == api.StateEnded && got.EndReason == end.EndReason
			if !b.gvisor(end) || err != nil || ended != end.SandboxEnded {
				t.Errorf("%s: %+v; %+v %v", b.name, end, got, err)
			}
			if !end.SandboxEnded {
				if o, _, e := run(t, c, id, sh("cat /workspace/kept.txt")); o != "kept\n" || e.ExitCode != 0 {
					t.Errorf("%s: the sandbox does not live on: %q %+v", b.name, o, e)
				}
				if err := c.Destroy(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
		}
		noResidue(t)
		return
	}
	id := create()
	alive := func(after string) {
		t.Helper()
		if o, _, end := run(t, c, id, sh("cat /workspace/kept.txt")); o != "kept\n" || end.ExitCode != 0 {
			t.Fatalf("after %s: %q %+v", after, o, end)
		}
		if diff, err := c.Diff(ctx, id); err != nil || !strings.Contains(diff, "kept.txt") {
			t.Fatalf("after %s the diff is %q, %v", after, diff, err)
		}
	}
	for _, b := range limitBombs {
		if _, _, end := run(t, c, id, &api.Exec{Cmd: b.cmd, Timeout: "60s"}); !b.container(end) {
			t.Errorf("%s: %+v", b.name, end)
		}
		alive("the " + b.name)
	}
	got, err := c.Sandbox(ctx, id)
	if err != nil || got.State != api.StateRunning || got.Usage == nil || got.Usage.OOMKills < 1 || got.Usage.PidsLimited < 1 {
		t.Errorf("the sandbox after both: %+v %v", got, err)
	}
	if err := c.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	noResidue(t)
}

func TestServeRestartAdopts(t *testing.T) {
	forEachWall(t, serveRestartAdopts)
}

func serveRestartAdopts(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "r", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	c := d.client(t, tn.Key)
	keep, err := c.CreateSandbox(ctx, &api.CreateSandbox{TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	short, err := c.CreateSandbox(ctx, &api.CreateSandbox{TTL: "4s"})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	stray, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	// A proxy-mode sandbox: its proxy lives in the daemon and must come
	// back with the next one. A denied host answers 403 from the proxy
	// (no name is resolved, nothing leaves the machine).
	netbox, err := c.CreateSandbox(ctx, &api.CreateSandbox{Workspace: workspace(t), Network: api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	fetch := &api.Exec{Cmd: []string{"/workspace/attack", "fetch", "http://denied.test/", "-", "proxy"}}
	if out, _, _ := run(t, c, netbox.ID, fetch); !strings.HasPrefix(out, "STATUS 403") {
		t.Fatalf("before the restart: %q", out)
	}
	if err := c.WriteFile(ctx, keep.ID, "/tmp/state", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A command streams while the daemon is killed.
	s, err := c.ExecStream(ctx, keep.ID, sh("for i in $(seq 1 300); do echo $i; sleep 0.01; done"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	d.kill9()
	_, err = client.Drain(s, nil, nil)
	if err == nil {
		t.Error("the stream outlived the daemon")
	}
	// While no daemon runs, one sandbox's init dies (a host event), and
	// another's record no longer names its init (it cannot be adopted: it
	// must not run on unadopted either).
	_ = syscall.Kill(w.initPid(t, lost.ID), syscall.SIGKILL)
	db, err := store.Open(filepath.Join(data, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := db.Sandboxes(ctx, api.StateRunning)
	for _, r := range recs {
		switch r.ID {
		case stray.ID:
			r.InitPid = 1
		case unknown.ID:
			// As if the daemon died between making it and recording it.
			r.State = api.StateEnded
		default:
			continue
		}
		if err := db.PutSandbox(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	// The next daemon is a newer build: the agent protocol, not the
	// binary, decides whether it can adopt.
	// It runs the airlock-init of its own build, beside it.
	next := t.TempDir()
	newer := filepath.Join(next, "airlock")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/airlock-sandbox/airlock/internal/version.Version=next", "-o", next, "./cmd/airlock", "./cmd/airlock-init")
	build.Dir, build.Env = "../..", append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	d2 := w.startDaemonWith(t, newer, data)
	c = d2.client(t, tn.Key)
	if out, _, _ := run(t, c, netbox.ID, fetch); !strings.HasPrefix(out, "STATUS 403") {
		t.Errorf("the adopted proxy-mode sandbox's proxy: %q", out)
	}
	if err := c.Destroy(ctx, netbox.ID); err != nil {
		t.Fatal(err)
	}
	vethGone(t, netbox.ID)
	b, err := c.ReadFile(ctx, keep.ID, "/tmp/state")
	if err != nil || string(b) != "kept" {
		t.Fatalf("adopted sandbox lost its state: %q %v", b, err)
	}
	if o, _, end := run(t, c, keep.ID, sh("echo after")); o != "after\n" || end.ExitCode != 0 {
		t.Errorf("exec after restart: %q %+v", o, end)
	}
	got, err := c.Sandbox(ctx, lost.ID)
	if err != nil || got.State != api.StateEnded || !strings.Contains(got.EndReason, "not adopted") {
		t.Errorf("a sandbox that died meanwhile: %+v %v", got, err)
	}
	got, err = c.Sandbox(ctx, stray.ID)
	if err != nil || got.State != api.StateEnded || !strings.Contains(got.EndReason, "not in its cgroup") {
		t.Errorf("an unadoptable sandbox: %+v %v", got, err)
	}
	if len(w.cgroupProcs(stray.ID)) != 0 {
		t.Error("an unadoptable sandbox runs on")
	}
	if len(w.cgroupProcs(unknown.ID)) != 0 {
		t.Error("a sandbox without a record runs on")
	}
	// The adopted short-lived sandbox's TTL still fires.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := c.Sandbox(ctx, short.ID)
		if got != nil && got.State == api.StateEnded {
			if got.EndReason != "TTL expired" {
				t.Errorf("short: %+v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TTL did not fire after adoption: %+v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := c.Destroy(ctx, keep.ID); err != nil {
		t.Fatal(err)
	}
	noResidue(t)
}

// initPid finds the host pid of sandbox id's init from its cgroup.
func initPid(t *testing.T, id string) int {
	t.Helper()
	for _, ctl := range []string{"pids", ""} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctl, scope, id, "cgroup.procs"))
		if err != nil {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(string(b), &pid); err == nil {
			return pid
		}
	}
	t.Fatalf("no init for %s", id)
	return 0
}

func TestServeConcurrentSandboxes(t *testing.T) {
	forEachWall(t, serveConcurrentSandboxes)
}

func serveConcurrentSandboxes(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	c := d.tenant(t, "many", api.Quotas{})
	// How many at once, per wall: on the gVisor wall each is a Sentry and
	// a gofer (~57 MiB idle, its start ~10x the container's on ptrace):
	// 100 would need ~6 GiB and minutes of a CI machine's two cores, where
	// 10 race the same paths (bundles, cgroups, agent sockets, ids).
	n := map[string]int{"container": 100, "gvisor": 10}[w.name]
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Limits: api.Limits{MemoryBytes: 64 << 20}})
			if err != nil {
				errs <- fmt.Errorf("create %d: %w", i, err)
				return
			}
			var out bytes.Buffer
			end, err := c.Exec(ctx, sb.ID, sh(fmt.Sprintf("echo %d > /tmp/me; cat /tmp/me", i)), &out, nil)
			if err != nil || end.ExitCode != 0 || out.String() != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("exec %d: %q %+v %v", i, out.String(), end, err)
			}
			if err := c.Destroy(ctx, sb.ID); err != nil {
				errs <- fmt.Errorf("destroy %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	noResidue(t)
}

func TestServeMalformedRequests(t *testing.T) {
	forEachWall(t, serveMalformedRequests)
}

func serveMalformedRequests(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	c := d.tenant(t, "m", api.Quotas{})
	key := func() string {
		tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "raw"})
		if err != nil {
			t.Fatal(err)
		}
		return tn.Key
	}()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.sock)
	}}}
	do := func(method, path, auth, body string) (int, api.Error) {
		req, _ := http.NewRequest(method, "http://x"+path, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var e api.Error
		b, _ := io.ReadAll(res.Body)
		_ = json.Unmarshal(b, &e)
		return res.StatusCode, e
	}
	for _, tc := range []struct {
		method, path, auth, body string
		status                   int
		code                     api.Code
	}{
		{"POST", "/v1/sandboxes", "", `{}`, 401, api.CodeUnauthenticated},
		{"POST", "/v1/sandboxes", "wrong", `{}`, 401, api.CodeUnauthenticated},
		{"POST", "/v1/sandboxes", key, `{"image":`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", key, `{"imagee":"host"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", key, `{} {}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", key, ``, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", key, `{"metadata":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`, 413, api.CodeTooLarge},
		{"POST", "/v1/sandboxes", key, `{"ttl":"forever"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", key, `{"limits":{"memory_bytes":-5}}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", key, `{"image":"../../etc"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", key, `{"workspace":"relative/dir"}`, 400, api.CodeInvalidArgument},
		{"GET", "/v1/sandboxes/does-not-exist", key, ``, 404, api.CodeNotFound},
		{"GET", "/v1/sandboxes/" + strings.Repeat("a", 5000), key, ``, 404, api.CodeNotFound},
		{"POST", "/v1/sandboxes/x/processes/notapid/signal", key, `{"signal":"KILL"}`, 400, api.CodeInvalidArgument},
		{"GET", "/v1/nope", key, ``, 404, api.CodeNotFound},
		{"PATCH", "/v1/sandboxes", key, ``, 405, api.CodeInvalidArgument},
		{"POST", "/v1/tenants", key, `{"name":"evil"}`, 403, api.CodePermissionDenied},
		{"POST", "/v1/kill-all", d.adminKey(t), `{}`, 400, api.CodeInvalidArgument},
	} {
		status, e := do(tc.method, tc.path, tc.auth, tc.body)
		if status != tc.status || e.Code != tc.code || e.Message == "" {
			t.Errorf("%s %s %.40q: got %d %+v, want %d %s", tc.method, tc.path, tc.body, status, e, tc.status, tc.code)
		}
	}
	// Nothing was created by any of it.
	if l, _ := c.Sandboxes(ctx); len(l) != 0 {
		t.Errorf("malformed requests created %d sandboxes", len(l))
	}
	// Bad arguments to calls on a real sandbox change nothing either.
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"empty cmd": func() error { _, err := c.Exec(ctx, sb.ID, &api.Exec{}, nil, nil); return err }(),
		"bad user": func() error {
			_, err := c.Exec(ctx, sb.ID, &api.Exec{Cmd: []string{"true"}, User: "nobody"}, nil, nil)
			return err
		}(),
		"bad timeout": func() error {
			_, err := c.Exec(ctx, sb.ID, &api.Exec{Cmd: []string{"true"}, Timeout: "soon"}, nil, nil)
			return err
		}(),
		"NUL path":   c.WriteFile(ctx, sb.ID, "/tmp/a\x00b", []byte("x"), 0o644),
		"empty path": func() error { _, err := c.Stat(ctx, sb.ID, ""); return err }(),
		"bad signal": c.Signal(ctx, sb.ID, 1, "HUP"),
		"bad ttl":    func() error { _, err := c.Extend(ctx, sb.ID, "-1h"); return err }(),
	} {
		wantCode(t, what, err, api.CodeInvalidArgument)
	}
	if got, err := c.Sandbox(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Errorf("the sandbox after bad calls: %+v %v", got, err)
	}
}

func (d *daemonProc) adminKey(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(d.data, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestServeCLI(t *testing.T) {
	forEachWall(t, serveCLI)
}

func serveCLI(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	cli := func(stdin string, env []string, args ...string) result {
		t.Helper()
		cmd := exec.Command(airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", data}, args...)...)
		cmd.Env = append(os.Environ(), append([]string{"AIRLOCK_ADDRESS=" + d.sock}, env...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errb, strings.NewReader(stdin)
		err := cmd.Run()
		r := result{stdout: out.String(), stderr: errb.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		}
		return r
	}
	r := cli("", nil, "tenant", "create", "clia", "--root", testRoot(t))
	if r.code != 0 || !strings.HasPrefix(r.stdout, "airlock_tenant_") {
		t.Fatalf("tenant create: %s", r)
	}
	env := []string{"AIRLOCK_API_KEY=" + strings.TrimSpace(r.stdout)}
	if r := cli("", nil, "tenant", "update", "clia", "--scan-policy", "redact", "--max-memory", "8G", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"scan_policy": "redact"`) || !strings.Contains(r.stdout, `"max_memory_bytes": 8589934592`) {
		t.Errorf("tenant update: %s", r)
	}
	if r := cli("", nil, "tenant", "update", "clia"); r.code == 0 || !strings.Contains(r.stderr, "nothing to change") {
		t.Errorf("tenant update without a change: %s", r)
	}
	ws := t.TempDir()
	_ = os.Chmod(ws, 0o755)
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("alpha\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = cli("", env, "create", "--workspace", ws, "--ttl", "5m", "--task-id", "t1")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	// Regression (issue 14): a relative --workspace, as --help shows it,
	// was refused; the client resolves it from where it was typed.
	rel := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", data, "create", "--workspace", "./"+filepath.Base(ws))
	rel.Dir, rel.Env = filepath.Dir(ws), append(os.Environ(), append([]string{"AIRLOCK_ADDRESS=" + d.sock}, env...)...)
	relOut, err := rel.Output()
	if err != nil {
		t.Fatalf("create --workspace ./%s: %v %s", filepath.Base(ws), err, relOut)
	}
	relID := strings.TrimSpace(string(relOut))
	if r := cli("", env, "exec", relID, "--", "cat", "/workspace/a.txt"); r.code != 0 || r.stdout != "alpha\n" {
		t.Errorf("the relative workspace: %s", r)
	}
	if r := cli("", env, "rm", relID); r.code != 0 {
		t.Errorf("rm: %s", r)
	}
	// inspect and stats (issue 14): docker's habits. inspect is JSON with
	// the usage of a live sandbox; stats is its table, --json its data.
	if r := cli("", env, "inspect", id); r.code != 0 {
		t.Errorf("inspect: %s", r)
	} else {
		var got []api.Sandbox
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 || got[0].ID != id || got[0].Usage == nil || got[0].Usage.MemoryBytes <= 0 {
			t.Errorf("inspect: %v %s", err, r.stdout)
		}
	}
	if r := cli("", env, "inspect", id, "nope"); r.code == 0 || !strings.Contains(r.stderr, "nope") || !strings.Contains(r.stdout, id) {
		t.Errorf("inspect of a known and an unknown sandbox: %s", r)
	}
	if r := cli("", env, "stats"); r.code != 0 || !strings.Contains(r.stdout, "MEMORY") || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "running") {
		t.Errorf("stats: %s", r)
	}
	if r := cli("", env, "stats", "--json", id); r.code != 0 || !strings.Contains(r.stdout, `"cpu_seconds"`) {
		t.Errorf("stats --json: %s", r)
	}
	// Regression (issue 14): a wrong --address and a missing local file
	// both said "the daemon is not running".
	wrong := filepath.Join(t.TempDir(), "no.sock")
	if r := cli("", env, "ps", "--address", wrong); r.code == 0 || !strings.Contains(r.stderr, "no daemon socket at "+wrong) {
		t.Errorf("ps --address %s: %s", wrong, r)
	}
	// Under --json the error is JSON on stdout too (issue 14); a daemon
	// out of reach is a failure (1), not "could not create" (125).
	if r := cli("", env, "ps", "--json", "--address", wrong); r.code != 1 || !strings.Contains(r.stdout, `"exit_code": 1`) || !strings.Contains(r.stdout, `"error": "no daemon socket at `) {
		t.Errorf("ps --json --address %s: %s", wrong, r)
	}
	if r := cli("", env, "cp", filepath.Join(ws, "missing.txt"), id+":/workspace"); r.code == 0 || !strings.Contains(r.stderr, "on this host") || strings.Contains(r.stderr, "daemon") {
		t.Errorf("cp of a missing local file: %s", r)
	}
	// Regression (issue 14): flags after the id ran as the command.
	if r := cli("", env, "exec", id, "--cwd", "/tmp", "--", "pwd"); r.code == 0 || !strings.Contains(r.stderr, "put exec's flags before the id") {
		t.Errorf("exec ID --cwd: %s", r)
	}
	if r := cli("", env, "exec", "--cwd", "/tmp", id, "--", "pwd"); r.code != 0 || r.stdout != "/tmp\n" {
		t.Errorf("exec --cwd ID: %s", r)
	}
	if r = cli("", env, "exec", id, "--", "sh", "-c", "echo hi; exit 7"); r.code != 7 || r.stdout != "hi\n" {
		t.Errorf("exec: %s", r)
	}
	if r = cli("data in", env, "exec", "-i", id, "--", "cat"); r.stdout != "data in" {
		t.Errorf("exec -i: %s", r)
	}
	if r = cli("written\n", env, "write", id, "/workspace/b.txt"); r.code != 0 {
		t.Errorf("write: %s", r)
	}
	if r = cli("", env, "cat", id, "/workspace/b.txt"); r.stdout != "written\n" {
		t.Errorf("cat: %s", r)
	}
	if r = cli("", env, "edit", id, "/workspace/a.txt", "--old", "alpha", "--new", "beta"); r.code != 0 {
		t.Errorf("edit: %s", r)
	}
	if r = cli("", env, "ls", id); !strings.Contains(r.stdout, "/workspace/b.txt") {
		t.Errorf("ls: %s", r)
	}
	if r = cli("", env, "diff", id); !strings.Contains(r.stdout, "+beta") || !strings.Contains(r.stdout, "b.txt") {
		t.Errorf("diff: %s", r)
	}
	if r = cli("", env, "ps"); !strings.Contains(r.stdout, id) {
		t.Errorf("ps: %s", r)
	}
	local := t.TempDir()
	if err := os.MkdirAll(filepath.Join(local, "up"), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(local, "up", "u.txt"), []byte("uploaded"), 0o644)
	if r = cli("", env, "cp", filepath.Join(local, "up"), id+":/workspace"); r.code != 0 {
		t.Errorf("cp in: %s", r)
	}
	// A hostile sandbox plants a symlink to a host path in what cp brings
	// out; cp must not write through it.
	victim := t.TempDir()
	cli("", env, "exec", id, "--", "sh", "-c", "ln -s "+victim+" /workspace/up/evil; mkdir -p /workspace/up/evil2")
	out := t.TempDir()
	if r = cli("", env, "cp", id+":/workspace/up", out); r.code != 0 {
		t.Errorf("cp out: %s", r)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "up", "u.txt")); string(b) != "uploaded" {
		t.Errorf("cp round trip: %q", b)
	}
	if ents, _ := os.ReadDir(victim); len(ents) != 0 {
		t.Errorf("cp wrote through a symlink into %s", victim)
	}
	if r = cli("", env, "rm", id); r.code != 0 {
		t.Errorf("rm: %s", r)
	}
	if r = cli("", env, "exec", id, "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "no sandbox") {
		t.Errorf("exec after rm: %s", r)
	}
	// Roots through the CLI: taken away, the workspace is refused; given
	// back, listed.
	if r = cli("", nil, "tenant", "update", "clia", "--no-roots"); r.code != 0 {
		t.Errorf("tenant update --no-roots: %s", r)
	}
	if r = cli("", env, "create", "--workspace", ws); r.code == 0 || !strings.Contains(r.stderr, "roots the operator granted") {
		t.Errorf("create without roots: %s", r)
	}
	if r = cli("", nil, "tenant", "update", "clia", "--root", testRoot(t)); r.code != 0 {
		t.Errorf("tenant update --root: %s", r)
	}
	if r = cli("", nil, "tenant", "ls"); !strings.Contains(r.stdout, testRoot(t)) {
		t.Errorf("tenant ls shows no root: %s", r)
	}
	if r = cli("", nil, "tenant", "update", "clia", "--root", data); r.code == 0 || !strings.Contains(r.stderr, "overlaps the daemon's own directory") {
		t.Errorf("a root on the data directory: %s", r)
	}
	if r = cli("", nil, "kill-all", "--all", "--json"); r.code != 0 || !strings.Contains(r.stdout, "destroyed") {
		t.Errorf("kill-all: %s", r)
	}
	noResidue(t)
}

// vethGone waits for sandbox id's veth to vanish with its namespace.
func vethGone(t *testing.T, id string) {
	t.Helper()
	name := "alk" + id[:10] + "h"
	for i := 0; ; i++ {
		if _, err := net.InterfaceByName(name); err != nil {
			return
		}
		if i > 200 {
			t.Fatalf("veth %s left behind", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServeTLSAndMetrics(t *testing.T) {
	forEachWall(t, serveTLSAndMetrics)
}

func serveTLSAndMetrics(t *testing.T, w wallCase) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d := w.startDaemon(t, newDataDir(t), "--tcp", addr, "--tls-cert", certFile, "--tls-key", keyFile)
	ctx := context.Background()
	admin, err := client.New(client.Config{Address: "https://" + addr, Key: d.adminKey(t), TLS: &tls.Config{RootCAs: pool}})
	if err != nil {
		t.Fatal(err)
	}
	var tn *api.Tenant
	for i := 0; ; i++ { // the TCP listener comes up just after the socket
		if tn, err = admin.CreateTenant(ctx, &api.CreateTenant{Name: "tls"}); err == nil || i > 100 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	c, _ := client.New(client.Config{Address: "https://" + addr, Key: tn.Key, TLS: &tls.Config{RootCAs: pool}})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, end := run(t, c, sb.ID, sh("echo over tls")); out != "over tls\n" || end.ExitCode != 0 {
		t.Errorf("exec over TLS: %q %+v", out, end)
	}
	if _, err := client.New(client.Config{Address: "http://" + addr}); err == nil {
		t.Error("the SDK accepted a plain http:// address")
	}
	metrics := func(key string) (int, string) {
		req, _ := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, _ := metrics(tn.Key); code != http.StatusForbidden {
		t.Errorf("metrics with a tenant key: %d", code)
	}
	time.Sleep(1100 * time.Millisecond) // one tick of the state gauges
	code, body := metrics(d.adminKey(t))
	for _, want := range []string{"airlock_execs_total 1", "airlock_sandbox_creates_total 1", `airlock_sandboxes{state="running"} 1`, "airlock_exec_seconds_count 1"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("metrics lack %q (HTTP %d)", want, code)
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	_ = os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	_ = os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestServeSnapshots(t *testing.T) {
	forEachWall(t, serveSnapshots)
}

func serveSnapshots(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "snap", api.Quotas{})
	other := d.tenant(t, "other", api.Quotas{})
	tight := d.tenant(t, "tight", api.Quotas{MaxSnapshotBytes: 100})

	lp, err := layout.Write(filepath.Join(t.TempDir(), "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(testImage(t)); err != nil {
		t.Fatal(err)
	}
	img := "oci:" + string(lp)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Image: img, WritableRootfs: true})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.WriteFile(ctx, sb.ID, "/srv/new", []byte("by user"), 0o640))
	must(c.Remove(ctx, sb.ID, "/srv/data")) // a whiteout in the root layer
	must(c.WriteFile(ctx, sb.ID, "/workspace/w.txt", []byte("work"), 0o644))
	sn, err := c.Snapshot(ctx, sb.ID, "first")
	if err != nil {
		t.Fatal(err)
	}
	if !sn.Root || sn.Base != img || sn.Name != "first" {
		t.Errorf("snapshot: %+v", sn)
	}
	again, err := c.Snapshot(ctx, sb.ID, "again")
	if err != nil || again.ID != sn.ID {
		t.Errorf("the same content is the same snapshot: %v %v", again, err)
	}
	if got, _ := c.Sandbox(ctx, sb.ID); got == nil || got.State != api.StateRunning {
		t.Errorf("the sandbox after its snapshot: %+v", got)
	}

	// A sandbox made from it has its root and its workspace, with the
	// ownership they had.
	from, err := c.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	out, _, end := run(t, c, from.ID, &api.Exec{Cmd: []string{"attack", "stat", "/srv/new", "/srv", "/srv/data", "/bin/attack", "/workspace/w.txt"}})
	for _, want := range []string{"/srv/new 1000:1000 640", "/srv 1234:1234 755", "/srv/data: no such file", "/bin/attack 0:0 755", "/workspace/w.txt 1000:1000"} {
		if !strings.Contains(out, want) || end.ExitCode != 0 {
			t.Errorf("from the snapshot: want %q in\n%s", want, out)
		}
	}
	if b, _ := c.ReadFile(ctx, from.ID, "/srv/new"); string(b) != "by user" {
		t.Errorf("content: %q", b)
	}
	// Another tenant cannot use it, nor see it.
	_, err = other.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + sn.ID})
	wantCode(t, "another tenant's snapshot", err, api.CodeNotFound)
	if l, _ := other.Snapshots(ctx); len(l) != 0 {
		t.Errorf("other sees %d snapshots", len(l))
	}
	wantCode(t, "delete while in use", c.DeleteSnapshot(ctx, sn.ID), api.CodeFailedPrecondition)

	// A hostile workspace: links to host paths stay links; nothing is
	// written through them.
	victim := t.TempDir()
	host, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c, host.ID, sh("ln -s "+victim+" /workspace/evil && ln -s / /workspace/root && mkfifo /workspace/fifo && echo x > /workspace/plain"))
	hs, err := c.Snapshot(ctx, host.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	// What the snapshot leaves out, per wall: the fifo, which a snapshot
	// does not keep. On the gVisor wall a named pipe is the Sentry's, in
	// its memory: it never reaches the host's layer (nor diff), so there is
	// nothing to leave out.
	skipped := map[string]int{"container": 1, "gvisor": 0}[w.name]
	if hs.Root || hs.Base != "host" || len(hs.Skipped) != skipped {
		t.Errorf("host-image snapshot: %+v, want %d skipped", hs, skipped)
	}
	if ents, _ := os.ReadDir(victim); len(ents) != 0 {
		t.Errorf("the snapshot wrote through a link into %s", victim)
	}
	h2, err := c.CreateSandbox(ctx, &api.CreateSandbox{Image: "snapshot:" + hs.ID})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := run(t, c, h2.ID, sh("readlink /workspace/evil; cat /workspace/plain")); out != victim+"\nx\n" {
		t.Errorf("from the host-image snapshot: %q", out)
	}
	wr, err := c.CreateSandbox(ctx, &api.CreateSandbox{WritableRootfs: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Snapshot(ctx, wr.ID, "")
	wantCode(t, "a writable host-image sandbox", err, api.CodeFailedPrecondition)

	// Per-tenant storage quota.
	tb, err := tight.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	must(tight.WriteFile(ctx, tb.ID, "/workspace/big", bytes.Repeat([]byte("x"), 1000), 0o644))
	_, err = tight.Snapshot(ctx, tb.ID, "")
	wantCode(t, "past the snapshot quota", err, api.CodeQuotaExceeded)

	for _, id := range []string{from.ID, h2.ID} {
		must(c.Destroy(ctx, id))
	}
	must(c.DeleteSnapshot(ctx, sn.ID))
	must(c.DeleteSnapshot(ctx, hs.ID))
	if l, _ := c.Snapshots(ctx); len(l) != 0 {
		t.Errorf("after delete: %+v", l)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "snapshots")); len(ents) != 0 {
		t.Errorf("snapshot files left: %v", ents)
	}
}

// The agent speaks E2B envd's wire protocol: a Connect client of the
// public process and filesystem services, pointed at a sandbox's agent
// socket (as the daemon, root on the host, reaches it), drives it.
func TestServeAgentWire(t *testing.T) {
	forEachWall(t, serveAgentWire)
}

// winchScript says "ready" once it handles SIGWINCH, then the size each
// SIGWINCH finds, and what it read.
const winchScript = `import os, signal, sys
def winch(*_):
    s = os.get_terminal_size(0)
    print("winch", s.lines, s.columns, flush=True)
signal.signal(signal.SIGWINCH, winch)
print("ready", flush=True)
print("got", sys.stdin.readline().strip(), flush=True)
`

func serveAgentWire(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := d.tenant(t, "wire", api.Quotas{})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(stateDir, "agents", sb.ID+".sock")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: tr}
	proc := processconnect.NewProcessClient(hc, "http://agent")
	fsc := filesystemconnect.NewFilesystemClient(hc, "http://agent")

	// A terminal process fed through StreamInput, resized with Update:
	// it sees the new size, and gets the SIGWINCH a resize sends (on
	// gVisor the agent sends it: the Sentry's terminals do not).
	tag := "shell"
	stdin := true
	stream, err := proc.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "python3", Args: []string{"-c", winchScript}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Rows: 10, Cols: 20}}, Tag: &tag, Stdin: &stdin,
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetEvent().GetStart().GetPid() == 0 {
		t.Fatalf("no start event: %v", stream.Err())
	}
	var out strings.Builder
	for !strings.Contains(out.String(), "ready") && stream.Receive() {
		out.Write(stream.Msg().GetEvent().GetData().GetPty())
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: tag}}
	if _, err := proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Rows: 42, Cols: 99}}})); err != nil {
		t.Fatal(err)
	}
	in := proc.StreamInput(ctx)
	_ = in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel}}})
	_ = in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("hi\n")}}}}})
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	var end *process.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out.Write(ev.GetData().GetPty())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
			break
		}
	}
	if end == nil || !end.GetExited() || end.GetExitCode() != 0 || !strings.Contains(out.String(), "winch 42 99") || !strings.Contains(out.String(), "got hi") {
		t.Errorf("terminal process: %+v %q %v", end, out.String(), stream.Err())
	}

	// The polled watcher.
	watcher, err := fsc.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/workspace", Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fsc.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/workspace/d"})); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for i := 0; i < 50 && len(seen) == 0; i++ {
		evs, err := fsc.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: watcher.Msg.GetWatcherId()}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Msg.GetEvents() {
			seen = append(seen, e.GetName()+" "+e.GetType().String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(seen) == 0 || seen[0] != "/workspace/d EVENT_TYPE_CREATE" {
		t.Errorf("watcher events: %v", seen)
	}
	if _, err := fsc.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: watcher.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}
	_, err = fsc.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: watcher.Msg.GetWatcherId()}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a removed watcher: %v", err)
	}
	list, err := fsc.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/workspace", Depth: 1}))
	if err != nil || len(list.Msg.GetEntries()) != 1 || list.Msg.GetEntries()[0].GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("list: %v %v", list, err)
	}
}

// A sandbox of one commit of a repository: its checkout lives as long as
// the sandbox, and goes with it.
func TestServeRepoCommit(t *testing.T) {
	forEachWall(t, serveRepoCommit)
}

func serveRepoCommit(t *testing.T, w wallCase) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: cannot build a test repository")
	}
	repo := t.TempDir()
	git := gitIn(t, repo)
	git("init", "-q", "-b", "main")
	writeFiles(t, repo, map[string]string{"app.txt": "v1\n"})
	git("add", ".")
	git("commit", "-qm", "v1")
	first := git("rev-parse", "HEAD")
	writeFiles(t, repo, map[string]string{"app.txt": "v2\n"})
	git("commit", "-qam", "v2")

	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "repo", api.Quotas{})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Repo: repo, Commit: first})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := c.ReadFile(ctx, sb.ID, "/workspace/app.txt"); err != nil || string(b) != "v1\n" {
		t.Errorf("checkout: %q %v", b, err)
	}
	if out, _, _ := run(t, c, sb.ID, sh("echo v3 > app.txt && git status --porcelain")); out != " M app.txt\n" {
		t.Errorf("git inside: %q", out)
	}
	if diff, _ := c.Diff(ctx, sb.ID); !strings.Contains(diff, "-v1") || !strings.Contains(diff, "+v3") {
		t.Errorf("diff:\n%s", diff)
	}
	checkout := filepath.Join(data, "tmp", sb.ID)
	if _, err := os.Stat(checkout); err != nil {
		t.Fatalf("the checkout should live with the sandbox: %v", err)
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(checkout); err == nil {
		t.Error("the checkout outlived its sandbox")
	}
	noResidue(t)
}

// auditCLI runs `airlock audit ...` on a daemon's data directory.
func auditCLI(t *testing.T, data string, args ...string) result {
	t.Helper()
	cmd := exec.Command(airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", data, "audit"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	}
	return r
}

func TestServeAudit(t *testing.T) {
	forEachWall(t, serveAudit)
}

func serveAudit(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "aud", api.Quotas{})
	other := d.tenant(t, "peer", api.Quotas{})
	ws := workspace(t)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Workspace: ws, Trigger: api.Trigger{TaskID: "T-7", PromptDigest: "sha256:00"},
		Network: api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	run(t, c, id, &api.Exec{Cmd: []string{"sh", "-c", "echo out; echo err >&2; echo more >> /workspace/attack.txt"}, Env: map[string]string{"SECRET_NAME": "value-not-logged"}})
	run(t, c, id, &api.Exec{Cmd: []string{"/workspace/attack", "fetch", "http://denied.test/", "-", "proxy"}})
	must(c.WriteFile(ctx, id, "/workspace/f.txt", []byte("one"), 0o644))
	_, err = c.ReadFile(ctx, id, "/workspace/f.txt")
	must(err)
	must(c.Edit(ctx, id, "/workspace/f.txt", "one", "two"))
	_, err = c.ListDir(ctx, id, "/workspace", 1)
	must(err)
	_, err = c.Pause(ctx, id)
	must(err)
	_, err = c.Resume(ctx, id)
	must(err)
	_, err = c.Extend(ctx, id, "2h")
	must(err)
	_, err = c.Diff(ctx, id)
	must(err)
	_, err = c.Snapshot(ctx, id, "")
	must(err)
	// The log is out of every sandbox's reach.
	if out, _, _ := run(t, c, id, sh("ls "+filepath.Join(data, "audit")+" 2>&1; ls /var/lib/airlock/audit 2>&1")); !strings.Contains(out, "No such file") || strings.Contains(out, ".log") {
		t.Errorf("the sandbox sees the audit log: %q", out)
	}
	bad, _ := client.New(client.Config{Address: d.sock, Key: "airlock_tenant_wrong"})
	_, _ = bad.Sandboxes(ctx)
	must(c.Destroy(ctx, id))

	recs, err := c.Audit(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	// Records name the tenant by its id, not its (reusable) name.
	me, err := c.Tenants(ctx)
	if err != nil || len(me) != 1 || me[0].ID == "" {
		t.Fatalf("the tenant's own record: %+v %v", me, err)
	}
	kinds := map[string]api.AuditRecord{}
	for _, r := range recs {
		kinds[r.Kind] = r
		if r.Tenant != me[0].ID || r.Sandbox != id || r.Trigger != "T-7" {
			t.Errorf("record %d: tenant %q sandbox %q trigger %q", r.Seq, r.Tenant, r.Sandbox, r.Trigger)
		}
	}
	for _, k := range []string{"sandbox.created", "exec.start", "exec.end", "file.write", "file.read", "file.edit", "file.list", "file.diff",
		"sandbox.paused", "sandbox.resumed", "sandbox.extended", "sandbox.snapshot", "sandbox.destroyed", "egress"} {
		if _, ok := kinds[k]; !ok {
			t.Errorf("no %s record", k)
		}
	}
	if r := kinds["exec.end"]; r.Source != "reported" {
		t.Errorf("an exec's end is the sandbox's word: %+v", r)
	}
	if r := kinds["exec.start"]; r.Source != "observed" || strings.Contains(string(r.Data), "value-not-logged") {
		t.Errorf("exec.start: %s", r.Data)
	}
	if r := kinds["egress"]; !strings.Contains(string(r.Data), `"denied"`) || !strings.Contains(string(r.Data), "denied.test") {
		t.Errorf("egress: %s", r.Data)
	}
	if r := kinds["sandbox.destroyed"]; !strings.Contains(string(r.Data), "attack.txt") || !strings.Contains(string(r.Data), `"patch"`) || !regexp.MustCompile(`"path":"attack.txt"[^}]*"sha256":"[0-9a-f]{64}"`).Match(r.Data) {
		t.Errorf("the workspace changes at destroy: %s", r.Data)
	}
	// Another tenant reads nothing of it.
	if theirs, err := other.Audit(ctx, id, ""); err != nil || len(theirs) != 0 {
		t.Errorf("another tenant read %d records (%v)", len(theirs), err)
	}
	all, _ := d.admin.Audit(ctx, "", "auth")
	if len(all) == 0 {
		t.Error("no auth.failed record for a wrong key")
	}

	// The log verifies; the report reads it; one edited byte is named.
	if r := auditCLI(t, data, "verify"); r.code != 0 || !strings.HasPrefix(r.stdout, "ok:") {
		t.Fatalf("verify: %s", r)
	}
	if r := auditCLI(t, data, "report", id); r.code != 0 || !strings.Contains(r.stdout, "denied denied.test") || !strings.Contains(r.stdout, "attack.txt") {
		t.Errorf("report: %s", r)
	}
	segs, _ := filepath.Glob(filepath.Join(data, "audit", "*.log"))
	if len(segs) == 0 {
		t.Fatal("no segments")
	}
	b, _ := os.ReadFile(segs[0])
	tampered := bytes.Replace(b, []byte(`"exit_code":0`), []byte(`"exit_code":1`), 1)
	if bytes.Equal(tampered, b) {
		t.Fatal("nothing to tamper with")
	}
	must(os.WriteFile(segs[0], tampered, 0o600))
	if r := auditCLI(t, data, "verify"); r.code != 1 || !strings.Contains(r.stdout, "BAD") || !strings.Contains(r.stdout, "edited") {
		t.Errorf("verify of an edited log: %s", r)
	}
	must(os.WriteFile(segs[0], b, 0o600))
}

// kill -9 during exec traffic loses no exec a client saw start.
func TestServeAuditSurvivesKill9(t *testing.T) {
	forEachWall(t, serveAuditSurvivesKill9)
}

func serveAuditSurvivesKill9(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "k9"})
	if err != nil {
		t.Fatal(err)
	}
	c := d.client(t, tn.Key)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	acked := map[string]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				s, err := c.ExecStream(ctx, sb.ID, &api.Exec{Cmd: []string{"true"}})
				if err != nil {
					return
				}
				if ev, err := s.Next(); err == nil && ev.ExecID != "" {
					mu.Lock()
					acked[ev.ExecID] = true
					mu.Unlock()
				}
				_, _ = client.Drain(s, nil, nil)
				s.Close()
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	d.kill9()
	close(stop)
	wg.Wait()
	d2 := w.startDaemon(t, data)
	if r := auditCLI(t, data, "verify"); r.code != 0 {
		t.Fatalf("verify after kill -9: %s", r)
	}
	c = d2.client(t, tn.Key)
	recs, err := c.Audit(ctx, sb.ID, "exec.start")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		var x struct {
			ID string `json:"exec_id"`
		}
		_ = json.Unmarshal(r.Data, &x)
		seen[x.ID] = true
	}
	mu.Lock()
	defer mu.Unlock()
	if len(acked) < 20 {
		t.Fatalf("only %d execs ran before the kill", len(acked))
	}
	for id := range acked {
		if !seen[id] {
			t.Errorf("exec %s was acknowledged but is not in the log", id)
		}
	}
}

// `airlock run` writes the same records to its own signed log, ended by a
// closing checkpoint: a log cut short fails verification.
func TestRunAuditLog(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		logFile := filepath.Join(t.TempDir(), "run.audit")
		// A key pasted in the command runs as given; the log keeps it
		// redacted, and a finding by fingerprint.
		const key = "AKIAQ4ZT6WX2LR7NPJ3V"
		r := w.run(t, "--audit", logFile, "-e", "TOKEN=not-in-the-log", "--", "sh", "-c", "echo hi "+key+"; exit 3")
		if r.code != 3 {
			t.Fatalf("%s", r)
		}
		b, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"kind":"sandbox.created"`, `"kind":"exec.start"`, `"kind":"exec.end"`, `"exit_code":3`, `"kind":"sandbox.destroyed"`, `"closed":true`, `"TOKEN"`,
			`echo hi [REDACTED:aws-access-token]; exit 3`, `"kind":"secret.finding"`, `"fingerprint":"hmac:`} {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("the run's log lacks %s", want)
			}
		}
		if bytes.Contains(b, []byte("not-in-the-log")) {
			t.Error("an environment value was recorded")
		}
		if bytes.Contains(b, []byte(key)) || !strings.Contains(r.stdout, "hi "+key) {
			t.Errorf("the key: in the log %v; the command printed %q", bytes.Contains(b, []byte(key)), r.stdout)
		}
		if v := airlock(t, "", "audit", "verify", logFile); v.code != 0 {
			t.Fatalf("verify: %s", v)
		}
		lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
		cut := append(bytes.Join(lines[:len(lines)-1], []byte("\n")), '\n')
		if err := os.WriteFile(logFile, cut, 0o600); err != nil {
			t.Fatal(err)
		}
		if v := airlock(t, "", "audit", "verify", logFile); v.code != 1 || !strings.Contains(v.stdout, "checkpoint") {
			t.Errorf("a run log without its closing checkpoint: %s", v)
		}
		noResidue(t)
	})
}

// With a collector configured, audit records reach it (OTLP logs over
// HTTP), carrying their sequence numbers and hashes.
func TestServeAuditExport(t *testing.T) {
	forEachWall(t, serveAuditExport)
}

func serveAuditExport(t *testing.T, w wallCase) {
	var mu sync.Mutex
	var bodies []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
	}))
	defer collector.Close()
	d := w.startDaemon(t, newDataDir(t), "--otlp-endpoint", collector.URL)
	c := d.tenant(t, "otlp", api.Quotas{})
	sb, err := c.CreateSandbox(context.Background(), &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		mu.Lock()
		all := strings.Join(bodies, "\n")
		mu.Unlock()
		if strings.Contains(all, "sandbox.created") && strings.Contains(all, sb.ID) && strings.Contains(all, "airlock.hash") {
			break
		}
		if i > 100 {
			t.Fatalf("the collector got no sandbox.created record: %.500s", all)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A full disk stops new work with a clear error: nothing runs unrecorded.
func TestServeAuditDiskFull(t *testing.T) {
	forEachWall(t, serveAuditDiskFull)
}

func serveAuditDiskFull(t *testing.T, w wallCase) {
	data := newDataDir(t)
	logDir := filepath.Join(data, "audit")
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", logDir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=256k,mode=700"); err != nil {
		t.Skipf("cannot mount a small tmpfs for the log here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(logDir, syscall.MNT_DETACH) })
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c := d.tenant(t, "full", api.Quotas{})
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	// Fill what is left of the log's filesystem.
	filler, _ := os.Create(filepath.Join(logDir, "filler"))
	_, _ = filler.Write(make([]byte, 512<<10))
	filler.Close()
	// The log's last page may still have room for a few records: execs
	// go on until a write needs a page the filesystem no longer has.
	for i := 0; i < 200 && err == nil; i++ {
		_, err = c.Exec(ctx, sb.ID, sh("true"), nil, nil)
	}
	wantCode(t, "exec with a full audit disk", err, api.CodeUnavailable)
	if err != nil && !strings.Contains(err.Error(), "audit") {
		t.Errorf("the refusal should say why: %v", err)
	}
	// From then on nothing that would go unrecorded happens.
	wantCode(t, "a file write with a full audit disk", c.WriteFile(ctx, sb.ID, "/tmp/x", []byte("x"), 0o644), api.CodeUnavailable)
	_, err = c.CreateSandbox(ctx, &api.CreateSandbox{})
	wantCode(t, "create with a full audit disk", err, api.CodeUnavailable)
	if l, _ := c.Sandboxes(ctx); len(l) != 1 {
		t.Errorf("%d sandboxes (a create ran unrecorded?)", len(l))
	}
}
