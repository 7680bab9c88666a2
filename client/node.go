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

// Node describes the daemon's node: its capacity, what its sandboxes
// hold, its pools and audit head (admin key).
func (c *Client) Node(ctx context.Context) (*api.Node, error) {
	var out api.Node
	return &out, c.call(ctx, "GET", "/v1/node", nil, nil, &out)
}

// NodeEventStream reads the node's events.
type NodeEventStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// NodeEvents watches the node (admin key): the first event is its hello
// (the node as it is), then its changes, and a heartbeat every heartbeat
// (0: the daemon's default, 5s; it takes 100ms to 1m).
func (c *Client) NodeEvents(ctx context.Context, heartbeat time.Duration) (*NodeEventStream, error) {
	q := url.Values{}
	if heartbeat != 0 {
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

// Next returns the next event. The stream has no end: the daemon's
// error line (a watcher that fell behind, a daemon stopping) is returned
// as its *api.Error, and a stream cut otherwise as io.ErrUnexpectedEOF;
// either way, watch again (a new hello).
func (s *NodeEventStream) Next() (*api.NodeEvent, error) {
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil {
			return nil, err
		}
		return nil, io.ErrUnexpectedEOF
	}
	var ev api.NodeEvent
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return nil, fmt.Errorf("bad event from the daemon: %w", err)
	}
	if ev.Type == api.NodeEventError && ev.Error != nil {
		return nil, ev.Error
	}
	return &ev, nil
}

// Close stops watching.
func (s *NodeEventStream) Close() error { return s.body.Close() }
