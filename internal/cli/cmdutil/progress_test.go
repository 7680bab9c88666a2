package cmdutil

import (
	"context"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/progress"
)

// Progress is drawn only where a person watches (a terminal) or when
// --progress asks for it, never under --json; what it shows cannot move
// the cursor, whoever wrote the event.
func TestProgressOnlyWhereAskedAndInert(t *testing.T) {
	ev := progress.Event{Op: "pull", Message: "pulling x\x1b[2J\ry (r)"}
	for _, c := range []struct {
		force, json bool
		want        string
	}{
		{false, false, ""},
		{true, true, ""},
		{false, true, ""},
		{true, false, `airlock: pulling x\033[2J\015y (r)` + "\n"},
	} {
		var b strings.Builder
		g := &Globals{Stderr: &b, ForceProgress: c.force}
		ctx, done := g.Progress(context.Background(), c.json)
		progress.Report(ctx, ev)
		done()
		if b.String() != c.want {
			t.Errorf("--progress %v --json %v: %q, want %q", c.force, c.json, b.String(), c.want)
		}
	}
}
