package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/filesystem"
)

// Bounds on polled watchers.
const (
	maxWatchersPerSandbox = 16
	maxPolledEvents       = 10_000  // kept per watcher between polls
	maxPolledBytes        = 1 << 20 // of their names, likewise
)

// watchers are the polled watchers (CreateWatcher): a watch of the
// sandbox service each, its events kept until polled.
type watchers struct {
	mu sync.Mutex
	m  map[string]*watcher // by watcher id
}

type watcher struct {
	t      Target
	cancel context.CancelFunc
	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	bytes  int   // of the events' names
	lost   bool  // events were dropped past maxPolledEvents or maxPolledBytes
	err    error // why the watch ended, once it did
	ended  bool
}

func newWatchers() *watchers { return &watchers{m: map[string]*watcher{}} }

// of is watcher id of t's sandbox, made by its tenant.
func (ws *watchers) of(t Target, id string) (*watcher, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.m[id]
	if !ok || w.t.ID != t.ID || w.t.Principal.ID != t.Principal.ID {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no watcher %q", id))
	}
	return w, nil
}

func (f *files) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	t, user, err := callOf(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetIncludeEntry() {
		return nil, errIncludeEntry
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	// The watch outlives this call: it ends when removed.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &watcher{t: t, cancel: cancel}
	ws := f.h.watchers
	ws.mu.Lock()
	n := 0
	for _, o := range ws.m {
		if o.t.ID == t.ID {
			n++
		}
	}
	if n >= maxWatchersPerSandbox {
		ws.mu.Unlock()
		cancel()
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("sandbox %s has %d watchers, its most: remove one", t.ID, n))
	}
	ws.m[id] = w
	ws.mu.Unlock()
	started := make(chan struct{})
	go func() {
		var once sync.Once
		var tr writes
		err := f.h.svc.WatchRelative(wctx, t.Principal, t.ID, req.Msg.GetPath(), user, req.Msg.GetRecursive(), func(ev *api.WatchEvent) error {
			if ev.Op == "start" {
				once.Do(func() { close(started) })
				return nil
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			for _, e := range tr.events(ev) {
				if len(w.events) >= maxPolledEvents || w.bytes+len(e.Name) > maxPolledBytes {
					w.lost = true
					return nil
				}
				w.events = append(w.events, e)
				w.bytes += len(e.Name)
			}
			return nil
		})
		cancel()
		ws.remove(id) // polled from now on: not found
		w.mu.Lock()
		w.ended, w.err = true, err
		w.mu.Unlock()
		once.Do(func() { close(started) })
	}()
	<-started
	w.mu.Lock()
	ended, werr := w.ended, w.err
	w.mu.Unlock()
	if ended {
		if werr == nil {
			werr = errors.New("the watch ended")
		}
		return nil, connectErr(werr)
	}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents returns the events since the last poll (an error once
// when some were lost). A watch that ended (its sandbox did) is gone.
func (f *files) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	t, err := target(ctx)
	if err != nil {
		return nil, connectErr(err)
	}
	w, err := f.h.watchers.of(t, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.events
	w.events, w.bytes = nil, 0
	if len(evs) == 0 && w.lost {
		w.lost = false
		return nil, connect.NewError(connect.CodeDataLoss, fmt.Errorf("more than %d events (or %d bytes of names) between polls: some were lost", maxPolledEvents, maxPolledBytes))
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *files) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	t, err := target(ctx)
	if err != nil {
		return nil, connectErr(err)
	}
	w, err := f.h.watchers.of(t, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.cancel()
	f.h.watchers.remove(req.Msg.GetWatcherId())
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

func (ws *watchers) remove(id string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	delete(ws.m, id)
}
