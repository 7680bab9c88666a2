// Package cmdutil is what airlock's command packages share: the global
// flags (Globals), the exit-error type, the connection to a daemon (Conn),
// the flags that describe a sandbox, the parsing of grants and local
// secrets, long work's progress on stderr, and small flag, path and output
// helpers. It imports api, client, internal/spec, internal/errdefs,
// internal/progress and internal/untrusted, and nothing of
// the engine: the remote commands (internal/cli/remote,
// internal/cli/admin) reach no further than the SDK through it.
package cmdutil

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"reflect"
)

// Globals are the flags every subcommand shares, and where output goes.
type Globals struct {
	StateDir   string
	DataDir    string
	Debug      bool
	ImageCache string
	// Runsc is the runsc the gvisor wall runs ("": the installed one).
	Runsc string
	// Init is the airlock-init every sandbox runs ("": the one beside
	// this executable).
	Init string
	// ForceProgress draws long work's progress on a stderr that is not a
	// terminal (--progress).
	ForceProgress bool
	// DNSUpstream, Pool and AllowNets are operator settings of run and
	// serve.
	DNSUpstream string
	Pool        netip.Prefix
	AllowNets   []netip.Prefix
	Log         *slog.Logger
	Stdout      io.Writer
	Stderr      io.Writer
}

// Warn tells the user something on stderr.
func (g *Globals) Warn(msg string) { fmt.Fprintf(g.Stderr, "airlock: %s\n", msg) }

// AdminKeyPath is where serve writes the admin key by default.
func (g *Globals) AdminKeyPath() string { return filepath.Join(g.DataDir, "admin.key") }

// ExitError carries an exit code through cobra.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit %d", e.Code) }

// Exit is the error that makes airlock exit with code: nil for 0.
func Exit(code int) error {
	if code == 0 {
		return nil
	}
	return ExitError{Code: code}
}

// PrintJSON writes v as indented JSON; an empty list is [], never null
// (a script reading it gets the same type whatever it holds).
func PrintJSON(w io.Writer, v any) error {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice && rv.IsNil() {
		v = []struct{}{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
