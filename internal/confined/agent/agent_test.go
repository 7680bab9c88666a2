package agent

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/internal/confined/agent/files"
)

func testAgent(t *testing.T) (*agent, string) {
	t.Helper()
	home := t.TempDir()
	return &agent{o: Options{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Home: home, Cwd: home}, procs: newProcs()}, home
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
	_ = syscall.Kill(-pid, syscall.SIGKILL)
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
	u := files.User{Name: "user", UID: a.o.UID, GID: a.o.GID, Home: home}
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

// sessionGroups reads proc's stat files: the groups of one session, each
// once, whatever a command's name holds.
func TestSessionGroups(t *testing.T) {
	proc := t.TempDir()
	for pid, stat := range map[string]string{
		"10":   "10 (bash) S 1 10 10 34816 12 4194560",
		"11":   "11 (vim) S 10 11 10 34816 11 4194560",
		"12":   "12 (a) b (c)) S 10 11 10 34816 11 0",
		"13":   "13 (other) S 1 13 13 0 -1 0",
		"self": "10 (bash) S 1 99 10 0 0 0",
		"14":   "garbage",
	} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := sessionGroups(proc, 10)
	slices.Sort(got)
	if !slices.Equal(got, []int{10, 11}) {
		t.Errorf("groups of session 10: %v, want [10 11]", got)
	}
}
