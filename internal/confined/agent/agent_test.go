package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"github.com/airlock-sandbox/airlock/api/process"
)

func testAgent(t *testing.T) (*agent, string) {
	t.Helper()
	home := t.TempDir()
	return &agent{o: Options{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Home: home, Cwd: home}, procs: newProcs()}, home
}

func basic(user string) http.Header {
	h := http.Header{}
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	return h
}

func TestUserAndPaths(t *testing.T) {
	a, home := testAgent(t)
	u, err := a.userOf(http.Header{})
	if err != nil || u.name != "user" {
		t.Fatalf("no header: %+v %v", u, err)
	}
	if u, err := a.userOf(basic("root")); err != nil || u.uid != 0 || u.home != "/root" {
		t.Errorf("root: %+v %v", u, err)
	}
	if _, err := a.userOf(basic("mallory")); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("unknown user: %v", err)
	}
	bad := http.Header{}
	bad.Set("Authorization", "Basic !!!")
	if _, err := a.userOf(bad); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("bad header: %v", err)
	}
	for in, want := range map[string]string{"x/../y": filepath.Join(home, "y"), "/a/./b/": "/a/b", "/../..": "/"} {
		if got, err := resolve(u, in); err != nil || got != want {
			t.Errorf("resolve(%q) = %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "a\x00b"} {
		if _, err := resolve(u, in); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("resolve(%q): %v", in, err)
		}
	}
}

func TestWriteEditKeepModeAndRefuseAmbiguity(t *testing.T) {
	a, home := testAgent(t)
	f := &filesService{a}
	ctx := context.Background()
	p := filepath.Join(home, "d", "f.txt")
	if _, err := f.WriteFile(ctx, connect.NewRequest(&agentpb.WriteFileRequest{Path: p, Data: []byte("a b a"), Mode: 0o600, MakeParents: true})); err != nil {
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
	if _, err := f.WriteFile(ctx, connect.NewRequest(&agentpb.WriteFileRequest{Path: filepath.Dir(p), Data: []byte("x")})); err == nil {
		t.Error("wrote over a directory")
	}
}

func TestFilesystemCalls(t *testing.T) {
	a, home := testAgent(t)
	fs := &fsService{a: a, watchers: map[string]*watcher{}}
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
		if got := connect.CodeOf(fsError(err)); got != want {
			t.Errorf("%v: %v, want %v", err, got, want)
		}
	}
}

// execLauncher starts commands as this test's own user.
type execLauncher struct{}

func (execLauncher) Start(argv []string, attr *syscall.ProcAttr) (int, error) {
	a := *attr
	sys := *attr.Sys
	sys.Credential = nil
	a.Sys = &sys
	return syscall.ForkExec(argv[0], argv, &a)
}
func (execLauncher) Signal(pid int, sig syscall.Signal) error { return syscall.Kill(pid, sig) }
func (execLauncher) Wait(pid int) (syscall.WaitStatus, error) {
	var ws syscall.WaitStatus
	_, err := syscall.Wait4(pid, &ws, 0, nil)
	return ws, err
}
func (execLauncher) OpenPTY(uint32, uint16, uint16) (*os.File, *os.File, error) {
	return nil, nil, errors.ErrUnsupported
}

// Regression (issue 12, item 14): a missing cwd was reported as "command
// not found" (exit 127). It is named as the working directory; a missing
// command in a good directory stays not found.
func TestStartNamesAMissingCwd(t *testing.T) {
	a, home := testAgent(t)
	a.o.Launcher = execLauncher{}
	u := user{"user", a.o.UID, a.o.GID, home}
	file := filepath.Join(home, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cwd := range []string{"/nonexistent-dir", file} {
		_, _, err := a.start(u, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/true", Cwd: &cwd}})
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.Contains(ce.Message(), "cwd") {
			t.Errorf("cwd %s: %v, want invalid argument naming the cwd", cwd, err)
		}
	}
	_, _, err := a.start(u, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/nonexistent-cmd", Cwd: &home}})
	if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound {
		t.Errorf("missing command: %v, want not found", err)
	}
}
