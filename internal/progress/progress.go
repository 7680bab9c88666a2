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
)

// Event is one report of long work.
type Event struct {
	// Op is the kind of work: "pull" (registry bytes), "unpack" (layers
	// written into the image cache), "snapshot" (files copied).
	Op string `json:"op"`
	// Subject is what is worked on: an image reference, a sandbox id.
	Subject string `json:"subject,omitempty"`
	// Message, when set, is a line that stands (what is pulled, from
	// where); the counts below are then empty.
	Message string `json:"message,omitempty"`
	// Layer of Layers is the image layer at work (1-based).
	Layer  int `json:"layer,omitempty"`
	Layers int `json:"layers,omitempty"`
	// Bytes done so far (of the layer when Layer is set), of Total when
	// Total is known (0: unknown).
	Bytes int64 `json:"bytes,omitempty"`
	Total int64 `json:"total,omitempty"`
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
		fmt.Fprintf(&b, " %s/%s MiB", mib(e.Bytes), mib(e.Total))
	} else {
		fmt.Fprintf(&b, " %s MiB", mib(e.Bytes))
	}
	return b.String()
}

func mib(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

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

// Line draws events on one line of a terminal, each over the last; an
// event with a Message is printed on a line of its own and stays. Clear
// erases the drawn line, before anything else is written to w.
type Line struct {
	W      io.Writer
	Prefix string // "airlock: "
	mu     sync.Mutex
	drawn  bool
}

// Report draws e.
func (l *Line) Report(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.Message != "" {
		l.clear()
		fmt.Fprintf(l.W, "%s%s\n", l.Prefix, e.Message)
		return
	}
	fmt.Fprintf(l.W, "\r\x1b[K%s%s", l.Prefix, e)
	l.drawn = true
}

// Clear erases the line drawn last, if any.
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
