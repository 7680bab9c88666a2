package cmdutil

import (
	"context"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/progress"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// Progress is where long work (an image's pull and unpack, a snapshot)
// shows its progress: a line redrawn on stderr when stderr is a terminal,
// a line per report when --progress forces it on anything else, nowhere
// under --json or without either. ctx carries its sink; done erases what
// it drew, before the command's own output. Texts are shown as terminal
// text: a daemon's events cannot move the cursor.
func (g *Globals) Progress(ctx context.Context, asJSON bool) (_ context.Context, done func()) {
	if asJSON {
		return ctx, func() {}
	}
	tty := false
	if f, ok := g.Stderr.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	if !tty && !g.ForceProgress {
		return ctx, func() {}
	}
	l := &progress.Line{W: g.Stderr, Prefix: "airlock: ", Plain: !tty}
	return progress.With(ctx, func(e progress.Event) {
		e.Subject, e.Message = terminalLine(e.Subject), terminalLine(e.Message)
		l.Report(e)
	}), l.Clear
}

// terminalLine is s shown on one terminal line.
func terminalLine(s string) string {
	return strings.ReplaceAll(untrusted.TerminalText(s), "\n", " ")
}
