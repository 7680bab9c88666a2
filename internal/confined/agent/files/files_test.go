package files

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
	"github.com/airlock-sandbox/airlock/api/filesystem"
)

// withHello is the Agent service of the calls, for a test server.
type withHello struct{ *Calls }

func (withHello) Hello(context.Context, *connect.Request[agentpb.HelloRequest]) (*connect.Response[agentpb.HelloResponse], error) {
	return connect.NewResponse(&agentpb.HelloResponse{}), nil
}

// callsClient serves calls over HTTP/1.1, as the agent does to the
// daemon, and is its client: client streams need a real transport. Wait
// returns once every call the server took has returned.
func callsClient(t *testing.T, c *Calls) agentpbconnect.AgentClient {
	cl, _ := callsServer(t, c)
	return cl
}

func callsServer(t *testing.T, c *Calls) (cl agentpbconnect.AgentClient, wait func()) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(agentpbconnect.NewAgentHandler(withHello{c}))
	var calls sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		defer calls.Done()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return agentpbconnect.NewAgentClient(srv.Client(), srv.URL), calls.Wait
}

// writeChunks writes a file through the client in the given chunks, the
// last saying so when last is set.
func writeChunks(ctx context.Context, cl agentpbconnect.AgentClient, first *agentpb.WriteFileRequest, chunks []string, last bool) error {
	st := cl.WriteFile(ctx)
	first.Last = last && len(chunks) == 0
	if err := st.Send(first); err != nil {
		_, err = st.CloseAndReceive()
		return err
	}
	for i, c := range chunks {
		if err := st.Send(&agentpb.WriteFileRequest{Data: []byte(c), Last: last && i == len(chunks)-1}); err != nil {
			_, err = st.CloseAndReceive()
			return err
		}
	}
	_, err := st.CloseAndReceive()
	return err
}

func testUsers(t *testing.T) (Users, string) {
	t.Helper()
	home := t.TempDir()
	return Users{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Home: home}, home
}

func basic(user string) http.Header {
	h := http.Header{}
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	return h
}

func TestUserAndPaths(t *testing.T) {
	us, home := testUsers(t)
	u, err := us.FromHeader(http.Header{})
	if err != nil || u.Name != "user" {
		t.Fatalf("no header: %+v %v", u, err)
	}
	if u, err := us.FromHeader(basic("root")); err != nil || u.UID != 0 || u.Home != "/root" {
		t.Errorf("root: %+v %v", u, err)
	}
	if _, err := us.FromHeader(basic("mallory")); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("unknown user: %v", err)
	}
	bad := http.Header{}
	bad.Set("Authorization", "Basic !!!")
	if _, err := us.FromHeader(bad); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("bad header: %v", err)
	}
	for in, want := range map[string]string{"x/../y": filepath.Join(home, "y"), "/a/./b/": "/a/b", "/../..": "/"} {
		if got, err := Resolve(u, in); err != nil || got != want {
			t.Errorf("resolve(%q) = %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "a\x00b"} {
		if _, err := Resolve(u, in); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("resolve(%q): %v", in, err)
		}
	}
}

func TestWriteEditKeepModeAndRefuseAmbiguity(t *testing.T) {
	us, home := testUsers(t)
	f := NewCalls(us)
	cl := callsClient(t, f)
	ctx := context.Background()
	p := filepath.Join(home, "d", "f.txt")
	if err := writeChunks(ctx, cl, &agentpb.WriteFileRequest{Path: p, Data: []byte("a b"), Mode: 0o600, MakeParents: true}, []string{" a"}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.EditFile(ctx, connect.NewRequest(&agentpb.EditFileRequest{Path: p, Old: "a", New: "x"})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("an ambiguous edit: %v", err)
	}
	if _, err := f.EditFile(ctx, connect.NewRequest(&agentpb.EditFileRequest{Path: p, Old: "zzz", New: "x"})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("an edit of a missing text: %v", err)
	}
	if _, err := f.EditFile(ctx, connect.NewRequest(&agentpb.EditFileRequest{Path: p, Old: "b", New: "B"})); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "a B a" || fi.Mode().Perm() != 0o600 {
		t.Errorf("after edit: %q %v", b, fi.Mode())
	}
	// No temporary file is left beside it.
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
		t.Errorf("left in the directory: %v", ents)
	}
	if err := writeChunks(ctx, cl, &agentpb.WriteFileRequest{Path: filepath.Dir(p), Data: []byte("x")}, nil, true); err == nil {
		t.Error("wrote over a directory")
	}
}

// A write changes the file only once its stream said last and ended:
// a stream that ends early, breaks off, or goes on after last leaves the
// file as it was and no temporary file beside it.
func TestWriteStreamIsAllOrNothing(t *testing.T) {
	us, home := testUsers(t)
	cl, wait := callsServer(t, NewCalls(us))
	p := filepath.Join(home, "f")
	if err := os.WriteFile(p, []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	unchanged := func(what string) {
		t.Helper()
		if b, _ := os.ReadFile(p); string(b) != "before" {
			t.Errorf("%s: the file holds %q", what, b)
		}
		if ents, _ := os.ReadDir(home); len(ents) != 1 {
			t.Errorf("%s: left beside it: %v", what, ents)
		}
	}
	if err := writeChunks(ctx, cl, &agentpb.WriteFileRequest{Path: p, Data: []byte("af")}, []string{"ter"}, false); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a stream without last: %v", err)
	}
	unchanged("no last")
	st := cl.WriteFile(ctx)
	_ = st.Send(&agentpb.WriteFileRequest{Path: p, Data: []byte("x"), Last: true})
	_ = st.Send(&agentpb.WriteFileRequest{Data: []byte("y")})
	if _, err := st.CloseAndReceive(); err == nil {
		t.Error("a message after last was taken")
	}
	unchanged("past last")
	// A client that goes away midway.
	cctx, cancel := context.WithCancel(ctx)
	st = cl.WriteFile(cctx)
	_ = st.Send(&agentpb.WriteFileRequest{Path: p, Data: []byte(strings.Repeat("z", 1<<20))})
	cancel()
	_, _ = st.CloseAndReceive()
	wait() // the call has seen its client go
	unchanged("a client gone")
	if err := writeChunks(ctx, cl, &agentpb.WriteFileRequest{Path: p, Data: []byte("af")}, []string{"t", "er"}, true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "after" {
		t.Errorf("a whole stream wrote %q", b)
	}
}

// unpackStream sends an Unpack stream: begin dir, then parts (an entry,
// or a string: a data message), then end when end is set.
func unpackStream(ctx context.Context, cl agentpbconnect.AgentClient, dir string, end bool, parts ...any) error {
	st := cl.Unpack(ctx)
	msgs := []*agentpb.UnpackRequest{{Part: &agentpb.UnpackRequest_Begin{Begin: &agentpb.UnpackBegin{Dir: dir}}}}
	for _, p := range parts {
		switch p := p.(type) {
		case *agentpb.UnpackEntry:
			msgs = append(msgs, &agentpb.UnpackRequest{Part: &agentpb.UnpackRequest_Entry{Entry: p}})
		case string:
			msgs = append(msgs, &agentpb.UnpackRequest{Part: &agentpb.UnpackRequest_Data{Data: []byte(p)}})
		}
	}
	if end {
		msgs = append(msgs, &agentpb.UnpackRequest{Part: &agentpb.UnpackRequest_End{End: true}})
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			break
		}
	}
	_, err := st.CloseAndReceive()
	return err
}

// tree is what dir holds: each path below it, "/" after a directory, and
// a file's content after "=".
func tree(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(dir, p)
		switch {
		case err != nil || rel == ".":
		case d.IsDir():
			out = append(out, rel+"/")
		default:
			b, _ := os.ReadFile(p)
			out = append(out, rel+"="+string(b))
		}
		return nil
	})
	return strings.Join(out, " ")
}

// An unpack changes the directory only when it is whole: one that fails
// midway (a conflict, a bad name, a stream that ends without end) leaves
// it exactly as it was, without its stage; a whole one merges into
// directories it already has and replaces files.
func TestUnpackIsAllOrNothing(t *testing.T) {
	us, home := testUsers(t)
	cl := callsClient(t, NewCalls(us))
	ctx := context.Background()
	dir := filepath.Join(home, "dst")
	if err := os.MkdirAll(filepath.Join(dir, "src", "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(dir, "src", "a.txt"), []byte("old"), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "file"), []byte("f"), 0o644)
	before := tree(t, dir)
	d := func(name string) *agentpb.UnpackEntry {
		return &agentpb.UnpackEntry{Name: name, Dir: true, Mode: 0o755}
	}
	f := func(name string) *agentpb.UnpackEntry { return &agentpb.UnpackEntry{Name: name, Mode: 0o644} }
	for name, c := range map[string]struct {
		end   bool
		parts []any
	}{
		"no end":                  {false, []any{d("src"), f("src/a.txt"), "new", f("src/b/c.txt"), "c"}},
		"a dir in a file's place": {true, []any{f("src/a.txt"), "new", d("file")}},
		"a file in a dir's place": {true, []any{f("new.txt"), "n", f("src/keep"), "x"}},
		"data before an entry":    {true, []any{"x"}},
		"an empty name":           {true, []any{f("new.txt"), "n", f("/")}},
	} {
		if err := unpackStream(ctx, cl, dir, c.end, c.parts...); err == nil {
			t.Errorf("%s: no error", name)
		}
		if got := tree(t, dir); got != before {
			t.Errorf("%s: the directory changed:\n%s\nwas\n%s", name, got, before)
		}
	}
	// A missing directory is made with the rest, or not at all.
	if err := unpackStream(ctx, cl, filepath.Join(home, "missing/deeper"), false, f("x"), "x"); err == nil {
		t.Error("into a missing directory, without end: no error")
	}
	if _, err := os.Lstat(filepath.Join(home, "missing")); err == nil {
		t.Error("a failed unpack made its missing directory")
	}
	if err := unpackStream(ctx, cl, filepath.Join(home, "missing/deeper"), true, f("x"), "x"); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, filepath.Join(home, "missing")); got != "deeper/ deeper/x=x" {
		t.Errorf("into a missing directory: %s", got)
	}
	if err := unpackStream(ctx, cl, filepath.Join(dir, "file", "sub"), true, f("x"), "x"); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("into a file: %v", err)
	}
	// Names are kept below the directory.
	if err := unpackStream(ctx, cl, dir, true, d("src"), f("src/a.txt"), "new", f("src/b/c.txt"), "c", f("../../up.txt"), "up"); err != nil {
		t.Fatal(err)
	}
	want := "file=f src/ src/a.txt=new src/b/ src/b/c.txt=c src/keep/ up.txt=up"
	if got := tree(t, dir); got != want {
		t.Errorf("after a whole unpack:\n%s\nwant\n%s", got, want)
	}
}

func TestFilesystemCalls(t *testing.T) {
	us, home := testUsers(t)
	fs := NewFilesystem(us)
	ctx := context.Background()
	req := func(p string) *connect.Request[filesystem.MakeDirRequest] {
		return connect.NewRequest(&filesystem.MakeDirRequest{Path: p})
	}
	if _, err := fs.MakeDir(ctx, req(filepath.Join(home, "a/b/c"))); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.MakeDir(ctx, req(filepath.Join(home, "a"))); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("mkdir of an existing dir: %v", err)
	}
	_ = os.Symlink("/etc", filepath.Join(home, "a", "link"))
	list := func(depth uint32) []*filesystem.EntryInfo {
		res, err := fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: home, Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetEntries()
	}
	if n := len(list(1)); n != 1 {
		t.Errorf("depth 1: %d entries", n)
	}
	all := list(10)
	if len(all) != 4 { // a, a/b, a/b/c, a/link (not followed)
		t.Errorf("depth 10: %d entries", len(all))
	}
	if _, err := fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: home, Depth: 1000})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a huge depth: %v", err)
	}
	if _, err := fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: "/"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("remove /: %v", err)
	}
	if _, err := fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(home, "nope")})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stat of a missing file: %v", err)
	}
	st, err := fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(home, "a", "link")}))
	if err != nil || st.Msg.GetEntry().GetSymlinkTarget() != "/etc" {
		t.Errorf("stat of a link: %v %v", st, err)
	}
	if _, err := fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: filepath.Join(home, "a/b"), Destination: filepath.Join(home, "z/b")})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(home, "z/b/c")); err != nil {
		t.Errorf("move: %v", err)
	}
}

func TestFsErrorsKeepTheirClass(t *testing.T) {
	for err, want := range map[error]connect.Code{
		os.ErrNotExist: connect.CodeNotFound, os.ErrExist: connect.CodeAlreadyExists,
		os.ErrPermission: connect.CodePermissionDenied, errors.New("other"): connect.CodeInternal,
	} {
		if got := connect.CodeOf(ConnectError(err)); got != want {
			t.Errorf("%v: %v, want %v", err, got, want)
		}
	}
}

// A write to a path that is a link (one the sandbox user planted) replaces
// the link: the file it points to is untouched and lends the new file
// neither its owner nor its mode.
func TestWriteReplacesALinkNotItsTarget(t *testing.T) {
	us, home := testUsers(t)
	cl, _ := callsServer(t, NewCalls(us))
	target := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(home, "x")
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	if err := writeChunks(context.Background(), cl, &agentpb.WriteFileRequest{Path: p, Data: []byte("new")}, nil, true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("the link's target holds %q", b)
	}
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() == 0o600 {
		t.Fatalf("the path is %v %v, want a new regular file of the default mode", fi.Mode(), err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != us.UID {
		t.Errorf("the new file is uid %d's, want the writer's %d", st.Uid, us.UID)
	}
}
