package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"io"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Sandbox is the one sandbox a session's tools act on.
type Sandbox interface {
	ID() string
	Exec(ctx context.Context, req *api.Exec, stdout, stderr io.Writer) (*api.ExecEnd, error)
	ReadFile(ctx context.Context, path string, max int64) ([]byte, error)
	WriteFile(ctx context.Context, path string, data []byte) error
	Edit(ctx context.Context, path, old, new string) error
	ListDir(ctx context.Context, path string, depth int) ([]api.FileEntry, error)
	Diff(ctx context.Context) (string, error)
	// Egress is the sandbox's egress decisions, oldest first (the data
	// of its audit records of kind egress).
	Egress(ctx context.Context) ([]json.RawMessage, error)
	Destroy(ctx context.Context) error
}

// Backend makes a session's sandbox.
type Backend interface {
	Create(ctx context.Context, req *api.CreateSandbox) (Sandbox, error)
}

// ServiceBackend makes sandboxes through the daemon's service, as the
// tenant p (airlock serve's /mcp, and airlock mcp's embedded service).
type ServiceBackend struct {
	Service   *sandbox.Service
	Principal *tenant.Principal
}

// Create makes a sandbox.
func (b *ServiceBackend) Create(ctx context.Context, req *api.CreateSandbox) (Sandbox, error) {
	sb, err := b.Service.Create(ctx, b.Principal, req)
	if err != nil {
		return nil, err
	}
	return &serviceSandbox{svc: b.Service, p: b.Principal, id: sb.ID}, nil
}

type serviceSandbox struct {
	svc *sandbox.Service
	p   *tenant.Principal
	id  string
}

func (s *serviceSandbox) ID() string { return s.id }

func (s *serviceSandbox) Exec(ctx context.Context, req *api.Exec, stdout, stderr io.Writer) (*api.ExecEnd, error) {
	var end *api.ExecEnd
	err := s.svc.Exec(ctx, s.p, s.id, req, func(ev *api.ExecEvent) error {
		switch {
		case ev.End != nil:
			end = ev.End
		case ev.Stdout != nil:
			_, _ = stdout.Write(ev.Stdout)
		case ev.Stderr != nil:
			_, _ = stderr.Write(ev.Stderr)
		case ev.PTY != nil:
			_, _ = stdout.Write(ev.PTY)
		}
		return nil
	})
	return end, err
}

func (s *serviceSandbox) ReadFile(ctx context.Context, path string, max int64) ([]byte, error) {
	var b bytes.Buffer
	err := s.svc.ReadFile(ctx, s.p, s.id, path, "", &b, max)
	return b.Bytes(), err
}

func (s *serviceSandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	return s.svc.WriteFile(ctx, s.p, s.id, path, "", 0o644, bytes.NewReader(data), true)
}

func (s *serviceSandbox) Edit(ctx context.Context, path, old, new string) error {
	return s.svc.Edit(ctx, s.p, s.id, &api.Edit{Path: path, Old: old, New: new})
}

func (s *serviceSandbox) ListDir(ctx context.Context, path string, depth int) ([]api.FileEntry, error) {
	return s.svc.ListDir(ctx, s.p, s.id, path, "", depth)
}

func (s *serviceSandbox) Diff(ctx context.Context) (string, error) {
	var b bytes.Buffer
	err := s.svc.Diff(ctx, s.p, s.id, &b)
	return b.String(), err
}

func (s *serviceSandbox) Egress(ctx context.Context) ([]json.RawMessage, error) {
	var out []json.RawMessage
	err := s.svc.AuditRecords(ctx, s.p, sandbox.AuditFilter{Sandbox: s.id, Kind: "egress"}, func(r *audit.Record) error {
		out = append(out, json.RawMessage(r.Data))
		return nil
	})
	return out, err
}

func (s *serviceSandbox) Destroy(ctx context.Context) error { return s.svc.Destroy(ctx, s.p, s.id) }

// ClientBackend makes sandboxes through a daemon's API (airlock mcp
// --daemon).
type ClientBackend struct{ Client *client.Client }

// Create makes a sandbox.
func (b *ClientBackend) Create(ctx context.Context, req *api.CreateSandbox) (Sandbox, error) {
	sb, err := b.Client.CreateSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	return &clientSandbox{c: b.Client, id: sb.ID}, nil
}

type clientSandbox struct {
	c  *client.Client
	id string
}

func (s *clientSandbox) ID() string { return s.id }

func (s *clientSandbox) Exec(ctx context.Context, req *api.Exec, stdout, stderr io.Writer) (*api.ExecEnd, error) {
	return s.c.Exec(ctx, s.id, req, stdout, stderr)
}

func (s *clientSandbox) ReadFile(ctx context.Context, path string, max int64) ([]byte, error) {
	r, err := s.c.OpenFile(ctx, s.id, path, max)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func (s *clientSandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	return s.c.WriteFile(ctx, s.id, path, data, 0o644)
}

func (s *clientSandbox) Edit(ctx context.Context, path, old, new string) error {
	return s.c.Edit(ctx, s.id, path, old, new)
}

func (s *clientSandbox) ListDir(ctx context.Context, path string, depth int) ([]api.FileEntry, error) {
	return s.c.ListDir(ctx, s.id, path, depth)
}

func (s *clientSandbox) Diff(ctx context.Context) (string, error) { return s.c.Diff(ctx, s.id) }

func (s *clientSandbox) Egress(ctx context.Context) ([]json.RawMessage, error) {
	recs, err := s.c.Audit(ctx, s.id, "egress")
	out := make([]json.RawMessage, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.Data)
	}
	return out, err
}

func (s *clientSandbox) Destroy(ctx context.Context) error { return s.c.Destroy(ctx, s.id) }
