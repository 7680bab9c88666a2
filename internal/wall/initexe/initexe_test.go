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
	b, err := open(p, "v1.2", "")
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
	_, err := open(p, "v1", "")
	wantRefused(t, err, p, "no such file")
}

func TestOpenRefusesAnotherVersion(t *testing.T) {
	p := fakeInit(t, "v1.1", 0o755)
	_, err := open(p, "v1.2", "")
	wantRefused(t, err, p, `it is version "v1.1", airlock is "v1.2"`)
}

func TestOpenRefusesABinaryNotRoots(t *testing.T) {
	p := fakeInit(t, "v1", 0o755)
	if err := os.Chown(p, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	_, err := open(p, "v1", "")
	wantRefused(t, err, p, "owned by uid 1000, not root")
}

func TestOpenRefusesABinaryOthersMayWrite(t *testing.T) {
	for _, mode := range []os.FileMode{0o775, 0o757} {
		p := fakeInit(t, "v1", mode)
		_, err := open(p, "v1", "")
		wantRefused(t, err, p, "writable by others than root")
	}
}

func TestOpenRefusesWhatIsNotARegularExecutable(t *testing.T) {
	p := fakeInit(t, "v1", 0o644)
	_, err := open(p, "v1", "")
	wantRefused(t, err, p, "not executable")
	_, err = open(t.TempDir(), "v1", "")
	wantRefused(t, err, "", "not a regular file")
}

// A binary that fails its `version` is refused, with what it said.
func TestOpenRefusesABinaryThatCannotSayItsVersion(t *testing.T) {
	p := fakeInit(t, "v1", 0o755)
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho broken >&2; exit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := open(p, "v1", "")
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
	if New("", "").Path() != got || New("/x/y", "").Path() != "/x/y" {
		t.Error("Path does not say where it looks")
	}
}

// A binary's answer is remembered by its identity: the next process does
// not run it again, but a changed file, or another version's airlock,
// asks it again, and a refusal is never remembered.
func TestOpenRemembersAnAnswerByTheFilesIdentity(t *testing.T) {
	p := fakeInit(t, "v1", 0o755)
	asked := filepath.Join(t.TempDir(), "asked")
	script := "#!/bin/sh\necho >> " + asked + "\necho v1\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	known := filepath.Join(t.TempDir(), "known")
	times := func() int {
		b, _ := os.ReadFile(asked)
		return strings.Count(string(b), "\n")
	}
	for i := 0; i < 2; i++ {
		b, err := open(p, "v1", known)
		if err != nil {
			t.Fatal(err)
		}
		b.File.Close()
	}
	if n := times(); n != 1 {
		t.Fatalf("asked %d times, want once", n)
	}
	if _, err := open(p, "v2", known); err == nil || times() != 2 {
		t.Fatalf("another version's airlock took the remembered answer (%v, asked %d times)", err, times())
	}
	if _, err := open(p, "v2", known); err == nil || times() != 3 {
		t.Fatalf("a refusal was remembered (%v, asked %d times)", err, times())
	}
	// The same bytes, rewritten: a new identity, asked again.
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := open(p, "v1", known)
	if err != nil || times() != 4 {
		t.Fatalf("a changed file was not asked again (%v, asked %d times)", err, times())
	}
	b.File.Close()
	// Only the current answer is kept.
	if ents, _ := os.ReadDir(known); len(ents) != 1 {
		t.Errorf("remembered answers: %v", ents)
	}
}

// A remembered answer is believed only where root alone may write: an
// answer found in a directory others may write (which anyone could have
// put there, for an old airlock-init) is asked again.
func TestOpenBelievesOnlyARootOnlyAnswer(t *testing.T) {
	p := fakeInit(t, "v1", 0o755)
	asked := filepath.Join(t.TempDir(), "asked")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho >> "+asked+"\necho v1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	known := filepath.Join(t.TempDir(), "known")
	b, err := open(p, "v1", known)
	if err != nil {
		t.Fatal(err)
	}
	b.File.Close()
	if err := os.Chmod(known, 0o777); err != nil {
		t.Fatal(err)
	}
	if b, err = open(p, "v1", known); err != nil {
		t.Fatal(err)
	}
	b.File.Close()
	if out, _ := os.ReadFile(asked); strings.Count(string(out), "\n") != 2 {
		t.Errorf("an answer in a directory others may write was believed (asked %d times, want 2)", strings.Count(string(out), "\n"))
	}
}
