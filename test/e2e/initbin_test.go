package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every sandbox runs airlock-init, and only one airlock has checked: the
// one beside it, or --init PATH. A missing one, one of another version and
// one others may write each fail the run, naming the path and the fix, on
// every wall; nothing falls back to running airlock itself.
func TestInitBinaryIsChecked(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		dir := t.TempDir()
		other := filepath.Join(dir, "other-version")
		if err := os.WriteFile(other, []byte("#!/bin/sh\necho other\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		real, err := os.ReadFile(filepath.Join(suiteDir, "airlock-init"))
		if err != nil {
			t.Fatal(err)
		}
		writable := filepath.Join(dir, "writable")
		if err := os.WriteFile(writable, real, 0o775); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(writable, 0o775); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ path, why string }{
			{filepath.Join(dir, "missing"), "no such file"},
			{other, `it is version "other"`},
			{writable, "writable by others than root"},
		} {
			r := w.run(t, "--init", c.path, "--", "true")
			if r.code != 125 {
				t.Errorf("--init %s: %s", c.path, r)
				continue
			}
			for _, want := range []string{"airlock-init at " + c.path, c.why, "--init PATH"} {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("--init %s: the error does not say %q:\n%s", c.path, want, r.stderr)
				}
			}
		}
		// Named explicitly, the one beside airlock runs.
		r := w.run(t, "--init", filepath.Join(suiteDir, "airlock-init"), "--", "true")
		if r.code != 0 {
			t.Errorf("--init of the good one: %s", r)
		}
		if w.name == "container" {
			// The container wall's PID 1 is airlock-init (a one-shot gVisor
			// sandbox's first process is its command).
			r := w.run(t, "--", "cat", "/proc/1/cmdline")
			if r.code != 0 || r.stdout != "airlock-init\x00init\x00" {
				t.Errorf("PID 1 is not airlock-init: %q\n%s", r.stdout, r)
			}
		}
	})
}
