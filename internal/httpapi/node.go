package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Bounds of a node event stream's heartbeat.
const (
	defaultHeartbeat = 5 * time.Second
	minHeartbeat     = 100 * time.Millisecond
	maxHeartbeat     = time.Minute
	// nodeWriteTimeout is how long one line of a node event stream may
	// take to be written: a watcher that reads nothing for that long is
	// let go (its lines queue meanwhile, up to its buffer).
	nodeWriteTimeout = time.Minute
)

// nodeRoutes are the node a cluster places sandboxes on: what it holds,
// and its events (the admin key only).
func (h *Handler) nodeRoutes() []route {
	s := h.svc
	return []route{
		{"GET /v1/node", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			n, err := s.Node(p)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, n)
			return nil
		}},
		{"GET /v1/node/events", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			every := defaultHeartbeat
			if v := query(r, "heartbeat"); v != "" {
				d, err := time.ParseDuration(v)
				if err != nil || d < minHeartbeat || d > maxHeartbeat {
					return errdefs.Invalid(fmt.Sprintf("heartbeat=%q: a duration from %v to %v", v, minHeartbeat, maxHeartbeat))
				}
				every = d
			}
			hello, watch, err := s.WatchNode(p)
			if err != nil {
				return err
			}
			defer watch.Close()
			sw := &streamWriter{ResponseWriter: w}
			rc := http.NewResponseController(w)
			emit := func(ev *api.NodeEvent) error {
				// Not every writer has a deadline (tests' recorders).
				if err := rc.SetWriteDeadline(time.Now().Add(nodeWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
					return err
				}
				return sw.emit(ev)
			}
			if err := emit(hello); err != nil {
				return err
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-r.Context().Done():
					return nil
				case <-tick.C:
					watch.Heartbeat()
				case ev, ok := <-watch.Events():
					if !ok {
						// Cut off: its last line says why.
						rev, err := watch.Cut()
						return emit(&api.NodeEvent{Rev: rev, Type: api.NodeEventError, Error: &api.Error{Code: codeOf(err), Message: err.Error()}})
					}
					if err := emit(&ev); err != nil {
						return err
					}
				}
			}
		}},
	}
}
