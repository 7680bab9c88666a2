package envd

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Service is what envd's handler calls: the sandbox service's calls on a
// sandbox's commands and files (internal/sandbox.Service has them all).
type Service interface {
	Get(ctx context.Context, t *tenant.Principal, id string) (*api.Sandbox, error)
	Exec(ctx context.Context, t *tenant.Principal, id string, req *api.Exec, emit func(*api.ExecEvent) error) error
	Attach(ctx context.Context, t *tenant.Principal, id string, pid uint32, emit func(*api.ExecEvent) error) error
	Processes(ctx context.Context, t *tenant.Principal, id string) ([]api.Process, error)
	Input(ctx context.Context, t *tenant.Principal, id string, pid uint32, in *api.Input) error
	InputTo(ctx context.Context, t *tenant.Principal, id string, pid uint32, data []byte, pty bool) error
	Signal(ctx context.Context, t *tenant.Principal, id string, pid uint32, sig string) error
	Resize(ctx context.Context, t *tenant.Principal, id string, pid uint32, tty *api.TTY) error
	ReadFile(ctx context.Context, t *tenant.Principal, id, p, user string, w io.Writer, max int64) error
	WriteFileAt(ctx context.Context, t *tenant.Principal, id, p, user string, mode fs.FileMode, r io.Reader, parents bool) (string, error)
	Stat(ctx context.Context, t *tenant.Principal, id, p, user string) (*api.FileEntry, error)
	ListDir(ctx context.Context, t *tenant.Principal, id, p, user string, depth int) ([]api.FileEntry, error)
	MakeDir(ctx context.Context, t *tenant.Principal, id string, req *api.MakeDir) (*api.FileEntry, error)
	Move(ctx context.Context, t *tenant.Principal, id string, req *api.Move) (*api.FileEntry, error)
	Remove(ctx context.Context, t *tenant.Principal, id, p, user string) error
	WatchRelative(ctx context.Context, t *tenant.Principal, id, p, user string, recursive bool, emit func(*api.WatchEvent) error) error
}

// maxMessage bounds one message of the Connect services, inflated (a
// command's input, its arguments and environment, a path): the daemon
// holds a message whole, and Connect's handlers take any size unless
// told. Files move through /files, streamed.
const maxMessage = 4 << 20

// Handler serves envd for the sandbox each request was routed to
// (WithTarget).
type Handler struct {
	svc      Service
	mux      *http.ServeMux
	watchers *watchers
}

// New makes envd's handler over svc: process.Process and
// filesystem.Filesystem (Connect, JSON or binary), GET and POST /files,
// GET /health, each at the root path as the SDKs address them.
//
// What a request may do is decided before it gets here: the front checked
// its access token (or a /files URL's signature) and found the sandbox's
// tenant, whom every call is made as. Users are envd's: HTTP basic
// authorization's user name (the "username" query of /files), "user" (the
// default; home /home/user, as in E2B's base template) or "root". A
// command's working directory defaults to the sandbox's /workspace (E2B's
// base template's is /home/user); relative file paths are taken from the
// user's home, as envd takes them.
func New(svc Service) *Handler {
	h := &Handler{svc: svc, mux: http.NewServeMux(), watchers: newWatchers()}
	capped := connect.WithReadMaxBytes(maxMessage)
	h.mux.Handle(processconnect.NewProcessHandler(&processes{h}, capped))
	h.mux.Handle(filesystemconnect.NewFilesystemHandler(&files{h}, capped))
	h.mux.HandleFunc("GET /files", h.download)
	h.mux.HandleFunc("POST /files", h.upload)
	h.mux.HandleFunc("GET /health", h.health)
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// errNotRouted answers a request that reached the handler without a
// sandbox: the front's mistake, never the caller's.
var errNotRouted = errdefs.New(errdefs.ErrInternal, "envd: the request was not routed to a sandbox")

// target is the sandbox ctx was routed to.
func target(ctx context.Context) (Target, error) {
	t, ok := TargetOf(ctx)
	if !ok || t.Principal == nil || t.ID == "" {
		return Target{}, errNotRouted
	}
	return t, nil
}

// userOf is the user a Connect request acts as: HTTP basic
// authorization's user name, as envd reads it ("" is the default user).
func userOf(h interface{ Get(string) string }) (string, error) {
	v, ok := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	if !ok {
		return "", nil
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("authorization: not basic credentials"))
	}
	name, _, _ := strings.Cut(string(b), ":")
	return name, nil
}

// connectErr gives a service error its Connect code.
func connectErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return connect.NewError(connect.CodeCanceled, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	code := connect.CodeInternal
	for _, c := range []struct {
		class error
		code  connect.Code
	}{
		{errdefs.ErrNotFound, connect.CodeNotFound},
		{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists},
		{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument},
		{errdefs.ErrSecretDetected, connect.CodeInvalidArgument},
		{errdefs.ErrTooLarge, connect.CodeInvalidArgument},
		{errdefs.ErrPermissionDenied, connect.CodePermissionDenied},
		{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated},
		{errdefs.ErrFailedPrecondition, connect.CodeFailedPrecondition},
		{errdefs.ErrResourceExhausted, connect.CodeResourceExhausted},
		{errdefs.ErrUnavailable, connect.CodeUnavailable},
		{errdefs.ErrTimeout, connect.CodeDeadlineExceeded},
	} {
		if errors.Is(err, c.class) {
			code = c.code
			break
		}
	}
	return connect.NewError(code, err)
}

// httpStatus is a service error's status on envd's plain-HTTP endpoints.
func httpStatus(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument), errors.Is(err, errdefs.ErrSecretDetected), errors.Is(err, errdefs.ErrTooLarge):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusBadGateway
	case errors.Is(err, errdefs.ErrTimeout):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// writeErr answers envd's plain-HTTP error body, {"code": N, "message"}.
func writeErr(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// health answers 204 while the sandbox runs, 502 otherwise (the SDKs'
// isRunning() false), as envd's proxy does.
func (h *Handler) health(w http.ResponseWriter, r *http.Request) {
	t, err := target(r.Context())
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	sb, err := h.svc.Get(r.Context(), t.Principal, t.ID)
	if err != nil || sb.State != api.StateRunning {
		writeErr(w, http.StatusBadGateway, "sandbox not running")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
