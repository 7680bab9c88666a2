package remote

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"
)

// meter shows the bytes a copy moved on stderr, on one line rewritten at
// most every meterEvery and once more at the end, when stderr is a
// terminal or when asked (--progress); otherwise it shows nothing.
type meter struct {
	w     io.Writer
	mu    sync.Mutex
	n     int64
	shown time.Time
	on    bool
}

const meterEvery = 200 * time.Millisecond

func newMeter(stderr io.Writer, asked bool) *meter {
	on := asked
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		on = true
	}
	return &meter{w: stderr, on: on}
}

// reader counts what r reads.
func (m *meter) reader(r io.Reader) io.Reader {
	if !m.on {
		return r
	}
	return meterReader{r, m}
}

type meterReader struct {
	r io.Reader
	m *meter
}

func (mr meterReader) Read(p []byte) (int, error) {
	n, err := mr.r.Read(p)
	mr.m.add(int64(n))
	return n, err
}

func (m *meter) add(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n += n
	if now := time.Now(); now.Sub(m.shown) >= meterEvery {
		m.shown = now
		fmt.Fprintf(m.w, "\rcp: %s", size(m.n))
	}
}

// done ends the line with the total.
func (m *meter) done() {
	if !m.on {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(m.w, "\rcp: %s copied\n", size(m.n))
}

// size is n bytes for people.
func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
