package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
)

// Issue 14: a manual page for every command a user can call, generated
// from the commands (their flags and help text), none for hidden ones.
func TestManPagesCoverEveryCommand(t *testing.T) {
	var out strings.Builder
	root := newRoot(&cmdutil.Globals{Stdout: &out, Stderr: &out})
	dir := t.TempDir()
	root.SetArgs([]string{"man", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	var walk func(c *cobra.Command)
	pages := 0
	walk = func(c *cobra.Command) {
		name := strings.ReplaceAll(c.CommandPath(), " ", "-") + ".1"
		b, err := os.ReadFile(filepath.Join(dir, name))
		switch {
		case c.Hidden:
			if err == nil {
				t.Errorf("a page for hidden %q", c.CommandPath())
			}
			return
		case err != nil:
			t.Errorf("no page for %q: %v", c.CommandPath(), err)
		case !strings.Contains(string(b), ".SH NAME") || !strings.Contains(string(b), c.Short[:min(len(c.Short), 20)]):
			t.Errorf("%s lacks its name or description", name)
		}
		pages++
		for _, s := range c.Commands() {
			if s.Name() != "help" && s.Name() != "completion" {
				walk(s)
			}
		}
	}
	walk(root)
	if pages < 30 {
		t.Errorf("only %d pages", pages)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "airlock-exec.1")); err != nil || !strings.Contains(string(b), "--detach") {
		t.Errorf("exec's page lacks its flags: %v", err)
	}
	// An example in the help text stays a line of its own, not run into
	// the next.
	b, _ := os.ReadFile(filepath.Join(dir, "airlock-logs.1"))
	if !strings.Contains(string(b), ".EX\n  pid=$(airlock exec -d \"$id\" -- make serve)\n  airlock logs -f") {
		t.Errorf("logs' example:\n%s", b)
	}
}
