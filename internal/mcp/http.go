package mcp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// HTTP serves MCP over streamable HTTP for airlock serve (/mcp). Every
// request carries a tenant key; a session is bound to the key that opened
// it, gets its own sandbox (from the spec its initialization names, or
// the tenant's default), and the sandbox is destroyed when the session
// ends (a DELETE, or SessionTimeout without a request).
type HTTP struct {
	Service *sandbox.Service
	Version string
	// SessionTimeout ends idle sessions; their sandboxes also get twice
	// it as idle timeout, should the session's end be missed.
	SessionTimeout time.Duration
	Log            *slog.Logger
	// Refuse answers an error the API's way.
	Refuse func(http.ResponseWriter, error)

	once   sync.Once
	stream *sdk.StreamableHTTPHandler
	mu     sync.Mutex
	owners map[string]string // session id -> SHA-256 of the key that opened it
}

type principalKey struct{}

// Serve handles one request of caller p.
func (h *HTTP) Serve(w http.ResponseWriter, r *http.Request, p *tenant.Principal) {
	h.once.Do(func() {
		h.owners = map[string]string{}
		h.stream = sdk.NewStreamableHTTPHandler(h.newSession, &sdk.StreamableHTTPOptions{SessionTimeout: h.SessionTimeout, Logger: h.Log})
	})
	if p.Admin {
		h.Refuse(w, errdefs.New(errdefs.ErrPermissionDenied, "MCP sessions belong to tenants: use a tenant's key"))
		return
	}
	kh := keyHash(r)
	if id := r.Header.Get("Mcp-Session-Id"); id != "" {
		h.mu.Lock()
		owner, ok := h.owners[id]
		h.mu.Unlock()
		if ok && owner != kh {
			h.Refuse(w, errdefs.New(errdefs.ErrNotFound, "no such MCP session for this key"))
			return
		}
	}
	ctx := context.WithValue(r.Context(), principalKey{}, p)
	h.stream.ServeHTTP(w, r.WithContext(ctx))
}

func keyHash(r *http.Request) string {
	sum := sha256.Sum256([]byte(r.Header.Get("Authorization")))
	return hex.EncodeToString(sum[:])
}

// newSession makes the server of a new session.
func (h *HTTP) newSession(r *http.Request) *sdk.Server {
	p, _ := r.Context().Value(principalKey{}).(*tenant.Principal)
	if p == nil {
		return nil
	}
	spec, err := h.Service.MCPSpec(r.Context(), p)
	if err != nil {
		h.Log.Warn("mcp: the tenant's default spec", "tenant", p.Tenant, "err", err)
		spec = &api.CreateSandbox{}
	}
	if spec.TTL == "" {
		spec.TTL = "24h"
	}
	if spec.IdleTimeout == "" && h.SessionTimeout > 0 {
		spec.IdleTimeout = (2 * h.SessionTimeout).String()
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	h.mu.Lock()
	h.owners[id] = keyHash(r)
	h.mu.Unlock()
	srv, sess := NewServer(&ServiceBackend{Service: h.Service, Principal: p}, *spec, Options{Version: h.Version, SessionID: id, EndWithSession: true})
	sess.onEnd = func() {
		h.mu.Lock()
		delete(h.owners, id)
		h.mu.Unlock()
	}
	return srv
}
