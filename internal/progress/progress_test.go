package progress

import (
	"context"
	"strings"
	"testing"
)

// On a terminal, counts redraw one line, a lasting message gets a line of
// its own, and the end of the work erases what was drawn.
func TestLineRedrawsOneLine(t *testing.T) {
	var b strings.Builder
	l := &Line{W: &b, Prefix: "airlock: "}
	l.Report(Event{Op: "pull", Message: "pulling docker.io/library/python:3.12 (index.docker.io)"})
	l.Report(Event{Op: "pull", Subject: "python:3.12", Layer: 2, Layers: 5, Bytes: 12900000, Total: 42048000})
	l.Report(Event{Op: "unpack", Message: "unpacked python:3.12", Stays: true})
	l.Report(Event{Op: "pull", Done: true})
	want := "\r\x1b[Kairlock: pulling docker.io/library/python:3.12 (index.docker.io)" +
		"\r\x1b[Kairlock: pull python:3.12: layer 2/5 12.3/40.1 MiB" +
		"\r\x1b[Kairlock: unpacked python:3.12\n"
	if b.String() != want {
		t.Errorf("drew %q\nwant %q", b.String(), want)
	}
	b.Reset()
	l.Report(Event{Op: "snapshot", Subject: "sb", Bytes: 3 << 20})
	l.Report(Event{Done: true})
	if b.String() != "\r\x1b[Kairlock: snapshot sb: 3.0 MiB\r\x1b[K" {
		t.Errorf("drew %q", b.String())
	}
}

// Off a terminal, each message and each layer's first report is a line;
// counts in between wait for PlainEvery; nothing is redrawn.
func TestPlainLinePrintsLines(t *testing.T) {
	var b strings.Builder
	l := &Line{W: &b, Prefix: "airlock: ", Plain: true}
	l.Report(Event{Op: "pull", Message: "pulling x (r)"})
	l.Report(Event{Op: "pull", Subject: "x", Layer: 1, Layers: 2, Total: 10})
	l.Report(Event{Op: "pull", Subject: "x", Layer: 1, Layers: 2, Bytes: 5, Total: 10})
	l.Report(Event{Op: "pull", Subject: "x", Layer: 2, Layers: 2, Total: 10})
	l.Report(Event{Done: true})
	want := "airlock: pulling x (r)\nairlock: pull x: layer 1/2 0.0/0.0 MiB\nairlock: pull x: layer 2/2 0.0/0.0 MiB\n"
	if b.String() != want {
		t.Errorf("printed %q\nwant %q", b.String(), want)
	}
}

// Work reports to the sink its context carries, and to none without one.
func TestReportReachesTheContextsSink(t *testing.T) {
	Report(context.Background(), Event{Op: "pull"}) // no sink: nothing
	if Enabled(context.Background()) {
		t.Error("a bare context has a sink")
	}
	var got []Event
	ctx := With(context.Background(), func(e Event) { got = append(got, e) })
	Report(ctx, Event{Op: "pull", Bytes: 1})
	if !Enabled(ctx) || len(got) != 1 || got[0].Bytes != 1 {
		t.Errorf("got %+v", got)
	}
}
