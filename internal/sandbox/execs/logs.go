package execs

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// The output the daemon keeps of background commands (airlock logs): the
// newest bytes of each, stdout, stderr and terminal output in the order
// they came. A log grows as output comes, in steps of logStep, while its
// command's, its sandbox's and its tenant's shares allow; past them it
// keeps its newest bytes and counts what it let go. The logs of ended
// commands are kept (endedLogsPerSandbox at most) until their sandbox
// ends, or until a running command needs their share.
const (
	LogBytesPerCommand  = 1 << 20
	LogBytesPerSandbox  = 16 << 20
	LogBytesPerTenant   = 64 << 20
	logStep             = 64 << 10
	endedLogsPerSandbox = 16
)

// logs are the outputs kept, and what they hold of each share.
type logs struct {
	mu        sync.Mutex
	bySandbox map[string]map[uint32]*outputLog // by sandbox id, pid
	ended     []*outputLog                     // oldest end first
	sandbox   map[string]int64                 // bytes granted, by sandbox id
	tenant    map[string]int64                 // bytes granted, by tenant id
	watched   map[string]bool                  // sandboxes whose end drops their logs
	// The shares (tests make them small).
	perCommand, perSandbox, perTenant int64
}

func newLogs() *logs {
	return &logs{bySandbox: map[string]map[uint32]*outputLog{}, sandbox: map[string]int64{}, tenant: map[string]int64{}, watched: map[string]bool{},
		perCommand: LogBytesPerCommand, perSandbox: LogBytesPerSandbox, perTenant: LogBytesPerTenant}
}

// logChunk is output of one stream: off is its first byte's offset in all
// the command's output.
type logChunk struct {
	off    int64
	stream int // 0 stdout, 1 stderr, 2 terminal
	data   []byte
	array  int // bytes of the array data lies in (data may start past its head)
}

// outputLog is one background command's output kept.
type outputLog struct {
	ls              *logs
	sandbox, tenant string
	pid             uint32

	mu         sync.Mutex
	chunks     []logChunk
	start, end int64 // the bytes held are [start, end) of all its output
	fin        *api.ExecEnd
	wake       chan struct{} // closed (and replaced) at each change

	granted int64 // under ls.mu
	dropped bool  // under ls.mu: no longer listed
}

// open starts the log of background command pid of sandbox sb (tenant
// t); a log an earlier command of that pid left goes.
func (ls *logs) open(sb, t string, pid uint32) *outputLog {
	l := &outputLog{ls: ls, sandbox: sb, tenant: t, pid: pid, wake: make(chan struct{})}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if old := ls.bySandbox[sb][pid]; old != nil {
		ls.forget(old)
	}
	if ls.bySandbox[sb] == nil {
		ls.bySandbox[sb] = map[uint32]*outputLog{}
	}
	ls.bySandbox[sb][pid] = l
	return l
}

// get is the log of command pid of sandbox sb, or nil.
func (ls *logs) get(sb string, pid uint32) *outputLog {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.bySandbox[sb][pid]
}

// drop forgets every log of sandbox sb (it ended).
func (ls *logs) drop(sb string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, l := range ls.bySandbox[sb] {
		ls.forget(l)
	}
	delete(ls.watched, sb)
}

// forget unlists l and gives its share back (under ls.mu).
func (ls *logs) forget(l *outputLog) {
	if l.dropped {
		return
	}
	l.dropped = true
	if m := ls.bySandbox[l.sandbox]; m[l.pid] == l {
		delete(m, l.pid)
		if len(m) == 0 {
			delete(ls.bySandbox, l.sandbox)
		}
	}
	ls.ended = slices.DeleteFunc(ls.ended, func(e *outputLog) bool { return e == l })
	ls.give(l.sandbox, l.tenant, l.granted)
	l.granted = 0
}

func (ls *logs) give(sb, t string, n int64) {
	if ls.sandbox[sb] -= n; ls.sandbox[sb] <= 0 {
		delete(ls.sandbox, sb)
	}
	if ls.tenant[t] -= n; ls.tenant[t] <= 0 {
		delete(ls.tenant, t)
	}
}

// grow grants l up to want more bytes within the shares, letting ended
// commands' logs go (oldest first) when its sandbox's or its tenant's
// share is spent; it returns l's capacity.
func (ls *logs) grow(l *outputLog, want int64) int64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l.dropped {
		return l.granted
	}
	want = min((want+logStep-1)/logStep*logStep, ls.perCommand-l.granted)
	room := func() int64 {
		return min(want, ls.perSandbox-ls.sandbox[l.sandbox], ls.perTenant-ls.tenant[l.tenant])
	}
	for room() < want {
		i := slices.IndexFunc(ls.ended, func(e *outputLog) bool {
			return e.tenant == l.tenant && (e.sandbox == l.sandbox || ls.perTenant-ls.tenant[l.tenant] < want)
		})
		if i < 0 {
			break
		}
		ls.forget(ls.ended[i])
	}
	if n := room(); n > 0 {
		l.granted += n
		ls.sandbox[l.sandbox] += n
		ls.tenant[l.tenant] += n
	}
	return l.granted
}

// add keeps a command's output event.
func (l *outputLog) add(ev *api.ExecEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for stream, data := range [][]byte{ev.Stdout, ev.Stderr, ev.PTY} {
		if len(data) > 0 {
			l.write(stream, data)
		}
	}
	l.changed()
}

// write keeps data (under l.mu), letting the oldest bytes go past l's
// capacity.
func (l *outputLog) write(stream int, data []byte) {
	n := int64(len(data))
	capacity := l.ls.capacity(l)
	if held := l.end - l.start; held+n > capacity {
		capacity = l.ls.grow(l, held+n-capacity)
	}
	if n > capacity {
		data = data[n-capacity:]
	}
	off := l.end + n - int64(len(data))
	l.end += n
	l.trim(l.end - capacity)
	if len(data) == 0 {
		return
	}
	// Small writes of one stream make one chunk; a chunk is the log's own
	// copy. Past maxChunks (a command that alternates streams a byte at a
	// time), the oldest go: the bookkeeping stays a fraction of the bytes.
	if k := len(l.chunks) - 1; k >= 0 && l.chunks[k].stream == stream && len(l.chunks[k].data) < coalesce && l.chunks[k].off+int64(len(l.chunks[k].data)) == off {
		c := &l.chunks[k]
		old := cap(c.data)
		if c.data = append(c.data, data...); cap(c.data) != old {
			c.array = cap(c.data) // a new array
		}
	} else {
		kept := append([]byte(nil), data...)
		l.chunks = append(l.chunks, logChunk{off: off, stream: stream, data: kept, array: cap(kept)})
	}
	if maxChunks := capacity/minChunk + 1; int64(len(l.chunks)) > maxChunks {
		c := l.chunks[len(l.chunks)-int(maxChunks)]
		l.trim(c.off)
	}
}

// A log's chunks: up to coalesce bytes of one stream are one chunk, and
// a log holds at most one chunk per minChunk bytes of its capacity.
const (
	coalesce = 16 << 10
	minChunk = 512
)

// trim lets go of the bytes before offset from.
func (l *outputLog) trim(from int64) {
	if from <= l.start {
		return
	}
	l.start = from
	i := 0
	for ; i < len(l.chunks); i++ {
		c := &l.chunks[i]
		if c.off+int64(len(c.data)) > from {
			if c.off < from {
				// The kept part is copied once it is less than half
				// its array: a log holds at most about twice its bytes,
				// and letting go of a byte does not copy the rest.
				c.data = c.data[from-c.off:]
				c.off = from
				if 2*len(c.data) < c.array {
					c.data = append([]byte(nil), c.data...)
					c.array = cap(c.data)
				}
			}
			break
		}
	}
	l.chunks = slices.Delete(l.chunks, 0, i)
}

func (ls *logs) capacity(l *outputLog) int64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return l.granted
}

// finish records the command's end (nil: the daemon lost its stream) and
// lists the log among the ended, the oldest of its sandbox's going past
// endedLogsPerSandbox.
func (l *outputLog) finish(end *api.ExecEnd) {
	if end == nil {
		end = &api.ExecEnd{ExitCode: -1, Status: "unknown: the daemon lost the command's stream (its sandbox ended?)"}
	}
	l.mu.Lock()
	l.fin = end
	l.changed()
	l.mu.Unlock()
	ls := l.ls
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l.dropped {
		return
	}
	ls.ended = append(ls.ended, l)
	n := 0
	for i := len(ls.ended) - 1; i >= 0; i-- {
		if e := ls.ended[i]; e.sandbox == l.sandbox {
			if n++; n > endedLogsPerSandbox {
				ls.forget(e)
			}
		}
	}
}

func (l *outputLog) changed() {
	close(l.wake)
	l.wake = make(chan struct{})
}

// read returns the events of the output from offset *at on (moving *at
// past them), the bytes before them no longer held, the end if it came,
// and a channel closed at the next change.
func (l *outputLog) read(at *int64) (evs []*api.ExecEvent, lost int64, end *api.ExecEnd, wake <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if *at < l.start {
		lost, *at = l.start-*at, l.start
	}
	for _, c := range l.chunks {
		if c.off+int64(len(c.data)) <= *at {
			continue
		}
		data := c.data[max(0, *at-c.off):]
		ev := &api.ExecEvent{}
		switch c.stream {
		case 0:
			ev.Stdout = data
		case 1:
			ev.Stderr = data
		default:
			ev.PTY = data
		}
		evs = append(evs, ev)
	}
	*at = l.end
	return evs, lost, l.fin, l.wake
}

// Logs streams the output a background command of sandbox id printed
// since it started, as much as is kept: {"pid"} first (with "dropped",
// the bytes no longer kept before what follows), its output, and its end
// if it ended. With follow, it goes on with new output until the end.
func (s *Commands) Logs(ctx context.Context, t *tenant.Principal, id string, pid uint32, follow bool, emit func(*api.ExecEvent) error) error {
	b, err := s.Find(t, id)
	if err != nil {
		return err
	}
	l := s.logs.get(b.Rec.ID, pid)
	if l == nil {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("no output kept of pid %d in sandbox %s: the daemon keeps a background command's (exec -d), from its start, until its sandbox ends", pid, core.QuoteID(id)))
	}
	var at int64
	first := true
	for {
		evs, lost, end, wake := l.read(&at)
		if first || lost > 0 {
			head := &api.ExecEvent{Dropped: lost}
			if first {
				head.PID = pid
			}
			first = false
			if err := emit(head); err != nil {
				return err
			}
		}
		for _, ev := range evs {
			if err := emit(ev); err != nil {
				return err
			}
		}
		if end != nil {
			return emit(&api.ExecEvent{End: end})
		}
		if !follow {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// keepLog starts keeping the output of background command pid of b; the
// logs of b's commands go when b ends.
func (s *Commands) keepLog(b *core.Box, pid uint32) *outputLog {
	ls := s.logs
	ls.mu.Lock()
	watch := !ls.watched[b.Rec.ID] && b.Ended != nil
	if watch {
		ls.watched[b.Rec.ID] = true
	}
	ls.mu.Unlock()
	if watch {
		go func() {
			<-b.Ended
			ls.drop(b.Rec.ID)
		}()
	}
	l := ls.open(b.Rec.ID, b.Rec.Tenant, pid)
	select {
	case <-b.Ended: // it ended meanwhile: its watcher may have been first
		ls.drop(b.Rec.ID)
	default:
	}
	return l
}
