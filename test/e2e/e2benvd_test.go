package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/e2bapi/envd"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/system"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// The sandbox service is what envd's handler calls.
var _ envd.Service = (*sandbox.Service)(nil)

// envdCase is envd's handler, over an in-process sandbox service of this
// suite's state directory, serving one sandbox the way the E2B front
// routes it (a fixed Target), and clients speaking JSON as the SDKs do.
type envdCase struct {
	svc   *sandbox.Service
	p     *tenant.Principal
	id    string
	url   string
	files string // the service's own files (its audit log)
	proc  processconnect.ProcessClient
	fs    filesystemconnect.FilesystemClient
	// starts is told each time a Start call's handler returned.
	starts chan struct{}
}

func newEnvdCase(t *testing.T, w wallCase) *envdCase {
	t.Helper()
	data := newDataDir(t)
	sys, err := system.New(context.Background(), system.Options{
		Mode: system.Embedded, StateDir: stateDir, DataDir: data, Files: data,
		Init: filepath.Join(suiteDir, "airlock-init"), Log: slog.New(slog.DiscardHandler), Warn: func(string) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &envdCase{files: data, starts: make(chan struct{}, 16)}
	ready := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		// Embedded ends every sandbox once this returns.
		done <- sys.Embedded(context.Background(), func(ctx context.Context, svc *sandbox.Service) error {
			c.svc = svc
			close(ready)
			<-stop
			return nil
		})
	}()
	<-ready
	t.Cleanup(func() {
		close(stop)
		if err := <-done; err != nil {
			t.Error(err)
		}
		if err := sys.Close(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	tn, err := sys.Tenants.Create(ctx, &tenant.Principal{Admin: true}, &api.CreateTenant{Name: "e2b", ScanPolicy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	if c.p, err = sys.Tenants.Authenticate(ctx, tn.Key, "test"); err != nil {
		t.Fatal(err)
	}
	req := &api.CreateSandbox{TTL: "30m"}
	if w.name == "gvisor" {
		req.Isolation = "gvisor"
	}
	sb, err := c.svc.Create(ctx, c.p, req)
	if err != nil {
		t.Fatal(err)
	}
	c.id = sb.ID
	h := envd.New(c.svc)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(envd.WithTarget(r.Context(), envd.Target{Principal: c.p, ID: c.id})))
		if r.URL.Path == "/process.Process/Start" {
			c.starts <- struct{}{}
		}
	}))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	c.proc = processconnect.NewProcessClient(srv.Client(), srv.URL, connect.WithProtoJSON())
	c.fs = filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, connect.WithProtoJSON())
	return c
}

// bash is the SDKs' commands.run: bash -l -c CMD.
func bash(cmd string) *process.StartRequest {
	no := false
	return &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}, Stdin: &no}
}

// outcome is a command's stream read to its end.
type outcome struct {
	pid            uint32
	stdout, stderr string
	end            *process.ProcessEvent_EndEvent
}

// readEvents reads a process stream (Start's or Connect's) to its end; the
// first event must be the start.
func readEvents(t *testing.T, receive func() bool, msg func() *process.ProcessEvent, err func() error) outcome {
	t.Helper()
	var o outcome
	first := true
	for receive() {
		ev := msg()
		if first {
			if ev.GetStart() == nil {
				t.Fatalf("the first event is not the start: %v", ev)
			}
			first = false
		}
		switch {
		case ev.GetStart() != nil:
			o.pid = ev.GetStart().GetPid()
		case ev.GetData() != nil:
			o.stdout += string(ev.GetData().GetStdout())
			o.stderr += string(ev.GetData().GetStderr())
		case ev.GetEnd() != nil:
			o.end = ev.GetEnd()
		}
	}
	if e := err(); e != nil {
		t.Fatalf("stream: %v", e)
	}
	if first || o.end == nil {
		t.Fatalf("the stream has no start or no end: %+v", o)
	}
	return o
}

func (c *envdCase) run(t *testing.T, ctx context.Context, req *process.StartRequest) outcome {
	t.Helper()
	s, err := c.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return readEvents(t, s.Receive, func() *process.ProcessEvent { return s.Msg().GetEvent() }, s.Err)
}

func (c *envdCase) attach(t *testing.T, ctx context.Context, pid uint32) outcome {
	t.Helper()
	s, err := c.proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: pidSel(pid)}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return readEvents(t, s.Receive, func() *process.ProcessEvent { return s.Msg().GetEvent() }, s.Err)
}

func pidSel(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

// started starts req and returns its stream once its start came.
func (c *envdCase) started(t *testing.T, ctx context.Context, req *process.StartRequest) (*connect.ServerStreamForClient[process.StartResponse], uint32) {
	t.Helper()
	s, err := c.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetEvent().GetStart().GetPid() == 0 {
		t.Fatalf("no start: %v", s.Err())
	}
	return s, s.Msg().GetEvent().GetStart().GetPid()
}

// leave disconnects a Start stream and waits for its handler to return.
func (c *envdCase) leave(cancel context.CancelFunc, s *connect.ServerStreamForClient[process.StartResponse]) {
	cancel()
	s.Close()
	<-c.starts
}

func (c *envdCase) running(t *testing.T, pid uint32) bool {
	t.Helper()
	res, err := c.proc.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Msg.GetProcesses() {
		if p.GetPid() == pid {
			return true
		}
	}
	return false
}

// TestE2BEnvdProcesses drives envd's process service over the sandbox
// service as the E2B SDKs do: output, exit codes and envd's end texts, a
// command that cannot start, Connect-Timeout-Ms killing, a disconnect
// leaving the command running, connect, stdin, signals and a terminal.
func TestE2BEnvdProcesses(t *testing.T) { forEachWall(t, e2bEnvdProcesses) }

func e2bEnvdProcesses(t *testing.T, w wallCase) {
	c := newEnvdCase(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("run", func(t *testing.T) {
		o := c.run(t, ctx, bash("echo out; echo err >&2; echo $USER $HOME; pwd; exit 3"))
		if o.stdout != "out\nuser /home/user\n/workspace\n" || o.stderr != "err\n" {
			t.Errorf("output: %q %q", o.stdout, o.stderr)
		}
		if o.end.GetExitCode() != 3 || !o.end.GetExited() || o.end.GetError() != "exit status 3" || o.end.GetStatus() != "exit status 3" {
			t.Errorf("end: %v", o.end)
		}
		o = c.run(t, ctx, bash("true"))
		if o.end.GetExitCode() != 0 || o.end.Error != nil {
			t.Errorf("end of a success: %v", o.end)
		}
		root := connect.NewRequest(bash("id -u; echo $HOME"))
		root.Header().Set("Authorization", "Basic cm9vdDo=") // root:
		s, err := c.proc.Start(ctx, root)
		if err != nil {
			t.Fatal(err)
		}
		o = readEvents(t, s.Receive, func() *process.ProcessEvent { return s.Msg().GetEvent() }, s.Err)
		if o.stdout != "0\n/root\n" {
			t.Errorf("as root: %q", o.stdout)
		}
	})

	t.Run("not started", func(t *testing.T) {
		s, err := c.proc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/no/such/command"}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.Receive() {
			t.Fatalf("an event for a command that did not start: %v", s.Msg())
		}
		if connect.CodeOf(s.Err()) != connect.CodeInvalidArgument {
			t.Errorf("want invalid_argument, got %v", s.Err())
		}
	})

	t.Run("timeout kills", func(t *testing.T) {
		// Connect-Timeout-Ms is the command's lifetime: it is killed at the
		// deadline, which the client sees as such.
		tctx, tcancel := context.WithTimeout(ctx, 3*time.Second)
		defer tcancel()
		s, pid := c.started(t, tctx, bash("sleep 600"))
		for s.Receive() {
		}
		if connect.CodeOf(s.Err()) != connect.CodeDeadlineExceeded {
			t.Errorf("want deadline_exceeded, got %v", s.Err())
		}
		s.Close()
		<-c.starts
		// Its end comes (or it has already gone): it was killed.
		cs, err := c.proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: pidSel(pid)}))
		if err != nil {
			t.Fatal(err)
		}
		for cs.Receive() {
		}
		if err := cs.Err(); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatal(err)
		}
		cs.Close()
		if c.running(t, pid) {
			t.Errorf("pid %d runs past its deadline", pid)
		}
	})

	t.Run("disconnect does not kill", func(t *testing.T) {
		sctx, scancel := context.WithCancel(ctx)
		yes := true
		req := bash("read x; echo got $x")
		req.Stdin = &yes
		s, pid := c.started(t, sctx, req)
		c.leave(scancel, s)
		if !c.running(t, pid) {
			t.Fatalf("pid %d was killed when its caller left", pid)
		}
		cs, err := c.proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: pidSel(pid)}))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if !cs.Receive() || cs.Msg().GetEvent().GetStart().GetPid() != pid {
			t.Fatalf("connect: no start: %v", cs.Err())
		}
		if _, err := c.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("hi\n")}}})); err != nil {
			t.Fatal(err)
		}
		var out string
		var end *process.ProcessEvent_EndEvent
		for cs.Receive() {
			out += string(cs.Msg().GetEvent().GetData().GetStdout())
			if e := cs.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		if out != "got hi\n" || end.GetExitCode() != 0 {
			t.Errorf("after the disconnect: %q %v %v", out, end, cs.Err())
		}
	})

	t.Run("stdin closed", func(t *testing.T) {
		yes := true
		req := bash("cat")
		req.Stdin = &yes
		s, pid := c.started(t, ctx, req)
		defer s.Close()
		if _, err := c.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("a\n")}}})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
			t.Fatal(err)
		}
		var out string
		var end *process.ProcessEvent_EndEvent
		for s.Receive() {
			out += string(s.Msg().GetEvent().GetData().GetStdout())
			if e := s.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		if out != "a\n" || end.GetExitCode() != 0 {
			t.Errorf("cat: %q %v %v", out, end, s.Err())
		}
	})

	t.Run("background connect kill", func(t *testing.T) {
		sctx, scancel := context.WithCancel(ctx)
		tag := "bg"
		req := bash("sleep 600")
		req.Tag = &tag
		s, pid := c.started(t, sctx, req)
		c.leave(scancel, s)
		list, err := c.proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range list.Msg.GetProcesses() {
			if p.GetPid() == pid {
				found = p.GetTag() == tag && p.GetConfig().GetCmd() == "/bin/bash" && strings.Join(p.GetConfig().GetArgs(), " ") == "-l -c sleep 600"
			}
		}
		if !found {
			t.Errorf("list: %v", list.Msg)
		}
		cs, err := c.proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: tag}}}))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if !cs.Receive() || cs.Msg().GetEvent().GetStart().GetPid() != pid {
			t.Fatalf("connect by tag: %v", cs.Err())
		}
		if _, err := c.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		// A kill is answered once the command is gone: the SDK's
		// kill() then list() no longer shows it.
		if c.running(t, pid) {
			t.Errorf("pid %d is listed after its kill was answered", pid)
		}
		var end *process.ProcessEvent_EndEvent
		for cs.Receive() {
			if e := cs.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		if end.GetExitCode() != -1 || end.GetExited() || end.GetError() != "signal: killed" {
			t.Errorf("end of a killed command: %v %v", end, cs.Err())
		}
		_, err = c.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("a signal to an ended command: want not_found, got %v", err)
		}
	})

	t.Run("pty", func(t *testing.T) {
		s, pid := c.started(t, ctx, &process.StartRequest{
			Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": "xterm-256color"}},
			Pty:     &process.PTY{Size: &process.PTY_Size{Rows: 24, Cols: 80}},
		})
		defer s.Close()
		var out strings.Builder
		until := func(want string) {
			t.Helper()
			for !strings.Contains(out.String(), want) {
				if !s.Receive() {
					t.Fatalf("no %q in %q: %v", want, out.String(), s.Err())
				}
				out.Write(s.Msg().GetEvent().GetData().GetPty())
			}
		}
		input := func(text string) {
			t.Helper()
			if _, err := c.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(text)}}})); err != nil {
				t.Fatal(err)
			}
		}
		input("stty size | sed 's/ /x/'\n")
		until("24x80")
		if _, err := c.proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: pidSel(pid), Pty: &process.PTY{Size: &process.PTY_Size{Rows: 30, Cols: 100}}})); err != nil {
			t.Fatal(err)
		}
		input("stty size | sed 's/ /x/'; exit\n")
		until("30x100")
		for s.Receive() {
		}
		if s.Err() != nil {
			t.Error(s.Err())
		}
	})

	// The audit log has the records the airlock API's calls make: each
	// command's exec.start and exec.end, shaped alike.
	t.Run("audit", func(t *testing.T) {
		if err := c.svc.Exec(ctx, c.p, c.id, &api.Exec{Cmd: []string{"/bin/bash", "-l", "-c", "echo api"}}, func(*api.ExecEvent) error { return nil }); err != nil {
			t.Fatal(err)
		}
		// A committed record is written after every record noted before
		// it (the exec's end).
		if _, err := c.svc.Stat(ctx, c.p, c.id, "/", ""); err != nil {
			t.Fatal(err)
		}
		recs := c.records(t)
		starts, ends := map[string]json.RawMessage{}, map[string]json.RawMessage{}
		for _, r := range recs {
			var d struct {
				ExecID string   `json:"exec_id"`
				Argv   []string `json:"argv"`
			}
			_ = json.Unmarshal(r.Data, &d)
			switch r.Kind {
			case "exec.start":
				starts[d.ExecID] = r.Data
			case "exec.end":
				ends[d.ExecID] = r.Data
			}
		}
		var viaAPI, viaEnvd []any
		for id, s := range starts {
			if _, ok := ends[id]; !ok {
				// The sleep killed at its deadline, the one left, the
				// killed one: every command's end is on the record.
				t.Errorf("exec %s has no end on the record: %s", id, s)
			}
			var v, e any
			_ = json.Unmarshal(s, &v)
			_ = json.Unmarshal(ends[id], &e)
			if strings.Contains(string(s), "echo api") {
				viaAPI = []any{v, e}
			} else {
				viaEnvd = append(viaEnvd, []any{v, e})
			}
		}
		if viaAPI == nil || len(viaEnvd) < 8 {
			t.Fatalf("exec records: %d via envd, api %v", len(viaEnvd), viaAPI)
		}
		for _, x := range viaEnvd {
			if pair := x.([]any); !sameShape(pair[0], viaAPI[0]) || !sameShape(pair[1], viaAPI[1]) {
				t.Errorf("envd's exec records are shaped otherwise than the API's:\n %s %s\n %s %s", shapeOf(pair[0]), shapeOf(pair[1]), shapeOf(viaAPI[0]), shapeOf(viaAPI[1]))
			}
		}
	})
}

// records are the audit log's records of the case's sandbox.
func (c *envdCase) records(t *testing.T) []*audit.Record {
	t.Helper()
	var out []*audit.Record
	for _, r := range readLog(t, filepath.Join(c.files, "audit")) {
		if r.Sandbox == c.id {
			out = append(out, r)
		}
	}
	return out
}

// upload POSTs /files: files by name (multipart, names carrying their
// directories), or one body to path (octet-stream, gzip-encoded when
// asked).
func (c *envdCase) upload(t *testing.T, query url.Values, files map[string][]byte) (int, string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for name, data := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, name))
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
	}
	mw.Close()
	res, err := http.Post(c.url+"/files?"+query.Encode(), mw.FormDataContentType(), &body)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (c *envdCase) download(t *testing.T, p string, w io.Writer) int {
	t.Helper()
	res, err := http.Get(c.url + "/files?" + url.Values{"path": {p}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if _, err := io.Copy(w, res.Body); err != nil {
		t.Fatal(err)
	}
	return res.StatusCode
}

// prng is a reproducible stream of bytes no scanner takes for text.
type prng struct{ r *rand.ChaCha8 }

func (p prng) Read(b []byte) (int, error) { return p.r.Read(b) }

// TestE2BEnvdFiles drives envd's files over the sandbox service as the
// E2B SDKs do: /files uploads (multipart with path-bearing names, an
// octet-stream, gzip; each answered with its resolved path) and
// downloads, an 80 MiB file streamed both ways, stat, make, list with
// depth, move, remove, and watches naming changes relative to the
// watched directory.
func TestE2BEnvdFiles(t *testing.T) { forEachWall(t, e2bEnvdFiles) }

func e2bEnvdFiles(t *testing.T, w wallCase) {
	c := newEnvdCase(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	if res, err := http.Get(c.url + "/health"); err != nil || res.StatusCode != http.StatusNoContent {
		t.Fatalf("health: %v %v", res, err)
	}

	// A recursive watch of /workspace and one of a directory given
	// relative to the user's home, both open before the writes.
	if code, body := c.upload(t, url.Values{}, map[string][]byte{"w/.keep": nil}); code != 200 {
		t.Fatalf("upload: %d %s", code, body)
	}
	type seen struct {
		mu    sync.Mutex
		names []string
		more  chan struct{}
	}
	watch := func(p string) *seen {
		wctx, wcancel := context.WithCancel(ctx)
		t.Cleanup(wcancel)
		s, err := c.fs.WatchDir(wctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: p, Recursive: true}))
		if err != nil {
			t.Fatal(err)
		}
		if !s.Receive() || s.Msg().GetStart() == nil {
			t.Fatalf("watch %s: no start: %v", p, s.Err())
		}
		w := &seen{more: make(chan struct{}, 1000)}
		go func() {
			for s.Receive() {
				if e := s.Msg().GetFilesystem(); e != nil {
					w.mu.Lock()
					w.names = append(w.names, e.GetType().String()+" "+e.GetName())
					w.mu.Unlock()
					w.more <- struct{}{}
				}
			}
		}()
		return w
	}
	// waitFor waits for an event naming want.
	waitFor := func(t *testing.T, w *seen, want string) {
		t.Helper()
		for {
			w.mu.Lock()
			names := strings.Join(w.names, "\n")
			w.mu.Unlock()
			if strings.Contains("\n"+names+"\n", "\n"+want+"\n") {
				return
			}
			select {
			case <-w.more:
			case <-ctx.Done():
				t.Fatalf("no event %q in:\n%s", want, names)
			}
		}
	}
	ws := watch("/workspace")
	home := watch("w")

	t.Run("upload", func(t *testing.T) {
		// A file made in a directory made the moment before may come
		// before the directory is watched (inotify, as envd's): the
		// directory first.
		if _, err := c.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/workspace/d"})); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ws, "EVENT_TYPE_CREATE d")
		code, body := c.upload(t, url.Values{}, map[string][]byte{"/workspace/d/a.txt": []byte("hello"), "w/rel.txt": []byte("x")})
		var got []map[string]string
		if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil || len(got) != 2 {
			t.Fatalf("multipart upload: %d %s", code, body)
		}
		paths := map[string]bool{}
		for _, e := range got {
			paths[e["path"]] = e["type"] == "file" && e["name"] == filepath.Base(e["path"])
		}
		if !paths["/workspace/d/a.txt"] || !paths["/home/user/w/rel.txt"] {
			t.Errorf("resolved paths: %s", body)
		}
		// Told as envd tells a write, the agent's staged file unseen.
		waitFor(t, ws, "EVENT_TYPE_CREATE d/a.txt")
		waitFor(t, ws, "EVENT_TYPE_WRITE d/a.txt")
		ws.mu.Lock()
		if names := strings.Join(ws.names, "\n"); strings.Contains(names, ".airlock-") {
			t.Errorf("the agent's staged file is seen:\n%s", names)
		}
		ws.mu.Unlock()
		waitFor(t, home, "EVENT_TYPE_CREATE rel.txt")

		var zbody bytes.Buffer
		zw := gzip.NewWriter(&zbody)
		zw.Write([]byte("zipped"))
		zw.Close()
		req, _ := http.NewRequest("POST", c.url+"/files?path=/tmp/z.txt&username=root", &zbody)
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Content-Encoding", "gzip")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.Contains(string(b), `"path":"/tmp/z.txt"`) {
			t.Errorf("octet-stream gzip upload: %d %s", res.StatusCode, b)
		}
		var out bytes.Buffer
		if code := c.download(t, "/tmp/z.txt", &out); code != 200 || out.String() != "zipped" {
			t.Errorf("download: %d %q", code, out.String())
		}
		out.Reset()
		if code := c.download(t, "/workspace/d/a.txt", &out); code != 200 || out.String() != "hello" {
			t.Errorf("download: %d %q", code, out.String())
		}
		out.Reset()
		if code := c.download(t, "/workspace/nope", &out); code != 404 || !strings.Contains(out.String(), `"code":404`) {
			t.Errorf("download of a missing file: %d %s", code, out.String())
		}
		if code, body := c.upload(t, url.Values{"path": {"/workspace/same"}}, map[string][]byte{"one": []byte("1"), "two": []byte("2")}); code != 400 {
			t.Errorf("two files to one path: %d %s", code, body)
		}
	})

	t.Run("80 MiB", func(t *testing.T) {
		const size = 80 << 20
		// The body is streamed both ways, never held whole: the heap of
		// this process (client, handler and service) stays far below it.
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base, peak := ms.HeapInuse, ms.HeapInuse
		stopSampling := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				peak = max(peak, m.HeapInuse)
				select {
				case <-stopSampling:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		defer func() {
			close(stopSampling)
			<-sampled
			growth := int64(peak) - int64(base)
			t.Logf("heap in use grew by at most %.1f MiB moving %d MiB each way", float64(growth)/(1<<20), size>>20)
			if growth > 40<<20 {
				t.Errorf("the heap grew by %d MiB: a body is held whole", growth>>20)
			}
		}()
		pr, pw := io.Pipe()
		mw := multipart.NewWriter(pw)
		sum := sha256.New()
		go func() {
			w, err := mw.CreateFormFile("file", "/workspace/big")
			if err == nil {
				_, err = io.Copy(io.MultiWriter(w, sum), io.LimitReader(prng{rand.NewChaCha8([32]byte{1})}, size))
			}
			if err == nil {
				err = mw.Close()
			}
			pw.CloseWithError(err)
		}()
		res, err := http.Post(c.url+"/files", mw.FormDataContentType(), pr)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.Contains(string(b), `"path":"/workspace/big"`) {
			t.Fatalf("upload: %d %s", res.StatusCode, b)
		}
		want := sum.Sum(nil)
		got := sha256.New()
		cw := &countWriter{w: got}
		if code := c.download(t, "/workspace/big", cw); code != 200 || cw.n != size || !bytes.Equal(got.Sum(nil), want) {
			t.Errorf("download: %d, %d bytes, same content %v", code, cw.n, bytes.Equal(got.Sum(nil), want))
		}
	})

	t.Run("filesystem", func(t *testing.T) {
		st, err := c.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/workspace/d/a.txt"}))
		if err != nil {
			t.Fatal(err)
		}
		if e := st.Msg.GetEntry(); e.GetType() != filesystem.FileType_FILE_TYPE_FILE || e.GetSize() != 5 || e.GetMode() != 0o644 || e.GetPermissions() != "-rw-r--r--" || e.GetOwner() != "user" || e.GetName() != "a.txt" || e.GetPath() != "/workspace/d/a.txt" || e.GetModifiedTime().AsTime().IsZero() {
			t.Errorf("stat: %v", e)
		}
		if _, err := c.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/workspace/nope"})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("stat of a missing file: %v", err)
		}
		if _, err := c.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/workspace/d/e/f"})); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ws, "EVENT_TYPE_CREATE d/e")
		if _, err := c.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/workspace/d/e/f"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
			t.Errorf("make an existing directory: %v", err)
		}
		list := func(depth uint32) []string {
			t.Helper()
			res, err := c.fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/workspace/d", Depth: depth}))
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, e := range res.Msg.GetEntries() {
				out = append(out, e.GetPath()+":"+e.GetType().String())
			}
			return out
		}
		if got := strings.Join(list(1), " "); got != "/workspace/d/a.txt:FILE_TYPE_FILE /workspace/d/e:FILE_TYPE_DIRECTORY" {
			t.Errorf("list depth 1: %s", got)
		}
		if got := strings.Join(list(3), " "); !strings.Contains(got, "/workspace/d/e/f:FILE_TYPE_DIRECTORY") {
			t.Errorf("list depth 3: %s", got)
		}
		mv, err := c.fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: "/workspace/d/a.txt", Destination: "/workspace/c.txt"}))
		if err != nil || mv.Msg.GetEntry().GetPath() != "/workspace/c.txt" {
			t.Fatalf("move: %v %v", mv, err)
		}
		if _, err := c.fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: "/workspace/c.txt"})); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ws, "EVENT_TYPE_REMOVE c.txt")
		if _, err := c.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/workspace/c.txt"})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("stat of a removed file: %v", err)
		}
		// Hostile values: a NUL in a path, and a listing as deep as the
		// wire allows (what the daemon would hold of a deep tree): both
		// refused before the agent is asked.
		if _, err := c.fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/workspace/a\x00/../../etc"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("stat of a path with a NUL: %v", err)
		}
		if _, err := c.fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/", Depth: 1<<32 - 1})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("a listing %d deep: %v", uint32(1<<32-1), err)
		}
	})

	t.Run("polled watcher", func(t *testing.T) {
		w, err := c.fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "w"}))
		if err != nil {
			t.Fatal(err)
		}
		id := w.Msg.GetWatcherId()
		if _, err := c.fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/home/user/w/polled"})); err != nil {
			t.Fatal(err)
		}
		var got []string
		for !strings.Contains(strings.Join(got, " "), "EVENT_TYPE_CREATE polled") {
			evs, err := c.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
			if err != nil {
				t.Fatalf("%v (so far %v)", err, got)
			}
			for _, e := range evs.Msg.GetEvents() {
				got = append(got, e.GetType().String()+" "+e.GetName())
			}
			if ctx.Err() != nil {
				t.Fatalf("no event for the directory made: %v", got)
			}
			time.Sleep(50 * time.Millisecond) // polled: no event to wait on
		}
		if _, err := c.fs.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("a removed watcher: %v", err)
		}
	})

	// The file calls are on the record as the airlock API's are.
	t.Run("audit", func(t *testing.T) {
		kinds := map[string]int{}
		for _, r := range c.records(t) {
			kinds[r.Kind]++
		}
		for _, k := range []string{"file.write", "file.read", "file.stat", "file.mkdir", "file.list", "file.move", "file.remove", "file.watch"} {
			if kinds[k] == 0 {
				t.Errorf("no %s record: %v", k, kinds)
			}
		}
	})
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
