package egress

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
)

// Inspector looks into the requests the proxy can read, for one sandbox:
// it names the hosts whose TLS the proxy terminates (those with a grant,
// and no other), gives their certificates, and sees every readable request
// (plain HTTP, or inside an intercepted connection) before it is sent on;
// as an eventlog.Redactor it keeps credentials out of the record of each
// decision. internal/broker implements it.
type Inspector interface {
	Intercepts(host string, port int) bool
	Certificate(host string) (*tls.Certificate, error)
	Inspect(r *Inspected) Verdict
	eventlog.Redactor
}

// MaxInspectBody is how much of a request body is read and inspected
// before it is sent on; the rest streams through uninspected (the event
// says so).
const MaxInspectBody = 256 << 10

// Inspected is one request the proxy can read. Inspect may rewrite Req's
// headers and URL and replace Body.
type Inspected struct {
	Req  *http.Request
	Host string
	Port int
	// TLS: read from an intercepted TLS connection (a grant's credential
	// is never put in a request that would cross the network in clear).
	TLS bool
	// Body is the start of the body; Complete says it is all of it.
	Body     []byte
	Complete bool
}

// Verdict is what Inspect decided.
type Verdict struct {
	Refuse   string // non-empty: the request is answered 403 with this reason
	Grant    string // the grant whose credential was put in
	Findings []eventlog.Finding
}

// inspect reads the start of req's body, runs the inspector and puts the
// (possibly rewritten) body back in front of the rest.
func (p *Proxy) inspect(req *http.Request, host string, port int, viaTLS bool, ev *eventlog.Event) Verdict {
	in := &Inspected{Req: req, Host: host, Port: port, TLS: viaTLS, Complete: true}
	if req.Body != nil && req.Body != http.NoBody {
		buf, err := io.ReadAll(io.LimitReader(req.Body, MaxInspectBody+1))
		if err != nil {
			return Verdict{Refuse: "request body unreadable: " + err.Error()}
		}
		in.Complete = len(buf) <= MaxInspectBody
		if !in.Complete {
			buf = buf[:MaxInspectBody]
		}
		in.Body = buf
	}
	// Request trailers arrive after the body, past what the inspector is
	// shown: none is sent on. (The request sent on is a clone of req made
	// now; trailers read later land in req, not in the clone.)
	req.Trailer = nil
	v := p.cfg.Inspector.Inspect(in)
	if req.Body != nil && req.Body != http.NoBody {
		rest := req.Body
		if in.Complete {
			req.Body = io.NopCloser(bytes.NewReader(in.Body))
			req.ContentLength = int64(len(in.Body))
			rest.Close()
		} else {
			req.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(in.Body), rest), rest}
			req.ContentLength = -1
			ev.Reason = "body past 256 KiB not inspected"
		}
	}
	ev.Grant, ev.Findings = v.Grant, v.Findings
	return v
}
