// Package progress carries what long work (an image's pull and unpack, a
// snapshot's copy) tells its caller while it runs: an Event, handed to the
// sink a context carries (With, Report), and drawn on a terminal (Line).
// Work with no sink in its context reports nothing. It imports the
// standard library only.
package progress

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Event is one report of long work.
type Event struct {
	// Op is the kind of work: "pull" (registry bytes), "unpack" (layers
	// written into the image cache), "snapshot" (files copied).
	Op string `json:"op"`
	// Subject is what is worked on: an image reference, a sandbox id.
	Subject string `json:"subject,omitempty"`
	// Message, when set, is what to show instead of the counts: until the
	// next event ("pulling docker.io/library/python:3.12
	// (index.docker.io)"), or for good when Stays.
	Message string `json:"message,omitempty"`
	Stays   bool   `json:"stays,omitempty"`
	// Layer of Layers is the image layer at work (1-based).
	Layer  int `json:"layer,omitempty"`
	Layers int `json:"layers,omitempty"`
	// Bytes done so far (of the layer when Layer is set), of Total when
	// Total is known (0: unknown).
	Bytes int64 `json:"bytes,omitempty"`
	Total int64 `json:"total,omitempty"`
	// Done ends the work: what was drawn for it goes.
	Done bool `json:"done,omitempty"`
}

// String is the event as a person reads it: "pull python:3.12: layer 2/5
// 12.3/40.1 MiB".
func (e Event) String() string {
	if e.Message != "" {
		return e.Message
	}
	var b strings.Builder
	b.WriteString(e.Op)
	if e.Subject != "" {
		b.WriteString(" " + e.Subject)
	}
	b.WriteString(":")
	if e.Layers > 0 {
		fmt.Fprintf(&b, " layer %d/%d", e.Layer, e.Layers)
	}
	if e.Total > 0 {
		fmt.Fprintf(&b, " %s/%s MiB", MiB(e.Bytes), MiB(e.Total))
	} else {
		fmt.Fprintf(&b, " %s MiB", MiB(e.Bytes))
	}
	return b.String()
}

// MiB is n bytes in MiB, one decimal: "12.3".
func MiB(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

type key struct{}

// With returns ctx carrying sink: work done under it reports to sink,
// which may be called from any goroutine, one call at a time.
func With(ctx context.Context, sink func(Event)) context.Context {
	var mu sync.Mutex
	return context.WithValue(ctx, key{}, func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		sink(e)
	})
}

// Report hands e to ctx's sink, if it has one.
func Report(ctx context.Context, e Event) {
	if sink, ok := ctx.Value(key{}).(func(Event)); ok {
		sink(e)
	}
}

// Enabled says whether ctx has a sink: work may skip counting without one.
func Enabled(ctx context.Context) bool {
	_, ok := ctx.Value(key{}).(func(Event))
	return ok
}

// Line draws events on one line of a terminal, each over the last; a
// Message that Stays is printed on a line of its own, and Done erases the
// line. Plain (a writer that is not a terminal) prints each event on a
// line of its own instead: Messages, a layer's first report and then at
// most one report every PlainEvery.
type Line struct {
	W      io.Writer
	Prefix string // "airlock: "
	Plain  bool
	mu     sync.Mutex
	drawn  bool
	last   time.Time
	layer  int
}

// PlainEvery spaces the reports of a Plain line.
const PlainEvery = 2 * time.Second

// Report draws e.
func (l *Line) Report(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case e.Done:
		l.clear()
	case l.Plain:
		if e.Message == "" && e.Layer == l.layer && time.Since(l.last) < PlainEvery {
			return
		}
		l.last, l.layer = time.Now(), e.Layer
		fmt.Fprintf(l.W, "%s%s\n", l.Prefix, e)
	case e.Stays:
		l.clear()
		fmt.Fprintf(l.W, "%s%s\n", l.Prefix, e)
	default:
		fmt.Fprintf(l.W, "\r\x1b[K%s%s", l.Prefix, e)
		l.drawn = true
	}
}

// Clear erases the line drawn last, if any: before anything else is
// written to W.
func (l *Line) Clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clear()
}

func (l *Line) clear() {
	if l.drawn {
		fmt.Fprint(l.W, "\r\x1b[K")
		l.drawn = false
	}
}
