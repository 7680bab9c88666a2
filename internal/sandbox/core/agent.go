package core

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// AgentProtocol is the agent protocol version this daemon speaks
// (internal/agent.Protocol). An agent answering another is not adopted.
const AgentProtocol = 2

// Caps on what the daemon accepts from an agent (it is inside the sandbox,
// so untrusted): one message (a file moves in many), and the rate of
// calls per sandbox.
const (
	maxAgentMessage = 64 << 20
	agentRate       = 2000 // calls per second per sandbox
)

// Agent talks to one sandbox's agent over its host-side socket
// (root-only; it reaches only init): its process service, its filesystem
// service and airlock's own file calls, at most Rate calls a second.
type Agent struct {
	Proc  processconnect.ProcessClient
	FS    filesystemconnect.FilesystemClient
	Files agentpbconnect.AgentClient
	tr    *http.Transport
	Rate  *Limiter
}

// NewAgent is the client of the agent listening on socket.
func NewAgent(socket string) *Agent {
	// HTTP/1.1, a connection per concurrent call: every call the daemon
	// makes is unary or server-streaming, and an agent that never decodes
	// HTTP/2 headers never builds HPACK's Huffman tree (~1 MB a sandbox).
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxResponseHeaderBytes: 64 << 10,
		MaxIdleConnsPerHost:    8,
		IdleConnTimeout:        time.Minute,
	}
	r := route{tr}
	return &Agent{
		Proc:  procClient{r},
		FS:    fsClient{r},
		Files: filesClient{r},
		tr:    tr,
		Rate:  NewLimiter(agentRate),
	}
}

// drainingTransport reads what is left of a response body before closing
// it, so that its connection goes back to the pool. A stream's caller stops
// at the message it wanted (an exec's end event) and closes it before the
// end of the stream, which follows at once; closed unread, the transport
// would drop the connection and the next call would dial the agent anew
// (and the agent accept, and set up a connection, for every exec).
type drainingTransport struct{ http.RoundTripper }

// What a close reads at most, and waits at most, before it gives up on the
// connection: an agent is inside the sandbox, and may stall or go on.
const (
	drainMax  = 64 << 10
	drainWait = time.Second
)

func (t drainingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := t.RoundTripper.RoundTrip(req)
	if err == nil {
		res.Body = &drainOnClose{res.Body}
	}
	return res, err
}

type drainOnClose struct{ io.ReadCloser }

func (b *drainOnClose) Close() error {
	stop := time.AfterFunc(drainWait, func() { b.ReadCloser.Close() })
	_, _ = io.CopyN(io.Discard, b.ReadCloser, drainMax)
	stop.Stop()
	return b.ReadCloser.Close()
}

// Close drops the client's idle connections.
func (a *Agent) Close() { a.tr.CloseIdleConnections() }

// Hello checks the agent's protocol version.
func (a *Agent) Hello(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := a.Files.Hello(ctx, connect.NewRequest(&agentpb.HelloRequest{}))
	if err != nil {
		return fmt.Errorf("%w: the sandbox's agent does not answer: %v", errdefs.ErrUnavailable, err)
	}
	if res.Msg.GetProtocol() != AgentProtocol {
		return fmt.Errorf("%w: the sandbox's agent speaks protocol %d, this daemon %d", errdefs.ErrUnavailable, res.Msg.GetProtocol(), AgentProtocol)
	}
	return nil
}

// AsUser sets the user an agent call acts as (envd's convention: the user
// name of HTTP basic authorization).
func AsUser[T any](req *connect.Request[T], user string) *connect.Request[T] {
	if user == "" {
		user = "user"
	}
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	return req
}

// AgentError classes an agent's answer. Its message came from inside the
// sandbox and says so, quoted if it holds anything a terminal would act on
// (untrusted.QuoteText).
func AgentError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	msg := ce.Message()
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	class := errdefs.ErrInternal
	switch ce.Code() {
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		class = errdefs.ErrInvalidArgument
	case connect.CodeNotFound:
		class = errdefs.ErrNotFound
	case connect.CodeAlreadyExists:
		class = errdefs.ErrAlreadyExists
	case connect.CodePermissionDenied:
		class = errdefs.ErrPermissionDenied
	case connect.CodeFailedPrecondition:
		class = errdefs.ErrFailedPrecondition
	case connect.CodeResourceExhausted:
		class = errdefs.ErrResourceExhausted
	case connect.CodeDeadlineExceeded:
		class = errdefs.ErrTimeout
	case connect.CodeUnavailable, connect.CodeCanceled:
		class = errdefs.ErrUnavailable
	case connect.CodeDataLoss:
		class = errdefs.ErrFailedPrecondition
	}
	return errdefs.New(class, untrusted.QuoteText(msg)+" (reported by the sandbox)")
}

// Limiter is a token bucket: at most rate calls per second, bursts of rate.
type Limiter struct {
	tokens chan struct{}
}

// NewLimiter is a full bucket of rate.
func NewLimiter(rate int) *Limiter {
	l := &Limiter{tokens: make(chan struct{}, rate)}
	for i := 0; i < rate; i++ {
		l.tokens <- struct{}{}
	}
	return l
}

// Refill runs once per second for every live limiter (see sandbox.Service.tick).
func (l *Limiter) Refill() {
	for {
		select {
		case l.tokens <- struct{}{}:
		default:
			return
		}
	}
}

// Take takes a call's token, or refuses the call.
func (l *Limiter) Take() error {
	select {
	case <-l.tokens:
		return nil
	default:
		return errdefs.New(errdefs.ErrResourceExhausted, "too many calls on this sandbox: slow down")
	}
}
