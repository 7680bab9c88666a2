package files

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/filesystem"
)

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
