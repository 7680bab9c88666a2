package system

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// airlock gc --logs-older-than removes the runs' logs and the MCP
// sessions' directories nothing wrote to for that long, and nothing else:
// not a session still writing, not a file of another name, not a link.
func TestPruneLogsRemovesOnlyOldLogsOfItsOwn(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	root := RunStateDir()
	old := time.Now().Add(-60 * 24 * time.Hour)
	mk := func(p string, dir bool, when time.Time) string {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if dir {
			if err := os.MkdirAll(filepath.Join(p, "audit"), 0o700); err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(p, "audit", "00000001.log")
			if err := os.WriteFile(f, []byte("{}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_ = os.Chtimes(f, when, when)
			_ = os.Chtimes(filepath.Join(p, "audit"), when, when)
		} else if err := os.WriteFile(p, []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_ = os.Chtimes(p, when, when)
		return p
	}
	oldRun := mk("runs/20261001T101500.123456789Z.audit", false, old)
	newRun := mk("runs/20261201T101500.123456789Z.audit", false, time.Now())
	otherFile := mk("runs/notes.audit", false, old)
	oldSession := mk("mcp/20261001T101500Z-0123abcd", true, old)
	liveSession := mk("mcp/20261002T101500Z-4567cdef", true, old)
	// The live session's log was written a moment ago, its directory long since.
	_ = os.WriteFile(filepath.Join(liveSession, "audit", "00000002.log"), []byte("{}\n"), 0o600)
	link := filepath.Join(root, "mcp", "20261003T101500Z-89abcdef")
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	removed, err := PruneLogs(30 * 24 * time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{oldSession, oldRun}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, p := range []string{newRun, otherFile, liveSession, link} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
