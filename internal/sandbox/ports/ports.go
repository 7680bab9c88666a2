// Package ports is the sandbox service's way in to a sandbox's servers:
// a connection to a TCP port on the sandbox's loopback, for a tenant's
// own sandbox, recorded before it is made. The sandbox's agent makes the
// connection from inside (internal/confined/agent, PortUpgrade) and
// relays its bytes over the agent's socket, one socket connection per
// TCP connection: on the container wall from the sandbox's network
// namespace, on gVisor from the Sentry's netstack, the one place a
// server listening there can be reached. Nothing listens on the host for
// the sandbox, and the sandbox gains no path out.
package ports

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/tenant"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// Ports is the service's connections to sandboxes' ports, on its Core.
type Ports struct{ *core.Core }

// New makes the connections to c's sandboxes' ports.
func New(c *core.Core) *Ports { return &Ports{c} }

// upgrade is the agent's protocol for a relayed connection
// (agent.PortUpgrade; the daemon does not import the agent).
const upgrade = "airlock-port"

// Caps on the agent's answer to a relay request: it is inside the
// sandbox, so untrusted.
const (
	maxHandshake     = 16 << 10 // the response head and an error's body
	handshakeTimeout = 15 * time.Second
)

// Via is where an inbound connection comes from, for its record: the
// door ("api", "forward", "e2b"), how the caller proved itself ("key" or
// "token") and its address.
type Via struct{ Door, Auth, Remote string }

// DialPort connects to 127.0.0.1:port inside sandbox id of tenant t,
// recording the connection (port.connect) before it is made. A port out
// of range, a missing sandbox and another tenant's are the same
// ErrNotFound; a paused sandbox is ErrFailedPrecondition; nothing
// listening on the port is ErrUnavailable. The connection half-closes
// (CloseWrite), keeps the sandbox from going idle while bytes move on
// it, and ends with the sandbox.
func (p *Ports) DialPort(ctx context.Context, t *tenant.Principal, id string, port int, via Via) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.New(errdefs.ErrNotFound, "no sandbox "+core.QuoteID(id))
	}
	b, err := p.Use(t, id)
	if err != nil {
		return nil, err
	}
	rec := record.PortConnect{Port: port, Door: via.Door, Auth: via.Auth, Remote: via.Remote}
	if err := p.Cfg.Audit.Commit(ctx, b.WhoFor(t), rec); err != nil {
		return nil, err
	}
	c, err := relay(ctx, b.Inst.Socket(), port)
	if err != nil {
		return nil, fmt.Errorf("port %d of sandbox %s: %w", port, id, err)
	}
	return &active{conn: c, now: p.Cfg.Now, touch: func(now time.Time) {
		b.Mu.Lock()
		b.Rec.LastActive = now
		b.Mu.Unlock()
	}}, nil
}

// active is a relayed connection that keeps its sandbox from going idle
// while bytes move on it (a WebSocket open for hours is use, as a
// command is), marking it at most once a second.
type active struct {
	*conn
	now   func() time.Time
	touch func(time.Time)
	last  atomic.Int64 // unix nanoseconds of the last mark
}

func (a *active) moved(n int) {
	if n == 0 {
		return
	}
	now := a.now()
	if last := a.last.Load(); now.UnixNano()-last >= int64(time.Second) && a.last.CompareAndSwap(last, now.UnixNano()) {
		a.touch(now)
	}
}

func (a *active) Read(b []byte) (int, error) {
	n, err := a.conn.Read(b)
	a.moved(n)
	return n, err
}

func (a *active) Write(b []byte) (int, error) {
	n, err := a.conn.Write(b)
	a.moved(n)
	return n, err
}

// relay asks the agent on socket for a connection to port.
func relay(ctx context.Context, socket string, port int) (*conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, errdefs.Unavailable("the sandbox's agent does not answer: " + err.Error())
	}
	uc := nc.(*net.UnixConn)
	_ = uc.SetDeadline(time.Now().Add(handshakeTimeout))
	stop := context.AfterFunc(ctx, func() { _ = uc.SetDeadline(time.Now()) })
	capped := &capReader{r: uc, n: maxHandshake}
	br := bufio.NewReader(capped)
	err = handshake(uc, br, port)
	if !stop() {
		err = errors.Join(ctx.Err(), err)
	}
	if err != nil {
		uc.Close()
		return nil, err
	}
	_ = uc.SetDeadline(time.Time{})
	capped.n = -1 // the stream is the sandbox server's, and not capped
	return &conn{Conn: uc, uc: uc, r: br}, nil
}

// handshake sends the relay request and reads the agent's answer: 101,
// or why not.
func handshake(uc *net.UnixConn, br *bufio.Reader, port int) error {
	req := "GET /airlock/port/" + strconv.Itoa(port) + " HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: " + upgrade + "\r\n\r\n"
	if _, err := io.WriteString(uc, req); err != nil {
		return errdefs.Unavailable("the sandbox's agent: " + err.Error())
	}
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return errdefs.Unavailable("the sandbox's agent: " + err.Error())
	}
	if res.StatusCode == http.StatusSwitchingProtocols && res.Header.Get("Upgrade") == upgrade {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
	msg := untrusted.QuoteText(string(body)) + " (reported by the sandbox)"
	switch res.StatusCode {
	case http.StatusBadGateway:
		return errdefs.Unavailable("nothing answers on it: " + msg)
	case http.StatusNotFound:
		return errdefs.Unavailable("the sandbox's agent relays no ports (an older airlock-init made it)")
	}
	return errdefs.New(errdefs.ErrInternal, fmt.Sprintf("the sandbox's agent answered %d: %s", res.StatusCode, msg))
}

// capReader reads at most n bytes (n < 0: no cap) from r.
type capReader struct {
	r io.Reader
	n int
}

func (c *capReader) Read(b []byte) (int, error) {
	if c.n < 0 {
		return c.r.Read(b)
	}
	if c.n == 0 {
		return 0, errors.New("the answer is too long")
	}
	if len(b) > c.n {
		b = b[:c.n]
	}
	n, err := c.r.Read(b)
	c.n -= n
	return n, err
}

// conn is a relayed connection: what the agent sent after its answer
// is in r's buffer, so every read goes through r (net.Conn is embedded as
// the interface, which promotes no WriteTo around it).
type conn struct {
	net.Conn
	uc *net.UnixConn
	r  io.Reader
}

func (c *conn) Read(b []byte) (int, error) { return c.r.Read(b) }

// CloseWrite ends what the sandbox's server reads; its answers still come.
func (c *conn) CloseWrite() error { return c.uc.CloseWrite() }
