package envd

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// watchFake's watch reports the start, then the changes a sandbox's
// processes make (names as long as a path may be), then waits.
type watchFake struct {
	*fake
	changes int
	emitted chan struct{}
}

func (f *watchFake) WatchRelative(ctx context.Context, _ *tenant.Principal, _, _, _ string, _ bool, emit func(*api.WatchEvent) error) error {
	if err := emit(&api.WatchEvent{Op: "start", Path: "/w"}); err != nil {
		return err
	}
	for i := range f.changes {
		name := strings.Repeat("d/", 2000) + string(rune('a'+i%26))
		if err := emit(&api.WatchEvent{Op: "chmod", Path: name}); err != nil {
			return err
		}
	}
	close(f.emitted)
	<-ctx.Done()
	return ctx.Err()
}

// What a polled watcher keeps between polls is bounded in bytes, not in
// events alone: a sandbox whose processes make changes with long names
// while nobody polls does not make the daemon hold 10,000 paths of 4 KiB
// for each of its watchers.
func TestPolledWatcherKeepsBoundedBytes(t *testing.T) {
	f := &watchFake{fake: &fake{}, changes: 2 * maxPolledBytes / 4000, emitted: make(chan struct{})}
	h := New(f)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithTarget(r.Context(), Target{Principal: &tenant.Principal{ID: "t"}, ID: "sb"})))
	}))
	defer srv.Close()
	cl := filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL)
	ctx := context.Background()
	w, err := cl.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/w"}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = cl.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: w.Msg.GetWatcherId()}))
	}()
	<-f.emitted
	evs, err := cl.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: w.Msg.GetWatcherId()}))
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, e := range evs.Msg.GetEvents() {
		held += len(e.GetName())
	}
	if held == 0 || held > maxPolledBytes {
		t.Errorf("the watcher held %d bytes of names (%d events), want 1 to %d", held, len(evs.Msg.GetEvents()), maxPolledBytes)
	}
	if _, err := cl.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: w.Msg.GetWatcherId()})); connect.CodeOf(err) != connect.CodeDataLoss {
		t.Errorf("the next poll: %v, want data loss", err)
	}
}
