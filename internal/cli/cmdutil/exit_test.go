package cmdutil

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Issue 14: one exit-code table for every command. A missing local file
// (cp's) or a sandbox not found is a failure (1), not "the sandbox could
// not be created" (125); a bad value is a usage error (2); a command that
// relays a sandboxed command's status answers 125 for any failure of its
// own, so that it never reads as the command's.
func TestExitCodeTable(t *testing.T) {
	plain, relay := &cobra.Command{Use: "cp"}, Relays(&cobra.Command{Use: "exec"})
	missing := fmt.Errorf("cp: %w", &os.PathError{Op: "open", Path: "x", Err: os.ErrNotExist})
	for _, c := range []struct {
		name string
		cmd  *cobra.Command
		err  error
		want int
	}{
		{"ok", plain, nil, 0},
		{"ok, relayed", relay, nil, 0},
		{"a local file missing", plain, missing, 1},
		{"not found", plain, errdefs.New(errdefs.ErrNotFound, "no sandbox"), 1},
		{"unreachable", plain, errdefs.Unavailable("no daemon socket"), 1},
		{"quota", plain, errdefs.New(errdefs.ErrResourceExhausted, "quota"), 1},
		{"bad value", plain, fmt.Errorf("x: %w", errdefs.Invalid("--memory: bad size")), 2},
		{"an exit code said", plain, ExitError{Code: 3}, 3},
		{"bad value, relayed", relay, errdefs.Invalid("--cwd"), 125},
		{"not found, relayed", relay, errdefs.New(errdefs.ErrNotFound, "no sandbox"), 125},
		{"anything, relayed", relay, errors.New("boom"), 125},
		{"the command's status", relay, ExitError{Code: 127}, 127},
	} {
		if got := ExitCode(c.cmd, c.err); got != c.want {
			t.Errorf("%s: ExitCode = %d, want %d", c.name, got, c.want)
		}
	}
}

// Wrong arguments and an unknown subcommand are usage errors, at the root
// and under a command that groups others.
func TestUsageErrorsOfTheTree(t *testing.T) {
	root := &cobra.Command{Use: "airlock", SilenceErrors: true, SilenceUsage: true}
	group := &cobra.Command{Use: "tenant"}
	leaf := &cobra.Command{Use: "rm NAME", Args: cobra.ExactArgs(1), RunE: func(*cobra.Command, []string) error { return nil }}
	group.AddCommand(leaf)
	root.AddCommand(group, &cobra.Command{Use: "ps", Run: func(*cobra.Command, []string) {}})
	Usage(root)
	for _, args := range [][]string{{"bogus"}, {"tenant", "bogus"}, {"tenant", "rm"}, {"tenant", "rm", "a", "b"}} {
		root.SetArgs(args)
		cmd, err := root.ExecuteC()
		if got := ExitCode(cmd, err); got != ExitUsage {
			t.Errorf("%q: exit %d (%v), want %d", args, got, err, ExitUsage)
		}
	}
	root.SetArgs([]string{"tenant", "rm", "a"})
	if cmd, err := root.ExecuteC(); ExitCode(cmd, err) != 0 {
		t.Errorf("tenant rm a: %v", err)
	}
}
