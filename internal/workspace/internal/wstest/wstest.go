// Package wstest is what the tests of the workspace packages
// (internal/workspace and its safefs, snapshot) share: a tree written from
// a map, and a directory held by an O_PATH descriptor, as the host holds a
// sandbox's layers; for tests only. It imports x/sys only.
package wstest

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Mkfiles writes files (path under root → content), making their
// directories.
func Mkfiles(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// OpenPath opens directory p with O_PATH, closed when the test ends.
func OpenPath(t testing.TB, p string) *os.File {
	t.Helper()
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), p)
	t.Cleanup(func() { f.Close() })
	return f
}
