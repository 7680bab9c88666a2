// Package e2bapi is airlock's E2B front: one listener that speaks E2B's
// control plane (create, connect, list, kill, timeout, pause, snapshots,
// metrics; docs/e2b.md) and routes each sandbox's own traffic — envd, the
// in-sandbox API, and the sandbox's ports — by `Host: <port>-<id>.<domain>`
// or the `E2b-Sandbox-Id` header. Every call goes through the sandbox
// service, so scanning, audit, quotas and rate limits apply as to
// airlock's own API. Callers sign in with a tenant's key (X-API-Key);
// envd requests carry the sandbox's access token (Tokens), checked here
// before envd's handler (internal/e2bapi/envd) sees the request with its
// Target. Another tenant's sandbox, a wrong token and a missing sandbox
// get one and the same answer.
package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/e2bapi/envd"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/httpapi"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// EnvdPort is the port the SDKs address envd at.
const EnvdPort = 49983

// EnvdVersion is the envd version the front claims: it turns on what
// airlock serves (recursive watch, stdin control, the default user,
// closeStdin, octet-stream uploads) and makes the SDKs refuse, with their
// own TemplateError, what it does not (file metadata, includeEntry,
// network mounts). docs/e2b.md has the table.
const EnvdVersion = "0.6.1"

// Sandboxes is what the front asks of the sandbox service
// (*sandbox.Service).
type Sandboxes interface {
	Create(ctx context.Context, t *tenant.Principal, req *api.CreateSandbox) (*api.Sandbox, error)
	Get(ctx context.Context, t *tenant.Principal, id string) (*api.Sandbox, error)
	Peek(t *tenant.Principal, id string) (*api.Sandbox, error)
	List(ctx context.Context, t *tenant.Principal) []*api.Sandbox
	Pause(ctx context.Context, t *tenant.Principal, id string) (*api.Sandbox, error)
	Resume(ctx context.Context, t *tenant.Principal, id string) (*api.Sandbox, error)
	Extend(ctx context.Context, t *tenant.Principal, id string, req *api.Extend) (*api.Sandbox, error)
	Destroy(ctx context.Context, t *tenant.Principal, id string) error
	Fork(ctx context.Context, t *tenant.Principal, id string, req *api.CreateFork) (*api.Fork, error)
	Snapshot(ctx context.Context, t *tenant.Principal, id string, req *api.CreateSnapshot) (*api.Snapshot, error)
	Snapshots(ctx context.Context, t *tenant.Principal) ([]*api.Snapshot, error)
	DeleteSnapshot(ctx context.Context, t *tenant.Principal, sid string) error
}

// Tenants signs callers in (*tenant.Service).
type Tenants interface {
	Authenticate(ctx context.Context, key, remote string) (*tenant.Principal, error)
	ByID(ctx context.Context, id string) (*tenant.Principal, error)
}

// PortProxy serves r on port of sandbox id (owned by p), a TCP server
// inside the sandbox; auth is how the caller signed in: "key" (the
// owner's), "access-token" (the sandbox's envd token) or "token" (an
// airlock port token). The front has removed its own headers from r
// (X-Access-Token, X-API-Key, the Authorization that signed the caller
// in, E2b-Sandbox-Id, E2b-Sandbox-Port); the proxy removes a port token
// (portfront.Proxy).
type PortProxy func(w http.ResponseWriter, r *http.Request, p *tenant.Principal, id string, port int, auth string)

// PortToken signs in the caller of r to port of sandbox id by the airlock
// port token r carries (portfront.Authorize); found is false when r
// carries none, p nil when the token is no good for that port.
type PortToken func(r *http.Request, id string, port int) (p *tenant.Principal, found bool)

// Config configures the front.
type Config struct {
	Sandboxes Sandboxes
	Tenants   Tenants
	Tokens    *Tokens
	// Domain is what every create and connect answers as the sandbox's
	// domain: the SDKs build envd's and the ports' hosts from it
	// (<port>-<id>.<Domain>), and without it would send a sandbox's
	// traffic to E2B's cloud.
	Domain string
	// Templates maps E2B template ids to airlock images.
	Templates map[string]string
	// AllowInternet is the operator's allow list for a create that asks
	// for the internet (allow_internet_access, allowOut 0.0.0.0/0) or says
	// nothing; empty: such a create is refused, or gets no network.
	AllowInternet []string
	// Envd serves a routed sandbox's envd (internal/e2bapi/envd), with
	// the Target in the request's context; nil: not served (501).
	Envd http.Handler
	// Ports serves a routed sandbox's other ports; nil: not served (501).
	Ports PortProxy
	// PortToken checks airlock's port tokens on a sandbox's other ports;
	// nil: none is accepted.
	PortToken PortToken
	Log       *slog.Logger
	Now       func() time.Time
}

// Front is the E2B listener's handler.
type Front struct {
	cfg Config
	mux *http.ServeMux
}

// New builds the front.
func New(cfg Config) *Front {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	f := &Front{cfg: cfg, mux: http.NewServeMux()}
	for _, rt := range f.routes() {
		f.mux.HandleFunc(rt.pattern, f.signedIn(rt.h))
	}
	return f
}

// ServeHTTP routes r: a sandbox's own traffic by host or header, the
// control plane otherwise.
func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok := f.target(r); ok {
		f.sandboxTraffic(w, r, id, port)
		return
	}
	if _, pat := f.mux.Handler(r); pat == "" {
		writeErr(w, http.StatusNotFound, "not supported by airlock: "+r.Method+" "+r.URL.Path)
		return
	}
	f.mux.ServeHTTP(w, r)
}

// target is the sandbox and port r is for: its host <port>-<id>.<domain>
// (the domain's own port, if any, aside), else its E2b-Sandbox-Id header
// (port E2b-Sandbox-Port, default envd's).
func (f *Front) target(r *http.Request) (id string, port int, ok bool) {
	if label, found := strings.CutSuffix(hostOnly(r.Host), "."+hostOnly(f.cfg.Domain)); found && hostOnly(f.cfg.Domain) != "" {
		p, id, found := strings.Cut(label, "-")
		if n, err := strconv.Atoi(p); found && err == nil && n > 0 && n < 65536 && id != "" && !strings.Contains(id, ".") {
			return id, n, true
		}
	}
	id = r.Header.Get("E2b-Sandbox-Id")
	if id == "" {
		return "", 0, false
	}
	port = EnvdPort
	if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 65535 {
			n = 0 // no sandbox listens there: answered as not running
		}
		port = n
	}
	return id, port, true
}

// hostOnly is a host[:port] without its port, lower case.
func hostOnly(hp string) string {
	if h, _, err := net.SplitHostPort(hp); err == nil {
		hp = h
	}
	return strings.ToLower(strings.TrimSuffix(hp, "."))
}

// notRunning is envd's answer for a sandbox it cannot serve; the SDKs
// read it as "not running" (isRunning() false). Every refusal of a
// sandbox's traffic — unknown, ended, another tenant's, a wrong token —
// is this one answer.
func notRunning(w http.ResponseWriter) {
	writeErr(w, http.StatusBadGateway, "sandbox not running")
}

// sandboxTraffic serves a request for port of sandbox id: envd's after
// its access token (or a /files signature), another port's after the
// owner's key or the access token.
func (f *Front) sandboxTraffic(w http.ResponseWriter, r *http.Request, id string, port int) {
	auth, ok := f.allowed(r, id, port)
	if port == 0 || !ok {
		notRunning(w)
		return
	}
	owner, sb, ok := f.owner(r.Context(), id)
	if !ok {
		notRunning(w)
		return
	}
	if err := f.autoResume(r.Context(), owner, sb); err != nil {
		f.cfg.Log.Warn("e2b: automatic resume failed", "id", id, "err", err)
		notRunning(w)
		return
	}
	if port != EnvdPort {
		if f.cfg.Ports == nil {
			writeErr(w, http.StatusNotImplemented, "this daemon does not serve sandboxes' ports")
			return
		}
		f.cfg.Ports(w, withoutCredentials(r, auth), owner, id, port, auth)
		return
	}
	if f.cfg.Envd == nil {
		writeErr(w, http.StatusNotImplemented, "this daemon does not serve envd")
		return
	}
	f.cfg.Envd.ServeHTTP(w, r.WithContext(envd.WithTarget(r.Context(), envd.Target{Principal: owner, ID: id})))
}

// allowed checks r's credentials for sandbox id, before anything looks
// the sandbox up, and says which signed the caller in: its access token;
// for envd's /files, a signature made with it instead (r then loses its
// Authorization, so that the user is the signed one); for another port,
// an airlock port token for it (which, when present, decides), else the
// key of the tenant that owns it.
func (f *Front) allowed(r *http.Request, id string, port int) (auth string, ok bool) {
	if f.cfg.Tokens.CheckEnvd(id, r.Header.Get("X-Access-Token")) {
		return "access-token", true
	}
	if port == EnvdPort {
		if r.URL.Path != "/files" || (r.Method != http.MethodGet && r.Method != http.MethodPost) {
			return "", false
		}
		q := r.URL.Query()
		op := "read"
		if r.Method == http.MethodPost {
			op = "write"
		}
		if q.Get("signature") == "" || !f.cfg.Tokens.CheckSignature(id, q.Get("path"), op, q.Get("username"), q.Get("signature"), q.Get("signature_expiration"), f.cfg.Now()) {
			return "", false
		}
		// The signed username is the one user the URL acts as: Basic
		// credentials naming another are not envd's to read.
		r.Header.Del("Authorization")
		return "signature", true
	}
	if f.cfg.PortToken != nil {
		if p, found := f.cfg.PortToken(r, id, port); found {
			return "token", p != nil && !p.Admin && f.owns(r.Context(), p, id)
		}
	}
	key := apiKey(r)
	if key == "" {
		return "", false
	}
	p, err := f.cfg.Tenants.Authenticate(r.Context(), key, r.RemoteAddr)
	return "key", err == nil && !p.Admin && f.owns(r.Context(), p, id)
}

// owns reports whether live sandbox id is p's.
func (f *Front) owns(ctx context.Context, p *tenant.Principal, id string) bool {
	owner, _, ok := f.owner(ctx, id)
	return ok && owner.ID == p.ID
}

// withoutCredentials is r, bound for a sandbox's server, without the
// front's own headers: the access token, the key (X-API-Key, and
// Authorization when it signed the caller in) and the routing headers.
// A port token is the proxy's to remove.
func withoutCredentials(r *http.Request, auth string) *http.Request {
	out := r.Clone(r.Context())
	if auth == "key" && out.Header.Get("X-API-Key") == "" {
		out.Header.Del("Authorization") // apiKey's second choice: it was the key
	}
	for _, h := range []string{"X-Access-Token", "X-API-Key", "E2b-Sandbox-Id", "E2b-Sandbox-Port"} {
		out.Header.Del(h)
	}
	return out
}

// admin is the principal the front looks sandboxes up as, to find their
// owners.
var admin = &tenant.Principal{Admin: true}

// owner is live sandbox id and the principal of the tenant that owns it.
func (f *Front) owner(ctx context.Context, id string) (*tenant.Principal, *api.Sandbox, bool) {
	sb, err := f.cfg.Sandboxes.Peek(admin, id)
	if err != nil {
		return nil, nil, false
	}
	p, err := f.cfg.Tenants.ByID(ctx, sb.TenantID)
	if err != nil {
		return nil, nil, false
	}
	return p, sb, true
}

// autoResume resumes paused sandbox id of owner when its create asked for
// it (lifecycle.autoResume), for its own traffic, and gives it the
// timeout its create asked again.
func (f *Front) autoResume(ctx context.Context, owner *tenant.Principal, sb *api.Sandbox) error {
	if sb.State != api.StatePaused || sb.Metadata[autoResumeKey] != "true" {
		return nil
	}
	id := sb.ID
	if _, err := f.cfg.Sandboxes.Resume(ctx, owner, id); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
		return err // failed precondition: resumed by another request meanwhile
	}
	secs, err := strconv.ParseInt(sb.Metadata[timeoutKey], 10, 64)
	if err != nil || secs <= 0 {
		secs = int64(defaultTimeout / time.Second)
	}
	_, err = f.cfg.Sandboxes.Extend(ctx, owner, id, &api.Extend{TTL: (time.Duration(secs) * time.Second).String()})
	return err
}

// apiKey is the key a request signs in with: E2B's X-API-Key, or
// airlock's Authorization: Bearer.
func apiKey(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return strings.TrimSpace(k)
	}
	k, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return strings.TrimSpace(k)
}

type handler func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error

// signedIn runs h for the caller r's key signs in as; h's error is the
// answer.
func (f *Front) signedIn(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := f.cfg.Tenants.Authenticate(r.Context(), apiKey(r), r.RemoteAddr)
		if err == nil {
			err = h(w, r, p)
		}
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				f.cfg.Log.Debug("e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeErr(w, statusOf(err), err.Error())
		}
	}
}

// statusOf is err's HTTP status as airlock's API has it, except where the
// SDKs read a status otherwise: a credential found in the call is the
// caller's mistake (400: InvalidArgumentError), not 422.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errdefs.ErrSecretDetected):
		return http.StatusBadRequest
	}
	return httpapi.CodeOf(err).Status()
}

// writeErr answers E2B's error body: the SDKs branch on its integer code.
func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, &errorOut{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
