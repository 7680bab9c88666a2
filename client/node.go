package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// Node describes the daemon as a cluster node (admin key).
func (c *Client) Node(ctx context.Context) (*api.Node, error) {
	var out api.Node
	return &out, c.call(ctx, "GET", "/v1/node", nil, nil, &out)
}

// NodeEventStream reads GET /v1/node/events.
type NodeEventStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// NodeEvents opens the daemon's event stream (admin key); the first event
// is "hello" with the node, then a heartbeat every heartbeat (0: the
// daemon's default).
func (c *Client) NodeEvents(ctx context.Context, heartbeat time.Duration) (*NodeEventStream, error) {
	q := url.Values{}
	if heartbeat > 0 {
		q.Set("heartbeat", heartbeat.String())
	}
	res, err := c.request(ctx, "GET", "/v1/node/events", q, nil, "")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	return &NodeEventStream{body: res.Body, sc: sc}, nil
}

// Next returns the next event; io.EOF when the daemon ends the stream.
func (s *NodeEventStream) Next() (*api.NodeEvent, error) {
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
	var ev api.NodeEvent
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return nil, fmt.Errorf("bad node event from the daemon: %w", err)
	}
	return &ev, nil
}

// Close ends the stream.
func (s *NodeEventStream) Close() error { return s.body.Close() }

// ListSandboxes lists sandboxes by external id, or (admin key, All) every
// tenant's.
func (c *Client) ListSandboxes(ctx context.Context, f api.ListSandboxes) ([]*api.Sandbox, error) {
	q := url.Values{}
	if f.ExternalID != "" {
		q.Set("external_id", f.ExternalID)
	}
	if f.All {
		q.Set("all", "true")
	}
	var out []*api.Sandbox
	return out, c.call(ctx, "GET", "/v1/sandboxes", q, nil, &out)
}
