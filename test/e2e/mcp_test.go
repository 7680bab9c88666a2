package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/api"
)

// A small project with a failing test: the agent's job is to fix it.
func buggyProject(t *testing.T) string {
	dir := t.TempDir()
	files := map[string]string{
		"calc.py":      "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
		"test_calc.py": "from calc import add, mul\n\nassert mul(2, 3) == 6, 'mul'\nassert add(2, 3) == 5, 'add(2, 3) should be 5'\nprint('all tests pass')\n",
		"README.md":    "calc: add and mul\nadd adds\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// mcpStdio starts `airlock mcp ARGS` and connects the go-sdk client to it.
func mcpStdio(t *testing.T, args ...string) (*sdk.ClientSession, *exec.Cmd, *syncBuffer) {
	t.Helper()
	return mcpStdioEnv(t, nil, args...)
}

func mcpStdioEnv(t *testing.T, env []string, args ...string) (*sdk.ClientSession, *exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", dataDir, "mcp"}, args...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	c := sdk.NewClient(&sdk.Implementation{Name: "e2e-agent", Version: "1.0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := c.Connect(ctx, &sdk.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		if t.Failed() {
			t.Logf("airlock mcp stderr:\n%s", stderr)
		}
	})
	return cs, cmd, stderr
}

// call runs a tool and returns its text and whether it was a tool error.
func call(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: a protocol error, not a tool error: %v", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

// fixTheTest is the seed example's loop: read, run the tests, edit, run
// them again, see the diff.
func fixTheTest(t *testing.T, cs *sdk.ClientSession) {
	t.Helper()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil {
			t.Errorf("tool %s lacks a description or schema", tl.Name)
		}
		// Regression (issue 14): the tools said nothing of what they may
		// do, and run_command's description promised installs the
		// default policy refuses.
		readOnly := map[string]bool{"read_file": true, "list_files": true, "search_files": true, "diff": true, "network_log": true}[tl.Name]
		if a := tl.Annotations; a == nil || a.Title == "" || a.ReadOnlyHint != readOnly {
			t.Errorf("tool %s's annotations: %+v", tl.Name, a)
		}
		if tl.Name == "run_command" && !strings.Contains(tl.Description, "egress policy allows") {
			t.Errorf("run_command's description says nothing of the network: %s", tl.Description)
		}
	}
	for _, want := range []string{"run_command", "read_file", "write_file", "edit_file", "list_files", "search_files", "diff", "network_log"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("no tool %s in %v", want, names)
		}
	}
	if out, isErr := call(t, cs, "list_files", map[string]any{}); isErr || !strings.Contains(out, "/workspace/calc.py") {
		t.Fatalf("list_files: %s", out)
	}
	if out, isErr := call(t, cs, "search_files", map[string]any{"pattern": "def add"}); isErr || !strings.Contains(out, "/workspace/calc.py:1:def add(a, b):") {
		t.Fatalf("search_files: %s", out)
	}
	if out, isErr := call(t, cs, "read_file", map[string]any{"path": "calc.py", "start_line": 1, "end_line": 2}); isErr || !strings.Contains(out, "return a - b") || strings.Contains(out, "mul") {
		t.Fatalf("read_file with a range: %s", out)
	}
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "python3 -B test_calc.py"}); isErr || !strings.Contains(out, "exit code: 1") || !strings.Contains(out, "add(2, 3) should be 5") {
		t.Fatalf("the failing test: %s", out)
	}
	if out, isErr := call(t, cs, "edit_file", map[string]any{"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"}); isErr {
		t.Fatalf("edit_file: %s", out)
	}
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "python3 -B test_calc.py"}); isErr || !strings.Contains(out, "exit code: 0") || !strings.Contains(out, "all tests pass") {
		t.Fatalf("the fixed test: %s", out)
	}
	if out, isErr := call(t, cs, "diff", map[string]any{}); isErr || !strings.Contains(out, "-    return a - b") || !strings.Contains(out, "+    return a + b") {
		t.Fatalf("diff: %s", out)
	}
	// Resources: the workspace's files.
	res, err := cs.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: "file:///workspace/calc.py"})
	if err != nil || len(res.Contents) != 1 || !strings.Contains(res.Contents[0].Text, "return a + b") {
		t.Errorf("the workspace file as a resource: %v %v", res, err)
	}
}

// toolErrors: the model gets readable tool errors, not protocol failures.
func toolErrors(t *testing.T, cs *sdk.ClientSession) {
	t.Helper()
	if out, isErr := call(t, cs, "read_file", map[string]any{"path": "nope.py"}); !isErr || !strings.Contains(strings.ToLower(out), "no such file") {
		t.Errorf("an absent file: %v %s", isErr, out)
	}
	if out, isErr := call(t, cs, "edit_file", map[string]any{"path": "README.md", "old_string": "add", "new_string": "sum"}); !isErr || !strings.Contains(out, "more than once") && !strings.Contains(out, "times") {
		t.Errorf("a non-unique edit: %v %s", isErr, out)
	}
	if out, isErr := call(t, cs, "edit_file", map[string]any{"path": "README.md", "old_string": "subtract", "new_string": "x"}); !isErr || !strings.Contains(out, "not found") && !strings.Contains(out, "does not occur") {
		t.Errorf("an absent edit: %v %s", isErr, out)
	}
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "sleep 30", "timeout_seconds": 1}); isErr || !strings.Contains(out, "TIMED OUT") {
		t.Errorf("a timeout: %v %s", isErr, out)
	}
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "yes | head -c 200000"}); isErr || !strings.Contains(out, "bytes cut") {
		t.Errorf("a large output is cut, marked: %v %.300s", isErr, out)
	}
	pasted := "ghp_" + "Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	if out, isErr := call(t, cs, "write_file", map[string]any{"path": "token.txt", "content": "token=" + pasted}); !isErr || !strings.Contains(out, "secret scan") || strings.Contains(out, pasted) {
		t.Errorf("a pasted key in a file: %v %s", isErr, out)
	}
}

func TestMCPStdio(t *testing.T) {
	forEachWall(t, mcpStdioSessions)
}

func mcpStdioSessions(t *testing.T, w wallCase) {
	proj := buggyProject(t)
	cs, cmd, stderr := w.mcpStdio(t, "--workspace", proj, "--allow", "allowed.test")
	// The session's sandbox is on w: its kernel is the host's on the
	// container wall only (TestKernelIsTheWalls).
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "uname -r"}); isErr || strings.Contains(out, unix.ByteSliceToString(u.Release[:])) != (w.name == "container") {
		t.Errorf("uname -r on the %s wall: %s", w.name, out)
	}
	fixTheTest(t, cs)
	toolErrors(t, cs)

	// A refused connection, and its reason, visible to the agent.
	out, _ := call(t, cs, "run_command", map[string]any{"command": "python3 -c \"import urllib.request; urllib.request.urlopen('http://denied.test/x', timeout=10)\""})
	if !strings.Contains(out, "exit code: 1") {
		t.Errorf("a request to a denied host succeeded: %s", out)
	}
	var log string
	for i := 0; i < 50; i++ { // egress records are written behind the request
		if log, _ = call(t, cs, "network_log", map[string]any{"only_refused": true}); strings.Contains(log, "denied.test") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(log, "DENIED") || !strings.Contains(log, "denied.test:80") || !strings.Contains(log, "no allow rule matches") {
		t.Errorf("network_log: %s", log)
	}

	// Another session has a sandbox of its own.
	other, otherCmd, _ := w.mcpStdio(t, "--workspace", proj)
	if _, isErr := call(t, other, "write_file", map[string]any{"path": "/tmp/mine", "content": "other"}); isErr {
		t.Fatal("write in the other session")
	}
	if out, isErr := call(t, cs, "read_file", map[string]any{"path": "/tmp/mine"}); !isErr {
		t.Errorf("one session read another's file: %s", out)
	}
	if out, _ := call(t, other, "read_file", map[string]any{"path": "calc.py"}); !strings.Contains(out, "return a - b") {
		t.Errorf("one session's edit reached another's workspace: %s", out)
	}

	// The session ends: its sandbox is destroyed and the diff printed.
	id := regexp.MustCompile(`sandbox ([0-9a-f]{12}) made`).FindStringSubmatch(stderr.String())
	if id == nil {
		t.Fatalf("no sandbox id on stderr:\n%s", stderr)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "agents", id[1]+".sock")); err != nil {
		t.Fatalf("the live sandbox's agent socket: %v", err)
	}
	_ = cs.Close()
	waitMCPExit(t, cmd)
	if !strings.Contains(stderr.String(), "+    return a + b") {
		t.Errorf("no diff on stderr:\n%s", stderr)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "agents", id[1]+".sock")); !os.IsNotExist(err) {
		t.Errorf("the sandbox outlived its session: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(proj, "calc.py")); !strings.Contains(string(b), "return a - b") {
		t.Error("the host's workspace was written")
	}
	_ = other.Close()
	waitMCPExit(t, otherCmd)
}

func waitMCPExit(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	for i := 0; i < 300 && cmd.ProcessState == nil; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if cmd.ProcessState == nil {
		t.Fatal("airlock mcp did not exit after its session ended")
	}
}

// keyTransport adds a tenant key to every request, over the daemon's
// unix socket.
type keyTransport struct {
	key, sock string
	base      http.RoundTripper
}

func (k *keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return k.base.RoundTrip(r)
}

// mcpPost sends one JSON-RPC message to /mcp in session sid ("" opens
// one) and returns the session id and the answer's body.
func mcpPost(t *testing.T, hc *http.Client, sid, body string) (string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://airlock/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Header.Get("Mcp-Session-Id"), string(b)
}

func unixHTTP(sock, key string) *http.Client {
	return &http.Client{Transport: &keyTransport{key: key, sock: sock, base: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}}
}

func TestServeMCP(t *testing.T) {
	forEachWall(t, serveMCP)
}

func serveMCP(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "mcp", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	c := d.client(t, tn.Key)
	proj := buggyProject(t)
	if err := c.SetMCPSpec(ctx, &api.CreateSandbox{Workspace: proj}); err != nil {
		t.Fatal(err)
	}
	connect := func(key string) *sdk.ClientSession {
		cl := sdk.NewClient(&sdk.Implementation{Name: "e2e-http-agent", Version: "2.0"}, nil)
		cs, err := cl.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: "http://airlock/mcp", HTTPClient: unixHTTP(d.sock, key)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	cs := connect(tn.Key)
	fixTheTest(t, cs)
	toolErrors(t, cs)

	// The session is bound to the key that opened it.
	other, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "mcp-other", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"calc.py"}}}`
	req, _ := http.NewRequest("POST", "http://airlock/mcp", strings.NewReader(body))
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := unixHTTP(d.sock, other.Key).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("another key on the session: %d", resp.StatusCode)
	}
	req, _ = http.NewRequest("POST", "http://airlock/mcp", strings.NewReader(body))
	if resp, err := unixHTTP(d.sock, "").Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no key: %v %v", resp, err)
	}

	// Its sandbox carries the session as its trigger, and ends with it.
	sbs, _ := c.Sandboxes(ctx)
	var live *api.Sandbox
	for _, sb := range sbs {
		if sb.State == api.StateRunning {
			live = sb
		}
	}
	if live == nil || live.Trigger.TaskID != "mcp:"+cs.ID() || live.Trigger.Inputs["mcp_client"] != "e2e-http-agent 2.0" {
		t.Fatalf("the session's sandbox: %+v", live)
	}
	recs, _ := c.Audit(ctx, live.ID, "exec")
	if len(recs) == 0 || recs[0].Trigger != "mcp:"+cs.ID() {
		t.Errorf("tool calls' records lack the session as trigger: %+v", recs)
	}
	_ = cs.Close()
	ended := false
	for i := 0; i < 100 && !ended; i++ {
		sb, err := c.Sandbox(ctx, live.ID)
		ended = err == nil && sb.State == api.StateEnded
		time.Sleep(100 * time.Millisecond)
	}
	if !ended {
		t.Errorf("the sandbox outlived its MCP session")
	}

	// A session whose initialization names its sandbox's spec.
	other2 := buggyProject(t)
	_ = os.WriteFile(filepath.Join(other2, "named.txt"), []byte("from the named spec\n"), 0o644)
	hc := unixHTTP(d.sock, tn.Key)
	post := func(sid, body string) (string, string) { return mcpPost(t, hc, sid, body) }
	sid, _ := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"},"_meta":{"airlock/sandbox":{"workspace":"`+other2+`"}}}}`)
	post(sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if _, out := post(sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"named.txt"}}}`); !strings.Contains(out, "from the named spec") {
		t.Errorf("the spec named in the initialization: %s", out)
	}
	req, _ = http.NewRequest("DELETE", "http://airlock/mcp", nil)
	req.Header.Set("Mcp-Session-Id", sid)
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
	}

	// airlock mcp --daemon: the stdio server, its sandbox in the daemon,
	// the diff written where --export says.
	export := filepath.Join(t.TempDir(), "session.diff")
	ds, dcmd, _ := mcpStdioEnv(t, []string{"AIRLOCK_API_KEY=" + tn.Key}, "--daemon", "--address", d.sock, "--workspace", proj, "--export", export)
	if out, isErr := call(t, ds, "edit_file", map[string]any{"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}); isErr {
		t.Fatalf("edit through --daemon: %s", out)
	}
	if out, _ := call(t, ds, "run_command", map[string]any{"command": "python3 -B test_calc.py"}); !strings.Contains(out, "all tests pass") {
		t.Errorf("run through --daemon: %s", out)
	}
	_ = ds.Close()
	waitMCPExit(t, dcmd)
	if b, err := os.ReadFile(export); err != nil || !strings.Contains(string(b), "+    return a + b") {
		t.Errorf("--export: %q %v", b, err)
	}
	for _, sb := range mustSandboxes(t, c) {
		if sb.State == api.StateRunning {
			t.Errorf("sandbox %s still runs after every session ended", sb.ID)
		}
	}
}

func mustSandboxes(t *testing.T, c interface {
	Sandboxes(context.Context) ([]*api.Sandbox, error)
}) []*api.Sandbox {
	t.Helper()
	var sbs []*api.Sandbox
	for i := 0; i < 50; i++ {
		var err error
		if sbs, err = c.Sandboxes(context.Background()); err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, sb := range sbs {
			if sb.State == api.StateRunning {
				running++
			}
		}
		if running == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sbs
}

// Regression: `airlock mcp` killed outright (its client crashed, a
// SIGKILL, a SIGPIPE on a closed stdout) left its sandbox running with
// nobody to end it, and gc left the agent's socket behind.
func TestMCPKilledLeavesNothing(t *testing.T) {
	forEachWall(t, mcpKilledLeavesNothing)
}

func mcpKilledLeavesNothing(t *testing.T, w wallCase) {
	cs, cmd, stderr := w.mcpStdio(t, "--workspace", buggyProject(t))
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "sleep 300 & echo started"}); isErr || !strings.Contains(out, "started") {
		t.Fatalf("run_command: %s", out)
	}
	m := regexp.MustCompile(`sandbox ([0-9a-f]{12}) made`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no sandbox id on stderr:\n%s", stderr)
	}
	sock := filepath.Join(stateDir, "agents", m[1]+".sock")
	_ = cmd.Process.Kill()
	gone := false
	for i := 0; i < 100 && !gone; i++ {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		gone = err != nil
		time.Sleep(50 * time.Millisecond)
	}
	if !gone {
		t.Fatal("the sandbox's agent still answers after airlock mcp was killed")
	}
	if r := airlock(t, "", "gc"); r.code != 0 {
		t.Fatalf("gc: %s", r)
	}
	for _, p := range []string{sock, filepath.Join(stateDir, "sandboxes", m[1])} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after gc: %v", p, err)
		}
	}
}

// The embedded sandbox takes grants with --secret, as run does: the
// session sees the placeholder, never the value.
func TestMCPGrant(t *testing.T) {
	forEachWall(t, mcpGrant)
}

func mcpGrant(t *testing.T, w wallCase) {
	const secret = "mcp-secret-value-0001"
	cs, _, stderr := w.mcpStdioEnv(t, []string{"AIRLOCK_TEST_MCP_SECRET=" + secret}, "--workspace", buggyProject(t),
		"--grant", "k@api.test GET:/repos/** env=TOK", "--secret", "k=env:AIRLOCK_TEST_MCP_SECRET")
	out, isErr := call(t, cs, "run_command", map[string]any{"command": "echo \"tok=$TOK\"; env; cat /etc/airlock/ca.pem | head -1"})
	if isErr || !strings.Contains(out, "tok=alk_") || !strings.Contains(out, "BEGIN CERTIFICATE") || strings.Contains(out, secret) {
		t.Fatalf("the session's grant: %s", out)
	}
	_ = cs.Close()
	if strings.Contains(stderr.String(), secret) {
		t.Error("the secret reached airlock mcp's stderr")
	}
}

// Regression (issue 14): SIGTERM (or SIGINT) did not stop airlock mcp
// while a tool call ran; it was still running 20 s later. The call is
// ended, the sandbox destroyed and its diff said, and the process exits.
func TestMCPStopsOnASignalDuringACall(t *testing.T) {
	forEachWall(t, mcpStopsOnASignalDuringACall)
}

func mcpStopsOnASignalDuringACall(t *testing.T, w wallCase) {
	cs, cmd, stderr := w.mcpStdio(t, "--workspace", buggyProject(t))
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "echo warm > /workspace/made.txt"}); isErr {
		t.Fatalf("run_command: %s", out)
	}
	m := regexp.MustCompile(`sandbox ([0-9a-f]{12}) made`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no sandbox id on stderr:\n%s", stderr)
	}
	calling := make(chan struct{})
	go func() {
		close(calling)
		_, _ = cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "sleep 300"}})
	}()
	<-calling
	time.Sleep(500 * time.Millisecond) // the call is under way
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { _, err := cmd.Process.Wait(); exited <- err }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("airlock mcp still runs 30 s after SIGTERM during a call:\n%s", stderr)
	}
	if !strings.Contains(stderr.String(), "+warm") {
		t.Errorf("the session's diff was not said on its end:\n%s", stderr)
	}
	sock := filepath.Join(stateDir, "agents", m[1]+".sock")
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Error("the sandbox's agent still answers after airlock mcp ended")
	}
}

// Regression (issue 14): a command past the memory limit ended the MCP
// session's sandbox; every later tool call answered `no sandbox` and the
// session's edits were gone. The tool call says the limit stopped the
// command, and the next call works on the same files.
func TestMCPMemoryBombKeepsTheSession(t *testing.T) {
	forEachWall(t, mcpMemoryBombKeepsTheSession)
}

// mcpMemoryBombs is what the memory bomb's tool call says on each wall. On
// the gVisor wall the commands have no cgroup of their own (the host's
// sees the Sentry: TestServeLimitsStopTheCommandNotTheSandbox): the bomb
// ends the session's sandbox, and the call says so, with why; the
// session's later calls are errors.
var mcpMemoryBombs = map[string]string{
	"container": "LIMIT (memory): memory limit (48MiB for the commands) exceeded",
	"gvisor":    "THE SANDBOX ENDED while the command ran: the sandbox's init exited (its agent stopped); its memory limit (64MiB) had been reached",
}

func mcpMemoryBombKeepsTheSession(t *testing.T, w wallCase) {
	cs, _, _ := w.mcpStdio(t, "--workspace", buggyProject(t), "--memory", "64M")
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "echo kept > /workspace/kept.txt"}); isErr || !strings.Contains(out, "exit code: 0") {
		t.Fatalf("run_command: %s", out)
	}
	out, isErr := call(t, cs, "run_command", map[string]any{"command": "python3 -c 'x = bytearray(1 << 30)'"})
	if isErr || !strings.Contains(out, "exit code: 137") || !strings.Contains(out, mcpMemoryBombs[w.name]) {
		t.Fatalf("the memory bomb's answer: %s", out)
	}
	if w.name == "gvisor" {
		if out, isErr := call(t, cs, "run_command", map[string]any{"command": "true"}); !isErr || !strings.Contains(out, "no sandbox") {
			t.Errorf("a call after the sandbox ended: %v %s", isErr, out)
		}
		return
	}
	if out, isErr := call(t, cs, "run_command", map[string]any{"command": "cat /workspace/kept.txt"}); isErr || !strings.Contains(out, "exit code: 0") || !strings.Contains(out, "kept") {
		t.Fatalf("after the memory bomb: %s", out)
	}
	if out, isErr := call(t, cs, "diff", map[string]any{}); isErr || !strings.Contains(out, "kept.txt") {
		t.Fatalf("the diff after the memory bomb: %s", out)
	}
}
