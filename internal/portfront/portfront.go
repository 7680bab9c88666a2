// Package portfront serves a sandbox's TCP servers over HTTP: a reverse
// proxy (HTTP and WebSocket) to a port inside a sandbox, a raw tunnel
// for port forwarding, and the port tokens a tenant mints so that a
// browser can reach one port of one sandbox until a time. Every
// connection goes through the sandbox service's DialPort
// (internal/sandbox/ports), which checks the tenant, the sandbox's state
// and records it. Both the daemon's API (internal/httpapi:
// /v1/sandboxes/{id}/ports/{port}/...) and the E2B front
// (<port>-<id>.<domain>) serve through it. It imports api, the service
// (internal/sandbox, its core and ports), internal/tenant, the broker's
// key type (internal/broker/keys: the MAC that signs tokens, from a key
// file of its own) and internal/errdefs.
package portfront

import (
	"context"
	"crypto/hmac"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/sandbox/ports"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Where a request carries a port token: a query parameter (a link a
// browser opens), a header, or a cookie (for a front that gives each
// sandbox port an origin of its own and keeps a token there, such as the
// E2B front's <port>-<id>.<domain>; never set on the API's one origin,
// where one sandbox's page could send another's). Proxy removes all
// three, and each door the tenant's key, before the request reaches the
// sandbox.
const (
	TokenParam  = "airlock_token"
	TokenHeader = "X-Airlock-Port-Token"
	TokenCookie = "airlock_port_token"
)

// Upgrade is the protocol of a raw tunnel (GET
// /v1/sandboxes/{id}/tunnel/{port} with Upgrade: airlock-port): after 101
// the connection carries one TCP connection's bytes.
const Upgrade = "airlock-port"

// Token lifetimes.
const (
	DefaultTokenTTL = time.Hour
	MaxTokenTTL     = 7 * 24 * time.Hour
)

// tokenVersion prefixes every token; the MAC's payload names it too.
const tokenVersion = "pt1"

// Config is what the front works with.
type Config struct {
	Sandboxes *sandbox.Service
	// Tenant signs a token's tenant in as it is now (tenant.Service.ByID):
	// a deleted tenant's tokens stop working.
	Tenant func(ctx context.Context, id string) (*tenant.Principal, error)
	// Keys sign and check tokens (a key file of its own beside the
	// database: tokens outlive a restart).
	Keys *keys.Keys
	// Refuse answers an error the way of the door (httpapi.WriteError).
	Refuse func(http.ResponseWriter, error)
	Now    func() time.Time
	Log    *slog.Logger
}

// Ports is the front.
type Ports struct{ cfg Config }

// New makes the front.
func New(cfg Config) *Ports {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Ports{cfg: cfg}
}

// NotFound is what every refusal of a token or a port says: exactly what
// a missing sandbox says.
func NotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "no sandbox "+core.QuoteID(id))
}

// Mint makes a token for port of sandbox id (t's own, or any for the
// admin), valid for ttl (0: DefaultTokenTTL). The token is bound to the
// sandbox's tenant, the sandbox and the port.
func (p *Ports) Mint(t *tenant.Principal, id string, port int, ttl time.Duration) (string, time.Time, error) {
	switch {
	case ttl == 0:
		ttl = DefaultTokenTTL
	case ttl < 0 || ttl > MaxTokenTTL:
		return "", time.Time{}, errdefs.Invalid("ttl: want a duration up to " + MaxTokenTTL.String())
	}
	if port < 1 || port > 65535 {
		return "", time.Time{}, NotFound(id)
	}
	b, err := p.cfg.Sandboxes.Find(t, id)
	if err != nil {
		return "", time.Time{}, err
	}
	b.Mu.Lock()
	owner := b.Rec.Tenant
	b.Mu.Unlock()
	exp := p.cfg.Now().Add(ttl).Truncate(time.Second)
	return p.token(owner, id, port, exp), exp, nil
}

// token is the token of tenant owner for port of sandbox id until exp.
func (p *Ports) token(owner, id string, port int, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	return tokenVersion + "." + owner + "." + e + "." + base64.RawURLEncoding.EncodeToString(p.mac(owner, id, port, e))
}

// mac is a token's MAC: its tenant, sandbox, port and expiry.
func (p *Ports) mac(tenantID, id string, port int, exp string) []byte {
	return p.cfg.Keys.Sign("airlock port token\n" + tokenVersion + "\n" + tenantID + "\n" + id + "\n" + strconv.Itoa(port) + "\n" + exp)
}

// check is the tenant of token tok for port of sandbox id, signed in
// now; any fault (malformed, forged, for another sandbox or port,
// expired, its tenant deleted) is notFound.
func (p *Ports) check(ctx context.Context, tok, id string, port int) (*tenant.Principal, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 4 || parts[0] != tokenVersion || len(tok) > 512 {
		return nil, NotFound(id)
	}
	owner, e, sig := parts[1], parts[2], parts[3]
	// Strict: one spelling per token (a last character that differs only
	// in its unused bits is another token, and refused).
	mac, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil || !hmac.Equal(mac, p.mac(owner, id, port, e)) {
		return nil, NotFound(id)
	}
	exp, err := strconv.ParseInt(e, 10, 64)
	if err != nil || !p.cfg.Now().Before(time.Unix(exp, 0)) {
		return nil, NotFound(id)
	}
	t, err := p.cfg.Tenant(ctx, owner)
	if err != nil {
		return nil, NotFound(id)
	}
	return t, nil
}

// TokenOf is the port token r carries, and whether it came in the query.
func TokenOf(r *http.Request) (tok string, inQuery bool) {
	if v := r.URL.Query().Get(TokenParam); v != "" {
		return v, true
	}
	if v := r.Header.Get(TokenHeader); v != "" {
		return v, false
	}
	if c, err := r.Cookie(TokenCookie); err == nil {
		return c.Value, false
	}
	return "", false
}

// Authorize signs in the caller of r to port of sandbox id by the port
// token it carries; with none, key signs it in (nil: no other way in).
// auth says which it was ("token", "key").
func (p *Ports) Authorize(r *http.Request, id string, port int, key func(r *http.Request) (*tenant.Principal, error)) (t *tenant.Principal, auth string, err error) {
	if tok, _ := TokenOf(r); tok != "" {
		t, err := p.check(r.Context(), tok, id, port)
		return t, "token", err
	}
	if key == nil {
		return nil, "", NotFound(id)
	}
	t, err = key(r)
	return t, "key", err
}

// Proxy forwards r (HTTP, or a WebSocket or other Upgrade) to port of
// sandbox id as caller t, one connection to the sandbox per request
// (each recorded), its path and query as they are (a door that routes by
// path strips its own prefix first). The port token is removed wherever
// it is, and any of airlock's keys and tokens or an E2B-shaped key in
// Authorization, X-API-Key or X-Access-Token; the door also removes the
// key it signed the caller in with (each door has its own key headers).
// Host is kept, X-Forwarded-* are set; the answer loses what shield says.
func (p *Ports) Proxy(w http.ResponseWriter, r *http.Request, t *tenant.Principal, id string, port int, via ports.Via) {
	var dialErr error
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := p.cfg.Sandboxes.DialPort(ctx, t, id, port, via)
			dialErr = err
			return c, err
		},
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: 1 << 20,
		ResponseHeaderTimeout:  0,
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "sandbox"
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			scrub(pr.Out)
		},
		Transport:      tr,
		ModifyResponse: shield(via.Door),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if dialErr != nil {
				err = dialErr
			} else if !errors.Is(err, context.Canceled) {
				err = errdefs.Unavailable("port " + strconv.Itoa(port) + " of sandbox " + id + ": " + err.Error())
			}
			p.cfg.Refuse(w, err)
		},
	}
	rp.ServeHTTP(w, r)
}

// shield is what an answer of a sandbox's server loses on its way
// through door: on the API's ("api"), where every sandbox's ports share
// the daemon's origin, Service-Worker-Allowed, so that a page of one
// sandbox cannot install a service worker over the whole origin (it would
// see every request the browser makes there: other sandboxes' pages and
// their token URLs).
func shield(door string) func(*http.Response) error {
	return func(res *http.Response) error {
		if door == "api" {
			res.Header.Del("Service-Worker-Allowed")
		}
		return nil
	}
}

// scrub removes the front's credentials from a request bound for a
// sandbox: the port token wherever it is, and any of airlock's keys and
// tokens or an E2B-shaped key beside it (a client such as
// client.PortClient sends its key with a token URL too); the door removes
// the key that signed the caller in.
func scrub(out *http.Request) {
	if a, _ := strings.CutPrefix(out.Header.Get("Authorization"), "Bearer "); credential(a) {
		out.Header.Del("Authorization")
	}
	// The E2B front's: its key header, and envd's access token (which
	// opens the sandbox's ports too).
	for _, h := range []string{"X-API-Key", "X-Access-Token"} {
		if slices.ContainsFunc(out.Header.Values(h), credential) {
			out.Header.Del(h)
		}
	}
	out.Header.Del(TokenHeader)
	if out.URL.RawQuery != "" {
		var kept []string
		for _, kv := range strings.Split(out.URL.RawQuery, "&") {
			k, _, _ := strings.Cut(kv, "=")
			if uk, err := url.QueryUnescape(k); err == nil && uk == TokenParam {
				continue
			}
			kept = append(kept, kv)
		}
		out.URL.RawQuery = strings.Join(kept, "&")
	}
	if cs := out.Cookies(); len(cs) > 0 {
		out.Header.Del("Cookie")
		var kept []string
		for _, c := range cs {
			if c.Name != TokenCookie {
				kept = append(kept, c.Name+"="+c.Value)
			}
		}
		if len(kept) > 0 {
			out.Header.Set("Cookie", strings.Join(kept, "; "))
		}
	}
}

// credential says v is one of airlock's keys or tokens, or an
// E2B-shaped key alias.
func credential(v string) bool {
	v = strings.TrimSpace(v)
	return strings.HasPrefix(v, "airlock_") || strings.HasPrefix(v, "e2b_")
}

// Tunnel answers a raw tunnel's request (Upgrade: airlock-port): 101,
// then the bytes of one connection to port of sandbox id, both ways, as
// caller t.
func (p *Ports) Tunnel(w http.ResponseWriter, r *http.Request, t *tenant.Principal, id string, port int, via ports.Via) {
	if r.Header.Get("Upgrade") != Upgrade {
		p.cfg.Refuse(w, errdefs.Invalid("a tunnel needs Upgrade: "+Upgrade))
		return
	}
	// Not r's context alone: the server cancels it when the client
	// half-closes, which a client may do right behind its request. The
	// agent's answer is bounded all the same.
	c, err := p.cfg.Sandboxes.DialPort(context.WithoutCancel(r.Context()), t, id, port, via)
	if err != nil {
		p.cfg.Refuse(w, err)
		return
	}
	defer c.Close()
	hc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.cfg.Refuse(w, errdefs.Invalid("a tunnel needs HTTP/1.1: "+err.Error()))
		return
	}
	defer hc.Close()
	_ = hc.SetDeadline(time.Time{})
	if _, err := io.WriteString(hc, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+Upgrade+"\r\n\r\n"); err != nil {
		return
	}
	Pipe(c, &bufConn{Conn: hc, r: brw.Reader})
}

// Pipe copies a to b and b to a until both ends are done, passing on a
// half-close where the connection has one, then closes both.
func Pipe(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(a, b)
		closeWrite(a)
		close(done)
	}()
	_, _ = io.Copy(b, a)
	closeWrite(b)
	<-done
	a.Close()
	b.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// bufConn reads through r (a hijacked connection's buffer first).
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// CloseWrite half-closes the connection underneath, when it can.
func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// PortToken is a minted token as the API answers it: url is base (the
// daemon's address as the caller reached it; "" for a path alone)
// followed by the port's root and the token.
func PortToken(base, id string, port int, tok string, exp time.Time) *api.PortToken {
	u := base + "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port) + "/?" + TokenParam + "=" + url.QueryEscape(tok)
	return &api.PortToken{Token: tok, URL: u, Expires: exp}
}
