// Package mcp serves the Model Context Protocol: tools an agent calls
// (run a command, read, write, edit, list and search files, the workspace
// diff, the network log) and the workspace's files as resources, all of
// them acting inside one sandbox per MCP session, never on the machine that
// runs the agent. The sandbox is made on the session's first call, from
// the session's spec, with the session and the client's name as its
// trigger (so every audit record of the session links to them), and
// destroyed when the session ends. Each call goes through the sandbox
// service, which audits it and scans it for credentials. It adapts
// internal/sandbox (airlock serve's /mcp, airlock mcp's embedded service)
// or the Go SDK (airlock mcp --daemon) with modelcontextprotocol/go-sdk.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/api"
)

// Session is one MCP session's state: the spec its sandbox is made from,
// and the sandbox once made.
type Session struct {
	backend Backend
	spec    api.CreateSandbox
	// OnCreate, when set, hears of the sandbox once it is made.
	OnCreate func(Sandbox)

	mu    sync.Mutex
	sb    Sandbox
	err   error
	ss    *sdk.ServerSession
	ended bool
	onEnd func()
}

// Options shape a server.
type Options struct {
	Version string
	// SessionID, when set, is the session's id (streamable HTTP binds it
	// to the key that opened it).
	SessionID string
	// EndWithSession destroys the sandbox when the session ends (HTTP);
	// stdio ends it itself, after reading the diff.
	EndWithSession bool
}

// NewServer returns an MCP server whose tools act in one sandbox made by
// backend from spec (the session's, unless its initialization names one:
// _meta "airlock/sandbox").
func NewServer(backend Backend, spec api.CreateSandbox, o Options) (*sdk.Server, *Session) {
	s := &Session{backend: backend, spec: spec}
	opts := &sdk.ServerOptions{
		Instructions: instructions,
		InitializedHandler: func(ctx context.Context, req *sdk.InitializedRequest) {
			s.mu.Lock()
			s.ss = req.Session
			s.mu.Unlock()
			if o.EndWithSession {
				go s.Wait(ctx, req.Session)
			}
		},
	}
	if o.SessionID != "" {
		opts.GetSessionID = func() string { return o.SessionID }
	}
	srv := sdk.NewServer(&sdk.Implementation{Name: "airlock", Title: "airlock sandbox", Version: o.Version}, opts)
	s.addTools(srv)
	s.addResources(srv)
	return srv, s
}

const instructions = `Every tool runs inside an isolated airlock sandbox, never on the user's machine.
The project is at /workspace (changes there are the result: see the diff tool).
The network reaches only the hosts the sandbox's policy allows; when a command
fails to connect, call network_log to see what was refused and why instead of
retrying. Credentials are never in the sandbox; do not paste any into commands
or files (calls carrying one are refused).`

// sandbox returns the session's sandbox, making it on first use.
func (s *Session) sandbox(ctx context.Context, req *sdk.ServerSession) (Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, errors.New("this MCP session has ended; its sandbox is gone")
	}
	if s.sb != nil || s.err != nil {
		return s.sb, s.err
	}
	if req != nil {
		s.ss = req
	}
	spec := s.spec
	trig := api.Trigger{Inputs: map[string]string{}}
	for k, v := range spec.Trigger.Inputs {
		trig.Inputs[k] = v
	}
	trig.TaskID, trig.PromptDigest = spec.Trigger.TaskID, spec.Trigger.PromptDigest
	if s.ss != nil {
		if p := s.ss.InitializeParams(); p != nil {
			if raw, ok := p.Meta["airlock/sandbox"]; ok {
				b, _ := json.Marshal(raw)
				var named api.CreateSandbox
				dec := json.NewDecoder(strings.NewReader(string(b)))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&named); err != nil {
					s.err = fmt.Errorf("the session's _meta \"airlock/sandbox\" is not a sandbox spec: %v", err)
					return nil, s.err
				}
				spec = named
			}
			if p.ClientInfo != nil {
				trig.Inputs["mcp_client"] = strings.TrimSpace(p.ClientInfo.Name + " " + p.ClientInfo.Version)
			}
		}
		trig.Inputs["mcp_session"] = s.ss.ID()
		if trig.TaskID == "" {
			trig.TaskID = "mcp:" + s.ss.ID()
		}
	}
	if trig.TaskID == "" {
		trig.TaskID = "mcp"
	}
	spec.Trigger = trig
	if spec.Metadata == nil {
		spec.Metadata = map[string]string{}
	}
	spec.Metadata["made_by"] = "airlock mcp"
	s.sb, s.err = s.backend.Create(ctx, &spec)
	if s.err != nil {
		s.err = fmt.Errorf("the sandbox could not be made: %w", s.err)
	} else if s.OnCreate != nil {
		s.OnCreate(s.sb)
	}
	return s.sb, s.err
}

// End destroys the session's sandbox (if it was made) and returns it, so
// that the caller can still read what it needs first (the diff); calls
// after End fail.
func (s *Session) End(ctx context.Context, before func(Sandbox)) error {
	s.mu.Lock()
	sb := s.sb
	s.ended = true
	s.mu.Unlock()
	if sb == nil {
		return nil
	}
	if before != nil {
		before(sb)
	}
	return sb.Destroy(ctx)
}

// Wait watches the session's end (streamable HTTP: a DELETE, or the idle
// timeout) and then ends it.
func (s *Session) Wait(ctx context.Context, ss *sdk.ServerSession) {
	_ = ss.Wait()
	_ = s.End(context.WithoutCancel(ctx), nil)
	if s.onEnd != nil {
		s.onEnd()
	}
}
