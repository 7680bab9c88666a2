// Package httpapi is the daemon's HTTP API (docs/api.md) over
// sandbox.Service, tenant.Service and secret.Store: routing, API-key authentication, strict JSON decoding,
// body caps, NDJSON streams, and the one mapping from error classes
// (errdefs) to API codes and HTTP statuses.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/portfront"
	"github.com/airlock-sandbox/airlock/internal/progress"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandbox/ports"
	"github.com/airlock-sandbox/airlock/internal/secret"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Body caps.
const (
	maxJSON = 1 << 20
)

// Handler serves the API.
type Handler struct {
	svc     *sandbox.Service
	tenants *tenant.Service
	secrets *secret.Store
	log     *slog.Logger
	metrics http.Handler
	ports   *portfront.Ports
	mux     *http.ServeMux
}

type route struct {
	pattern string
	auth    bool
	h       func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error
}

// New builds the handler over the sandboxes, the tenants (who signs
// every request in), the secrets and the front of sandboxes' ports;
// metrics serves /metrics (admin key required).
func New(svc *sandbox.Service, tenants *tenant.Service, secrets *secret.Store, ports *portfront.Ports, log *slog.Logger, metrics http.Handler) *Handler {
	h := &Handler{svc: svc, tenants: tenants, secrets: secrets, ports: ports, log: log, metrics: metrics, mux: http.NewServeMux()}
	for _, rt := range h.routes() {
		rt := rt
		h.mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			var p *tenant.Principal
			if rt.auth {
				var err error
				if p, err = h.authenticate(r); err != nil {
					writeError(w, err)
					return
				}
			}
			tw := &trackWriter{ResponseWriter: w}
			if err := rt.h(tw, r, p); err != nil {
				if tw.wrote {
					return // mid-stream: the client sees the stream cut short
				}
				if !errors.Is(err, context.Canceled) {
					h.log.Debug("request failed", "route", rt.pattern, "err", err)
				}
				writeError(tw, err)
			}
		})
	}
	return h
}

// Mount serves fn at pattern (every method) behind the API's key check,
// with the caller: for protocols of their own over the same listeners
// (MCP at /mcp).
func (h *Handler) Mount(pattern string, fn func(w http.ResponseWriter, r *http.Request, p *tenant.Principal)) {
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		p, err := h.authenticate(r)
		if err != nil {
			writeError(w, err)
			return
		}
		fn(w, r, p)
	})
}

// authenticate signs in the caller of r by its key.
func (h *Handler) authenticate(r *http.Request) (*tenant.Principal, error) {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return h.tenants.Authenticate(r.Context(), strings.TrimSpace(key), r.RemoteAddr)
}

// WriteError answers err the API's way (its code, HTTP status and message).
func WriteError(w http.ResponseWriter, err error) { writeError(w, err) }

// Routes lists every route pattern ("METHOD /path"; "ANY /path" for a
// route of every method), for documentation checks.
func (h *Handler) Routes() []string {
	var out []string
	for _, rt := range h.routes() {
		if strings.HasPrefix(rt.pattern, "/") {
			out = append(out, "ANY "+rt.pattern)
			continue
		}
		out = append(out, rt.pattern)
	}
	return out
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pat := h.mux.Handler(r); pat == "" {
		// Not a route, or not this method: JSON errors too.
		rec := &statusRecorder{header: http.Header{}}
		h.mux.ServeHTTP(rec, r)
		if rec.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", rec.header.Get("Allow"))
			writeJSON(w, http.StatusMethodNotAllowed, &api.Error{Code: api.CodeInvalidArgument, Message: r.Method + " is not allowed on " + r.URL.Path})
			return
		}
		writeJSON(w, http.StatusNotFound, &api.Error{Code: api.CodeNotFound, Message: "no such route: " + r.Method + " " + r.URL.Path})
		return
	}
	h.mux.ServeHTTP(w, r)
}

// trackWriter remembers whether the reply has started.
type trackWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackWriter) WriteHeader(code int) { t.wrote = true; t.ResponseWriter.WriteHeader(code) }
func (t *trackWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}
func (t *trackWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.status = code }

// classes maps error classes to API codes: the one place it is done.
var classes = []struct {
	class error
	code  api.Code
}{
	{errdefs.ErrInvalidArgument, api.CodeInvalidArgument},
	{errdefs.ErrUnauthenticated, api.CodeUnauthenticated},
	{errdefs.ErrPermissionDenied, api.CodePermissionDenied},
	{errdefs.ErrNotFound, api.CodeNotFound},
	{errdefs.ErrAlreadyExists, api.CodeAlreadyExists},
	{errdefs.ErrFailedPrecondition, api.CodeFailedPrecondition},
	{errdefs.ErrTooLarge, api.CodeTooLarge},
	{errdefs.ErrResourceExhausted, api.CodeQuotaExceeded},
	{errdefs.ErrUnavailable, api.CodeUnavailable},
	{errdefs.ErrTimeout, api.CodeTimeout},
	{errdefs.ErrSecretDetected, api.CodeSecretDetected},
	{errdefs.ErrInternal, api.CodeInternal},
}

// codeOf is the API code of err.
// CodeOf is err's API code: the one mapping of error classes, for the
// other fronts (internal/e2bapi) too.
func CodeOf(err error) api.Code { return codeOf(err) }

func codeOf(err error) api.Code {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return api.CodeTooLarge
	}
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.code
		}
	}
	return api.CodeInternal
}

func writeError(w http.ResponseWriter, err error) {
	code := codeOf(err)
	msg := err.Error()
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		msg = fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
	}
	writeJSON(w, code.Status(), &api.Error{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decode reads one JSON object, refusing unknown fields, trailing data
// and bodies over maxJSON.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		if len(ct) > 64 { // the caller's header, echoed: a bounded piece of it
			ct = ct[:64] + "..."
		}
		return errdefs.Invalid(fmt.Sprintf("Content-Type must be application/json, not %q (curl -d sends a form type: add -H 'Content-Type: application/json')", ct))
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if err == io.EOF {
			return errdefs.Invalid("request body is empty: send a JSON object")
		}
		return errdefs.Invalid("bad JSON: " + err.Error())
	}
	if dec.More() {
		return errdefs.Invalid("bad JSON: data after the object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errdefs.Invalid("bad JSON: data after the object")
	}
	return nil
}

// streamWriter writes NDJSON events, flushing each; the status line goes
// out with the first event, so an error before it is a normal error reply.
type streamWriter struct {
	http.ResponseWriter
	started bool
}

func (s *streamWriter) emit(v any) error {
	if !s.started {
		s.started = true
		s.Header().Set("Content-Type", "application/x-ndjson")
		s.WriteHeader(http.StatusOK)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := s.Write(append(b, '\n')); err != nil {
		return err
	}
	return http.NewResponseController(s.ResponseWriter).Flush()
}

// progressStream runs work with its progress sent as NDJSON events as it
// comes, then its result; an error before the first event is a normal
// error reply, one after it the stream's last event. line makes an event
// of a report, a result or an error (one of the three set).
func progressStream[T any](w http.ResponseWriter, r *http.Request, work func(context.Context) (*T, error), line func(*api.Progress, *T, *api.Error) any) error {
	sw := &streamWriter{ResponseWriter: w}
	var mu sync.Mutex
	emit := func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		_ = sw.emit(ev) // a caller gone is seen by the work's context
	}
	res, err := work(progress.With(r.Context(), func(e progress.Event) {
		emit(line(&api.Progress{Op: e.Op, Subject: e.Subject, Message: e.Message, Stays: e.Stays, Layer: e.Layer, Layers: e.Layers, Bytes: e.Bytes, Total: e.Total, Done: e.Done}, nil, nil))
	}))
	mu.Lock()
	started := sw.started
	mu.Unlock()
	switch {
	case err != nil && !started:
		return err
	case err != nil:
		emit(line(nil, nil, &api.Error{Code: codeOf(err), Message: err.Error()}))
	default:
		emit(line(nil, res, nil))
	}
	return nil
}

// createStream runs create with its progress streamed (progressStream).
func createStream(w http.ResponseWriter, r *http.Request, create func(context.Context) (*api.Sandbox, error)) error {
	return progressStream(w, r, create, func(p *api.Progress, sb *api.Sandbox, e *api.Error) any {
		return &api.CreateEvent{Progress: p, Sandbox: sb, Error: e}
	})
}

// snapshotStream runs a snapshot with its progress streamed
// (progressStream).
func snapshotStream(w http.ResponseWriter, r *http.Request, save func(context.Context) (*api.Snapshot, error)) error {
	return progressStream(w, r, save, func(p *api.Progress, sn *api.Snapshot, e *api.Error) any {
		return &api.SnapshotEvent{Progress: p, Snapshot: sn, Error: e}
	})
}

// lazyWriter sends the status line and headers with the first byte, so an
// error before any data is a normal error reply.
type lazyWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
}

func (l *lazyWriter) Write(b []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", l.contentType)
		l.w.WriteHeader(http.StatusOK)
	}
	return l.w.Write(b)
}

func (l *lazyWriter) finish() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", l.contentType)
		l.w.WriteHeader(http.StatusOK)
	}
}

func query(r *http.Request, name string) string { return r.URL.Query().Get(name) }

func queryInt(r *http.Request, name string, def int) (int, error) {
	v := query(r, name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errdefs.Invalid(fmt.Sprintf("%s=%q: not a number", name, v))
	}
	return n, nil
}

func queryBool(r *http.Request, name string) (bool, error) {
	v := query(r, name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.Invalid(fmt.Sprintf("%s=%q: want true or false", name, v))
	}
	return b, nil
}

func pid(r *http.Request) (uint32, error) {
	n, err := strconv.ParseUint(r.PathValue("pid"), 10, 32)
	if err != nil || n == 0 {
		return 0, errdefs.Invalid(fmt.Sprintf("pid %q: not a process id", r.PathValue("pid")))
	}
	return uint32(n), nil
}

// routes is every route of the API, one group per resource.
func (h *Handler) routes() []route {
	return slices.Concat(h.daemonRoutes(), h.nodeRoutes(), h.auditRoutes(), h.tenantRoutes(), h.mcpSpecRoutes(), h.secretRoutes(), h.poolRoutes(),
		h.sandboxRoutes(), h.processRoutes(), h.fileRoutes(), h.workspaceRoutes(), h.snapshotRoutes(), h.portRoutes())
}

// id is the sandbox (or snapshot) a route names.
func id(r *http.Request) string { return r.PathValue("id") }

// daemonRoutes are the daemon's own: health and metrics.
func (h *Handler) daemonRoutes() []route {
	return []route{
		{"GET /v1/health", false, func(w http.ResponseWriter, r *http.Request, _ *tenant.Principal) error {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
			return nil
		}},
		{"GET /metrics", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			if !p.Admin {
				return errdefs.New(errdefs.ErrPermissionDenied, "metrics need the admin key")
			}
			h.metrics.ServeHTTP(w, r)
			return nil
		}},
	}
}

// auditRoutes are the audit log, as far as the caller may read it.
func (h *Handler) auditRoutes() []route {
	s := h.svc
	return []route{
		{"GET /v1/audit", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			f := sandbox.AuditFilter{Sandbox: query(r, "sandbox"), Kind: query(r, "kind"), Trigger: query(r, "trigger")}
			if v := query(r, "since"); v != "" {
				t, err := time.Parse(time.RFC3339, v)
				if err != nil {
					return errdefs.Invalid("since: want an RFC 3339 time")
				}
				f.Since = t
			}
			sw := &streamWriter{ResponseWriter: w}
			if err := s.AuditRecords(r.Context(), p, f, func(rec *audit.Record) error { return sw.emit(rec) }); err != nil {
				return err
			}
			if !sw.started {
				sw.Header().Set("Content-Type", "application/x-ndjson")
				sw.WriteHeader(http.StatusOK)
			}
			return nil
		}},
	}
}

// tenantRoutes are tenants and their keys.
func (h *Handler) tenantRoutes() []route {
	return []route{
		{"POST /v1/tenants", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.CreateTenant
			if err := decode(w, r, &req); err != nil {
				return err
			}
			t, err := h.tenants.Create(r.Context(), p, &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, t)
			return nil
		}},
		{"GET /v1/tenants", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			ts, err := h.tenants.List(r.Context(), p)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, ts)
			return nil
		}},
		{"PATCH /v1/tenants/{name}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.UpdateTenant
			if err := decode(w, r, &req); err != nil {
				return err
			}
			t, err := h.tenants.Update(r.Context(), p, r.PathValue("name"), &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, t)
			return nil
		}},
		{"POST /v1/tenants/{name}/e2b-key", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			k, err := h.tenants.E2BKey(r.Context(), p, r.PathValue("name"))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, k)
			return nil
		}},
		{"DELETE /v1/tenants/{name}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			if err := h.tenants.Delete(r.Context(), p, r.PathValue("name")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	}
}

// mcpSpecRoutes are the spec of the sandboxes /mcp makes for a tenant.
func (h *Handler) mcpSpecRoutes() []route {
	s := h.svc
	return []route{
		{"GET /v1/mcp/spec", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			spec, err := s.MCPSpec(r.Context(), p)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, spec)
			return nil
		}},
		{"PUT /v1/mcp/spec", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.CreateSandbox
			if err := decode(w, r, &req); err != nil {
				return err
			}
			if err := s.SetMCPSpec(r.Context(), p, &req); err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, &req)
			return nil
		}},
	}
}

// secretRoutes are a tenant's secrets.
func (h *Handler) secretRoutes() []route {
	return []route{
		{"POST /v1/secrets", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.AddSecret
			if err := decode(w, r, &req); err != nil {
				return err
			}
			sec, err := h.secrets.Add(r.Context(), p, &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, sec)
			return nil
		}},
		{"GET /v1/secrets", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			ss, err := h.secrets.List(r.Context(), p)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, ss)
			return nil
		}},
		{"PUT /v1/secrets/{name}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.RotateSecret
			if err := decode(w, r, &req); err != nil {
				return err
			}
			sec, err := h.secrets.Rotate(r.Context(), p, r.PathValue("name"), &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sec)
			return nil
		}},
		{"DELETE /v1/secrets/{name}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			if err := h.secrets.Remove(r.Context(), p, r.PathValue("name")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	}
}

// poolRoutes are the caller's warm pools.
func (h *Handler) poolRoutes() []route {
	return []route{
		{"PUT /v1/pools/{name}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.SetPool
			if err := decode(w, r, &req); err != nil {
				return err
			}
			pl, err := h.svc.SetPool(r.Context(), p, r.PathValue("name"), &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, pl)
			return nil
		}},
		{"GET /v1/pools", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			writeJSON(w, http.StatusOK, h.svc.Pools(r.Context(), p))
			return nil
		}},
		{"GET /v1/pools/{name}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			pl, err := h.svc.Pool(r.Context(), p, r.PathValue("name"))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, pl)
			return nil
		}},
		{"DELETE /v1/pools/{name}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			if err := h.svc.DeletePool(r.Context(), p, r.PathValue("name")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	}
}

// sandboxRoutes are sandboxes' lifecycle and the kill switch.
func (h *Handler) sandboxRoutes() []route {
	s := h.svc
	return []route{
		{"POST /v1/kill-all", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.KillAll
			if err := decode(w, r, &req); err != nil {
				return err
			}
			if p.Admin && req.Tenant == "" && query(r, "all") != "true" {
				return errdefs.Invalid(`the admin's kill switch needs a tenant, or ?all=true to destroy every sandbox of every tenant`)
			}
			ids, err := s.KillAll(r.Context(), p, req.Tenant)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, &api.Killed{Destroyed: ids})
			return nil
		}},
		{"POST /v1/sandboxes", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.CreateSandbox
			if err := decode(w, r, &req); err != nil {
				return err
			}
			stream, err := queryBool(r, "progress")
			if err != nil {
				return err
			}
			if stream {
				return createStream(w, r, func(ctx context.Context) (*api.Sandbox, error) { return s.Create(ctx, p, &req) })
			}
			sb, existed, err := s.CreateOnce(r.Context(), p, &req)
			if err != nil {
				return err
			}
			status := http.StatusCreated
			if existed {
				status = http.StatusOK // its external id's sandbox: nothing made
			}
			writeJSON(w, status, sb)
			return nil
		}},
		{"GET /v1/sandboxes", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			all, err := queryBool(r, "all")
			if err != nil {
				return err
			}
			sbs, err := s.ListSandboxes(r.Context(), p, api.ListSandboxes{ExternalID: query(r, "external_id"), All: all})
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sbs)
			return nil
		}},
		{"GET /v1/sandboxes/{id}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			sb, err := s.Get(r.Context(), p, id(r))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sb)
			return nil
		}},
		{"DELETE /v1/sandboxes/{id}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			if err := s.Destroy(r.Context(), p, id(r)); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/pause", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			sb, err := s.Pause(r.Context(), p, id(r))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sb)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/resume", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			sb, err := s.Resume(r.Context(), p, id(r))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sb)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/extend", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.Extend
			if err := decode(w, r, &req); err != nil {
				return err
			}
			sb, err := s.Extend(r.Context(), p, id(r), &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sb)
			return nil
		}},
	}
}

// processRoutes are commands in a sandbox: exec and its processes.
func (h *Handler) processRoutes() []route {
	s := h.svc
	return []route{
		{"POST /v1/sandboxes/{id}/exec", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.Exec
			if err := decode(w, r, &req); err != nil {
				return err
			}
			sw := &streamWriter{ResponseWriter: w}
			return s.Exec(r.Context(), p, id(r), &req, func(ev *api.ExecEvent) error { return sw.emit(ev) })
		}},
		{"GET /v1/sandboxes/{id}/processes", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			ps, err := s.Processes(r.Context(), p, id(r))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, ps)
			return nil
		}},
		{"GET /v1/sandboxes/{id}/processes/{pid}/stream", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			n, err := pid(r)
			if err != nil {
				return err
			}
			sw := &streamWriter{ResponseWriter: w}
			return s.Attach(r.Context(), p, id(r), n, func(ev *api.ExecEvent) error { return sw.emit(ev) })
		}},
		{"GET /v1/sandboxes/{id}/processes/{pid}/logs", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			n, err := pid(r)
			if err != nil {
				return err
			}
			follow, err := queryBool(r, "follow")
			if err != nil {
				return err
			}
			sw := &streamWriter{ResponseWriter: w}
			return s.Logs(r.Context(), p, id(r), n, follow, func(ev *api.ExecEvent) error { return sw.emit(ev) })
		}},
		{"POST /v1/sandboxes/{id}/processes/{pid}/input", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			n, err := pid(r)
			if err != nil {
				return err
			}
			var req api.Input
			if err := decode(w, r, &req); err != nil {
				return err
			}
			if err := s.Input(r.Context(), p, id(r), n, &req); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/processes/{pid}/signal", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			n, err := pid(r)
			if err != nil {
				return err
			}
			var req api.Signal
			if err := decode(w, r, &req); err != nil {
				return err
			}
			if err := s.Signal(r.Context(), p, id(r), n, req.Signal); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/processes/{pid}/resize", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			n, err := pid(r)
			if err != nil {
				return err
			}
			var req api.TTY
			if err := decode(w, r, &req); err != nil {
				return err
			}
			if err := s.Resize(r.Context(), p, id(r), n, &req); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	}
}

// fileRoutes are a sandbox's files and directories.
func (h *Handler) fileRoutes() []route {
	s := h.svc
	return []route{
		{"GET /v1/sandboxes/{id}/files", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			max, err := queryInt(r, "max_bytes", 0)
			if err != nil {
				return err
			}
			// A file is streamed: an error after its first byte cuts the
			// reply short (the client sees it broken), never appends to it.
			lw := &lazyWriter{w: w, contentType: "application/octet-stream"}
			return cutShort(lw, s.ReadFile(r.Context(), p, id(r), query(r, "path"), query(r, "user"), lw, int64(max)))
		}},
		{"PUT /v1/sandboxes/{id}/files", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			mode := fs.FileMode(0o644)
			if m := query(r, "mode"); m != "" {
				n, err := strconv.ParseUint(m, 8, 32)
				if err != nil || n > 0o777 {
					return errdefs.Invalid(fmt.Sprintf("mode=%q: want octal permissions such as 644", m))
				}
				mode = fs.FileMode(n)
			}
			parents, err := queryBool(r, "parents")
			if err != nil {
				return err
			}
			if err := s.WriteFile(r.Context(), p, id(r), query(r, "path"), query(r, "user"), mode, r.Body, parents); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
		{"DELETE /v1/sandboxes/{id}/files", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			if err := s.Remove(r.Context(), p, id(r), query(r, "path"), query(r, "user")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
		{"GET /v1/sandboxes/{id}/stat", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			e, err := s.Stat(r.Context(), p, id(r), query(r, "path"), query(r, "user"))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, e)
			return nil
		}},
		{"GET /v1/sandboxes/{id}/dir", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			depth, err := queryInt(r, "depth", 1)
			if err != nil {
				return err
			}
			es, err := s.ListDir(r.Context(), p, id(r), query(r, "path"), query(r, "user"), depth)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, es)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/mkdir", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.MakeDir
			if err := decode(w, r, &req); err != nil {
				return err
			}
			e, err := s.MakeDir(r.Context(), p, id(r), &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, e)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/move", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.Move
			if err := decode(w, r, &req); err != nil {
				return err
			}
			e, err := s.Move(r.Context(), p, id(r), &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, e)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/edit", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.Edit
			if err := decode(w, r, &req); err != nil {
				return err
			}
			if err := s.Edit(r.Context(), p, id(r), &req); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
		{"GET /v1/sandboxes/{id}/watch", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			rec, err := queryBool(r, "recursive")
			if err != nil {
				return err
			}
			sw := &streamWriter{ResponseWriter: w}
			return s.Watch(r.Context(), p, id(r), query(r, "path"), query(r, "user"), rec, func(ev *api.WatchEvent) error { return sw.emit(ev) })
		}},
	}
}

// workspaceRoutes are a sandbox's workspace as a whole: archives in and out, its diff.
func (h *Handler) workspaceRoutes() []route {
	s := h.svc
	return []route{
		{"PUT /v1/sandboxes/{id}/archive", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			skipped, err := s.Upload(r.Context(), p, id(r), query(r, "path"), query(r, "user"), r.Body)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, map[string][]string{"skipped": nonNil(skipped)})
			return nil
		}},
		{"GET /v1/sandboxes/{id}/archive", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			// The archive is counted first (on the frozen sandbox, capped),
			// so that one too large is an error reply; then it is streamed,
			// what it leaves out named before the first byte.
			lw := &lazyWriter{w: w, contentType: "application/x-tar"}
			err := s.Download(r.Context(), p, id(r), query(r, "path"), func(skipped []string) io.Writer {
				if len(skipped) > 0 {
					w.Header().Set("X-Airlock-Skipped", skippedHeader(skipped))
				}
				return lw
			})
			return cutShort(lw, err)
		}},
		{"GET /v1/sandboxes/{id}/diff", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			lw := &lazyWriter{w: w, contentType: "text/x-diff; charset=utf-8"}
			return cutShort(lw, s.Diff(r.Context(), p, id(r), lw))
		}},
	}
}

// snapshotRoutes are snapshots: made from a sandbox, listed, deleted; and
// forks, made from a checkpoint of one.
func (h *Handler) snapshotRoutes() []route {
	s := h.svc
	return []route{
		{"POST /v1/sandboxes/{id}/snapshot", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.CreateSnapshot
			if err := decode(w, r, &req); err != nil {
				return err
			}
			stream, err := queryBool(r, "progress")
			if err != nil {
				return err
			}
			if stream {
				return snapshotStream(w, r, func(ctx context.Context) (*api.Snapshot, error) { return s.Snapshot(ctx, p, id(r), &req) })
			}
			sn, err := s.Snapshot(r.Context(), p, id(r), &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, sn)
			return nil
		}},
		{"POST /v1/sandboxes/{id}/fork", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.CreateFork
			if err := decode(w, r, &req); err != nil {
				return err
			}
			f, err := s.Fork(r.Context(), p, id(r), &req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, f)
			return nil
		}},
		{"GET /v1/snapshots", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			sns, err := s.Snapshots(r.Context(), p)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sns)
			return nil
		}},
		{"DELETE /v1/snapshots/{id}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			if err := s.DeleteSnapshot(r.Context(), p, id(r)); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	}
}

// cutShort ends a streamed reply: an error before its first byte is an
// error reply; after it, the connection is aborted, so that the client
// sees a cut stream rather than a short one that looks whole.
func cutShort(lw *lazyWriter, err error) error {
	if err != nil && lw.started {
		panic(http.ErrAbortHandler)
	}
	if err == nil {
		lw.finish()
	}
	return err
}

// maxSkippedHeader caps the X-Airlock-Skipped header (clients refuse
// headers past about 1 MiB).
const maxSkippedHeader = 64 << 10

// skippedHeader is the JSON list of skipped names, as many as fit
// maxSkippedHeader, the last one counting the rest.
func skippedHeader(skipped []string) string {
	var n, size int
	for ; n < len(skipped); n++ {
		q, _ := json.Marshal(skipped[n])
		if size += len(q) + 1; size > maxSkippedHeader-64 {
			break
		}
	}
	list := skipped[:n:n]
	if n < len(skipped) {
		list = append(list, fmt.Sprintf("… %d more not listed", len(skipped)-n))
	}
	b, _ := json.Marshal(list)
	return string(b)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// portRoutes reach servers inside sandboxes: port tokens, the HTTP and
// WebSocket front (a tenant's key or a port token), raw tunnels.
func (h *Handler) portRoutes() []route {
	return []route{
		{"POST /v1/sandboxes/{id}/port-tokens", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			var req api.MintPortToken
			if err := decode(w, r, &req); err != nil {
				return err
			}
			var ttl time.Duration
			if req.TTL != "" {
				var err error
				if ttl, err = time.ParseDuration(req.TTL); err != nil || ttl <= 0 {
					return errdefs.Invalid("ttl: want a positive Go duration such as 1h")
				}
			}
			tok, exp, err := h.ports.Mint(p, id(r), req.Port, ttl)
			if err != nil {
				return err
			}
			base := "" // over the unix socket: a path alone
			if r.TLS != nil {
				base = "https://" + r.Host
			}
			writeJSON(w, http.StatusCreated, portfront.PortToken(base, id(r), req.Port, tok, exp))
			return nil
		}},
		// Open: it signs its caller in itself, by a port token or a key.
		{"/v1/sandboxes/{id}/ports/{port}/{path...}", false, func(w http.ResponseWriter, r *http.Request, _ *tenant.Principal) error {
			sid := id(r)
			port, err := strconv.Atoi(r.PathValue("port"))
			if err != nil || strconv.Itoa(port) != r.PathValue("port") {
				port = 0 // refused as a missing sandbox is, by DialPort or Mint's rule
			}
			p, auth, err := h.ports.Authorize(r, sid, port, h.authenticate)
			if err != nil {
				return err
			}
			root := "/v1/sandboxes/" + sid + "/ports/" + r.PathValue("port")
			rest, ok := strings.CutPrefix(r.URL.EscapedPath(), root)
			if !ok || port == 0 {
				return portfront.NotFound(sid)
			}
			// No cookie is set: every sandbox's ports share this origin,
			// so a page of one could send a cookie meant for another's.
			in := r.Clone(r.Context())
			in.URL.RawPath = rest
			in.URL.Path = "/" + r.PathValue("path")
			if auth == "key" {
				in.Header.Del("Authorization") // the key: never the sandbox's
			}
			h.ports.Proxy(w, in, p, sid, port, ports.Via{Door: "api", Auth: auth, Remote: r.RemoteAddr})
			return nil
		}},
		{"GET /v1/sandboxes/{id}/tunnel/{port}", true, func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
			port, err := strconv.Atoi(r.PathValue("port"))
			if err != nil {
				port = 0
			}
			h.ports.Tunnel(w, r, p, id(r), port, ports.Via{Door: "forward", Auth: "key", Remote: r.RemoteAddr})
			return nil
		}},
	}
}

// Server returns an http.Server for h with sane timeouts.
func Server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10, IdleTimeout: 5 * time.Minute}
}
