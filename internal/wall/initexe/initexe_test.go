package initexe

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// fakeInit writes an executable that answers `version` with v, as root's.
func fakeInit(t *testing.T, v string, mode os.FileMode) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("root-owned files need root")
	}
	p := filepath.Join(t.TempDir(), Name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n[ \"$1\" = version ] && echo '"+v+"'\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantRefused fails t unless err is an ErrUnavailable that names the path,
// says why and says how to fix it.
func wantRefused(t *testing.T, err error, path, why string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s was accepted", path)
	}
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("error not classed unavailable: %v", err)
	}
	for _, want := range []string{path, why, "--init PATH", "scripts/install.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestOpenAcceptsRootsBinaryOfTheSameVersion(t *testing.T) {
	p := fakeInit(t, "v1.2", 0o755)
	b, err := open(p, "v1.2")
	if err != nil {
		t.Fatal(err)
	}
	defer b.File.Close()
	if b.Path != p || b.Version != "v1.2" {
		t.Errorf("got %+v", b)
	}
}

func TestOpenRefusesAMissingBinary(t *testing.T) {
	p := filepath.Join(t.TempDir(), Name)
	_, err := open(p, "v1")
	wantRefused(t, err, p, "no such file")
}

func TestOpenRefusesAnotherVersion(t *testing.T) {
	p := fakeInit(t, "v1.1", 0o755)
	_, err := open(p, "v1.2")
	wantRefused(t, err, p, `it is version "v1.1", airlock is "v1.2"`)
}

func TestOpenRefusesABinaryNotRoots(t *testing.T) {
	p := fakeInit(t, "v1", 0o755)
	if err := os.Chown(p, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	_, err := open(p, "v1")
	wantRefused(t, err, p, "owned by uid 1000, not root")
}

func TestOpenRefusesABinaryOthersMayWrite(t *testing.T) {
	for _, mode := range []os.FileMode{0o775, 0o757} {
		p := fakeInit(t, "v1", mode)
		_, err := open(p, "v1")
		wantRefused(t, err, p, "writable by others than root")
	}
}

func TestOpenRefusesWhatIsNotARegularExecutable(t *testing.T) {
	p := fakeInit(t, "v1", 0o644)
	_, err := open(p, "v1")
	wantRefused(t, err, p, "not executable")
	_, err = open(t.TempDir(), "v1")
	wantRefused(t, err, "", "not a regular file")
}

// A binary that fails its `version` is refused, with what it said.
func TestOpenRefusesABinaryThatCannotSayItsVersion(t *testing.T) {
	p := fakeInit(t, "v1", 0o755)
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho broken >&2; exit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := open(p, "v1")
	wantRefused(t, err, p, "broken")
}

// By default the binary is looked for beside the running executable.
func TestDefaultIsBesideTheExecutable(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	self, _ = filepath.EvalSymlinks(self)
	got, err := Default()
	if err != nil || got != filepath.Join(filepath.Dir(self), Name) {
		t.Fatalf("Default() = %q, %v", got, err)
	}
	if New("").Path() != got || New("/x/y").Path() != "/x/y" {
		t.Error("Path does not say where it looks")
	}
}
