package httpapi

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// nodeRoute is the handler of route pattern over svc, for caller p.
func nodeRoute(t *testing.T, svc *sandbox.Service, pattern string, p *tenant.Principal) http.Handler {
	t.Helper()
	h := &Handler{svc: svc}
	for _, rt := range h.nodeRoutes() {
		if rt.pattern == pattern {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := rt.h(w, r, p); err != nil {
					writeError(w, err)
				}
			})
		}
	}
	t.Fatalf("no route %s", pattern)
	return nil
}

// The node and its events are the admin key's; a heartbeat out of its
// bounds is refused; the stream says hello, beats, and when cut off ends
// with an error line, revisions rising throughout.
func TestNodeEventStream(t *testing.T) {
	svc := sandbox.New(sandbox.Config{Node: sandbox.NodeConfig{Name: "n1", Isolations: []string{"container"}}})
	admin, alice := &tenant.Principal{Admin: true}, &tenant.Principal{ID: "t_1", Tenant: "alice"}
	for _, pattern := range []string{"GET /v1/node", "GET /v1/node/events"} {
		w := httptest.NewRecorder()
		nodeRoute(t, svc, pattern, alice).ServeHTTP(w, httptest.NewRequest("GET", "/v1/node/events", nil))
		if w.Code != http.StatusForbidden {
			t.Errorf("%s with a tenant's key: HTTP %d %s", pattern, w.Code, w.Body)
		}
	}
	for _, hb := range []string{"50ms", "61s", "5", "-1s"} {
		w := httptest.NewRecorder()
		nodeRoute(t, svc, "GET /v1/node/events", admin).ServeHTTP(w, httptest.NewRequest("GET", "/v1/node/events?heartbeat="+hb, nil))
		if w.Code != http.StatusBadRequest {
			t.Errorf("heartbeat=%s: HTTP %d %s", hb, w.Code, w.Body)
		}
	}
	w := httptest.NewRecorder()
	nodeRoute(t, svc, "GET /v1/node", admin).ServeHTTP(w, httptest.NewRequest("GET", "/v1/node", nil))
	var n api.Node
	if err := json.Unmarshal(w.Body.Bytes(), &n); err != nil || n.Name != "n1" || n.Pools == nil || len(n.Isolations) != 1 {
		t.Errorf("GET /v1/node: %v %s", err, w.Body)
	}

	srv := httptest.NewServer(nodeRoute(t, svc, "GET /v1/node/events", admin))
	defer srv.Close()
	res, err := http.Get(srv.URL + "?heartbeat=100ms")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("HTTP %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(res.Body)
	var types []string
	var rev uint64
	for sc.Scan() {
		var ev api.NodeEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Rev <= rev {
			t.Errorf("%s at rev %d after %d", ev.Type, ev.Rev, rev)
		}
		rev = ev.Rev
		types = append(types, ev.Type)
		switch {
		case len(types) == 1 && (ev.Type != api.NodeEventHello || ev.Node == nil || ev.Node.Name != "n1"):
			t.Fatalf("first line %s", sc.Text())
		case ev.Type == api.NodeEventHeartbeat && len(types) == 3:
			svc.EndNodeWatches("the daemon is stopping")
		case ev.Type == api.NodeEventError && (ev.Error == nil || ev.Error.Code != api.CodeUnavailable):
			t.Errorf("last line %s", sc.Text())
		}
	}
	if len(types) != 4 || types[1] != api.NodeEventHeartbeat || types[3] != api.NodeEventError {
		t.Errorf("lines %v: want hello, two heartbeats and the error", types)
	}
	if _, _, err := svc.WatchNode(admin); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a watch after the stop: %v", err)
	}
}
