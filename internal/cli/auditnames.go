package cli

import (
	"fmt"
	"io"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
)

// The names audit.go reads. Its commands see the global flags through
// globals, a copy of the cmdutil.Globals fields they use that the root
// command takes before any command runs; their exit codes and JSON go
// through cmdutil's.

// globals are the settings `airlock audit` reads.
type globals struct {
	stateDir string
	dataDir  string
	stdout   io.Writer
}

// exitError is an exit code, as cmdutil.ExitError (which it unwraps to).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func (e exitError) Unwrap() error { return cmdutil.ExitError{Code: e.code} }

func printJSON(w io.Writer, v any) error { return cmdutil.PrintJSON(w, v) }
