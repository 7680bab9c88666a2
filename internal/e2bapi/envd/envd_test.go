package envd

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// fake is a sandbox service whose calls the test sets; the others panic.
type fake struct {
	Service
	get   func(id string) (*api.Sandbox, error)
	exec  func(ctx context.Context, req *api.Exec, emit func(*api.ExecEvent) error) error
	write func(p, user string, body []byte) (string, error)
}

func (f *fake) Get(_ context.Context, _ *tenant.Principal, id string) (*api.Sandbox, error) {
	return f.get(id)
}

func (f *fake) Exec(ctx context.Context, _ *tenant.Principal, _ string, req *api.Exec, emit func(*api.ExecEvent) error) error {
	return f.exec(ctx, req, emit)
}

func (f *fake) WriteFileAt(_ context.Context, _ *tenant.Principal, _, p, user string, _ fs.FileMode, r io.Reader, _ bool) (string, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	return f.write(p, user, b)
}

// serve mounts New(f) routed to sandbox "sb".
func serve(t *testing.T, f *fake) *httptest.Server {
	h := New(f)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithTarget(r.Context(), Target{Principal: &tenant.Principal{ID: "t"}, ID: "sb"})))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestEndEvent(t *testing.T) {
	for _, c := range []struct {
		end    api.ExecEnd
		code   int32
		exited bool
		err    string // "-": none
	}{
		{api.ExecEnd{ExitCode: 0, Status: "exit status 0"}, 0, true, "-"},
		{api.ExecEnd{ExitCode: 3, Status: "exit status 3"}, 3, true, "exit status 3"},
		{api.ExecEnd{ExitCode: 137, Status: "signal: killed"}, -1, false, "signal: killed"},
		{api.ExecEnd{ExitCode: 137, Status: "signal: killed; memory limit (1 GiB for the commands) exceeded"}, -1, false, "signal: killed"},
		{api.ExecEnd{ExitCode: 124, Status: "timeout (1s) reached: killed", TimedOut: true}, -1, false, "signal: killed"},
		{api.ExecEnd{ExitCode: 137, Status: "sandbox ended", SandboxEnded: true}, -1, false, "signal: killed"},
		{api.ExecEnd{ExitCode: -1, Status: "unknown", Error: "wait: no child"}, -1, false, "wait: no child"},
	} {
		e := endEvent(&c.end)
		got := "-"
		if e.Error != nil {
			got = *e.Error
		}
		if e.GetExitCode() != c.code || e.GetExited() != c.exited || got != c.err {
			t.Errorf("%+v: got %d %v %q", c.end, e.GetExitCode(), e.GetExited(), got)
		}
	}
}

func TestModeBits(t *testing.T) {
	for s, want := range map[string]uint32{"-rw-r--r--": 0o644, "drwxr-x--x": 0o751, "Lrwxrwxrwx": 0o777, "": 0, "-rwsr-xr-x": 0o755} {
		if got := modeBits(s); got != want {
			t.Errorf("%q: %o, want %o", s, got, want)
		}
	}
}

// A command that cannot start is the call's error, with no event: the
// SDKs refuse a stream whose first event is not the start.
func TestStartNotStarted(t *testing.T) {
	srv := serve(t, &fake{exec: func(_ context.Context, _ *api.Exec, emit func(*api.ExecEvent) error) error {
		return emit(&api.ExecEvent{End: &api.ExecEnd{ExitCode: 127, Status: "not started", Error: "no such file"}})
	}})
	cl := processconnect.NewProcessClient(srv.Client(), srv.URL, connect.WithProtoJSON())
	s, err := cl.Start(context.Background(), connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "nope"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Receive() {
		t.Fatalf("an event: %v", s.Msg())
	}
	if connect.CodeOf(s.Err()) != connect.CodeInvalidArgument || !strings.Contains(s.Err().Error(), "no such file") {
		t.Errorf("got %v", s.Err())
	}
}

// Start runs the command detached from its caller, with the request's
// deadline (Connect-Timeout-Ms) as its timeout, and keeps a quiet stream
// alive at the interval asked.
func TestStartDetachedTimedKeptAlive(t *testing.T) {
	got := make(chan *api.Exec, 1)
	srv := serve(t, &fake{exec: func(ctx context.Context, req *api.Exec, emit func(*api.ExecEvent) error) error {
		got <- req
		if err := emit(&api.ExecEvent{PID: 7}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}})
	cl := processconnect.NewProcessClient(srv.Client(), srv.URL, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "sleep 1"}, Cwd: new("/tmp")}})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	s, err := cl.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().GetEvent().GetStart().GetPid() != 7 {
		t.Fatalf("no start: %v", s.Err())
	}
	if !s.Receive() || s.Msg().GetEvent().GetKeepalive() == nil {
		t.Fatalf("no keep-alive: %v %v", s.Msg(), s.Err())
	}
	r := <-got
	d, err := time.ParseDuration(r.Timeout)
	if !r.Detach || err != nil || d <= 0 || d > time.Hour || strings.Join(r.Cmd, " ") != "/bin/bash -l -c sleep 1" || r.Cwd != "/tmp" || r.KeepStdin != true {
		t.Errorf("exec: %+v", r)
	}
}

func TestHealth(t *testing.T) {
	state, gerr := api.StateRunning, error(nil)
	srv := serve(t, &fake{get: func(string) (*api.Sandbox, error) { return &api.Sandbox{State: state}, gerr }})
	for _, c := range []struct {
		state string
		err   error
		want  int
	}{{api.StateRunning, nil, 204}, {api.StatePaused, nil, 502}, {"", errdefs.New(errdefs.ErrNotFound, "gone"), 502}} {
		state, gerr = c.state, c.err
		res, err := http.Get(srv.URL + "/health")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != c.want {
			t.Errorf("%s %v: %d, want %d", c.state, c.err, res.StatusCode, c.want)
		}
	}
}

// Uploads name their files as the SDKs do (multipart file names with
// their directories, or the path query for a body), and are answered
// with the paths the sandbox resolved.
func TestUpload(t *testing.T) {
	var wrote []string
	srv := serve(t, &fake{write: func(p, user string, body []byte) (string, error) {
		wrote = append(wrote, fmt.Sprintf("%s %s %s", p, user, body))
		if strings.HasPrefix(p, "/") {
			return p, nil
		}
		return "/home/user/" + p, nil
	}})
	post := func(query, ctype string, h http.Header, body []byte) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+"/files?"+query, bytes.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		for k, v := range h {
			req.Header[k] = v
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for _, name := range []string{"a/b/c.txt", "/tmp/d"} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, name))
		w, _ := mw.CreatePart(h)
		w.Write([]byte("x" + name))
	}
	mw.Close()
	code, body := post("username=root", mw.FormDataContentType(), nil, mp.Bytes())
	var out []written
	if err := json.Unmarshal([]byte(body), &out); code != 200 || err != nil {
		t.Fatalf("multipart: %d %s", code, body)
	}
	if fmt.Sprint(out) != "[{c.txt /home/user/a/b/c.txt file} {d /tmp/d file}]" || strings.Join(wrote, "|") != "a/b/c.txt root xa/b/c.txt|/tmp/d root x/tmp/d" {
		t.Errorf("multipart: %v %q", out, wrote)
	}

	wrote = nil
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write([]byte("zipped"))
	zw.Close()
	code, body = post("path=f", "application/octet-stream", http.Header{"Content-Encoding": {"gzip"}}, z.Bytes())
	if code != 200 || body != `[{"name":"f","path":"/home/user/f","type":"file"}]`+"\n" || strings.Join(wrote, "|") != "f  zipped" {
		t.Errorf("octet-stream: %d %s %q", code, body, wrote)
	}

	wrote = nil
	if code, body := post("path=f", "application/octet-stream", http.Header{"X-Metadata-A": {"b"}}, []byte("x")); code != 400 || len(wrote) != 0 {
		t.Errorf("metadata: %d %s %q", code, body, wrote)
	}
	if code, body := post("", "application/octet-stream", nil, []byte("x")); code != 400 || !strings.Contains(body, `"code":400`) {
		t.Errorf("no path: %d %s", code, body)
	}
}

// A service error keeps its meaning on the wire.
func TestConnectErr(t *testing.T) {
	for class, want := range map[error]connect.Code{
		errdefs.ErrNotFound: connect.CodeNotFound, errdefs.ErrAlreadyExists: connect.CodeAlreadyExists,
		errdefs.ErrSecretDetected: connect.CodeInvalidArgument, errdefs.ErrFailedPrecondition: connect.CodeFailedPrecondition,
		errdefs.ErrResourceExhausted: connect.CodeResourceExhausted, errors.New("other"): connect.CodeInternal,
	} {
		if got := connect.CodeOf(connectErr(errdefs.New(class, "x"))); got != want {
			t.Errorf("%v: %v, want %v", class, got, want)
		}
	}
}

// A sandbox that reports no path (an agent older than the daemon): an
// absolute path is answered as asked, a relative one is an error (the
// file was written, but where is the sandbox's to say).
func TestUploadUnreportedPath(t *testing.T) {
	srv := serve(t, &fake{write: func(string, string, []byte) (string, error) { return "", nil }})
	for q, want := range map[string]string{"path=/a/../b": `[{"name":"b","path":"/b","type":"file"}]` + "\n", "path=rel": `"code":500`} {
		res, err := http.Post(srv.URL+"/files?"+q, "application/octet-stream", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !strings.Contains(string(b), want) {
			t.Errorf("%s: %d %s", q, res.StatusCode, b)
		}
	}
}

// A file written through the agent (staged, renamed into place) is told
// as envd tells a write: create and write of the file, nothing of the
// staged file; other changes as they came.
func TestWatchWrites(t *testing.T) {
	var w writes
	var got []string
	for _, ev := range []api.WatchEvent{
		{Op: "create", Path: "d/.airlock-0123456789ab"}, {Op: "write", Path: "d/.airlock-0123456789ab"},
		{Op: "chmod", Path: "d/.airlock-0123456789ab"}, {Op: "rename", Path: "d/.airlock-0123456789ab"},
		{Op: "create", Path: "d/n.txt"},
		{Op: "create", Path: "m"}, {Op: "write", Path: "m"}, {Op: "rename", Path: "m"}, {Op: "create", Path: "o"},
		{Op: "rename", Path: ".airlock-0123456789ab"}, {Op: "create", Path: "d/p"},
	} {
		for _, e := range w.events(&ev) {
			got = append(got, e.GetType().String()+" "+e.GetName())
		}
	}
	want := "EVENT_TYPE_CREATE d/n.txt|EVENT_TYPE_WRITE d/n.txt|EVENT_TYPE_CREATE m|EVENT_TYPE_WRITE m|EVENT_TYPE_RENAME m|EVENT_TYPE_CREATE o|EVENT_TYPE_CREATE d/p"
	if strings.Join(got, "|") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, "|"), want)
	}
}

func TestOwnerName(t *testing.T) {
	for id, want := range map[string]string{"0": "root", "1000": "user", "65534": "65534", "": ""} {
		if got := ownerName(id); got != want {
			t.Errorf("%q: %q, want %q", id, got, want)
		}
	}
}
