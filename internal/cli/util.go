package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errdefs.Invalid(fmt.Sprintf("--timeout %q: want a duration such as 30s, 5m or 1h", s))
	}
	return d, nil
}

func absPath(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return a, nil
}

// forTerminal is w, through untrusted.TerminalWriter when it is a
// terminal: what goes there holds a sandbox's file contents (a diff),
// whose controls and escape sequences could hide or rewrite the lines a
// person reviews. Anything else (a file, a pipe) gets the bytes as they
// are, a patch that applies.
func forTerminal(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return untrusted.TerminalWriter(w)
	}
	return w
}
