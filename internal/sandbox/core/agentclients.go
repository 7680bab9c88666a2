package core

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/process"
	"github.com/airlock-sandbox/airlock/api/process/processconnect"
)

// The Connect clients of the agents are one set for the whole daemon: a
// client per method holds its parsed URL, compression pools and
// configuration, about 35 KiB for the three services, which every idle
// sandbox paid for its own. Each call is routed to its sandbox's own
// transport (and so only to its agent's socket) by a value on the call's
// context, which only an Agent's clients below put there; a call without
// one fails.
var sharedClients = sync.OnceValue(func() *agentClients {
	hc := &http.Client{Transport: drainingTransport{routed{}}}
	opts := []connect.ClientOption{connect.WithReadMaxBytes(maxAgentMessage), connect.WithSendMaxBytes(maxAgentMessage)}
	const base = "http://agent"
	return &agentClients{
		proc:  processconnect.NewProcessClient(hc, base, opts...),
		fs:    filesystemconnect.NewFilesystemClient(hc, base, opts...),
		files: agentpbconnect.NewAgentClient(hc, base, opts...),
	}
})

type agentClients struct {
	proc  processconnect.ProcessClient
	fs    filesystemconnect.FilesystemClient
	files agentpbconnect.AgentClient
}

type transportKey struct{}

// routed sends a request over the transport its context names.
type routed struct{}

func (routed) RoundTrip(req *http.Request) (*http.Response, error) {
	tr, _ := req.Context().Value(transportKey{}).(*http.Transport)
	if tr == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errors.New("an agent call without its sandbox")
	}
	return tr.RoundTrip(req)
}

// route is one sandbox's way to its agent: its transport.
type route struct{ tr *http.Transport }

func (r route) bind(ctx context.Context) context.Context {
	return context.WithValue(ctx, transportKey{}, r.tr)
}

// procClient, fsClient and filesClient are one sandbox's clients of its
// agent's services: the shared clients, routed to it.
type (
	procClient  struct{ route }
	fsClient    struct{ route }
	filesClient struct{ route }
)

func (c procClient) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	return sharedClients().proc.List(c.bind(ctx), req)
}

func (c procClient) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest]) (*connect.ServerStreamForClient[process.ConnectResponse], error) {
	return sharedClients().proc.Connect(c.bind(ctx), req)
}

func (c procClient) Start(ctx context.Context, req *connect.Request[process.StartRequest]) (*connect.ServerStreamForClient[process.StartResponse], error) {
	return sharedClients().proc.Start(c.bind(ctx), req)
}

func (c procClient) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	return sharedClients().proc.Update(c.bind(ctx), req)
}

func (c procClient) StreamInput(ctx context.Context) *connect.ClientStreamForClient[process.StreamInputRequest, process.StreamInputResponse] {
	return sharedClients().proc.StreamInput(c.bind(ctx))
}

func (c procClient) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	return sharedClients().proc.SendInput(c.bind(ctx), req)
}

func (c procClient) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	return sharedClients().proc.SendSignal(c.bind(ctx), req)
}

func (c procClient) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	return sharedClients().proc.CloseStdin(c.bind(ctx), req)
}

func (c fsClient) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	return sharedClients().fs.Stat(c.bind(ctx), req)
}

func (c fsClient) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	return sharedClients().fs.MakeDir(c.bind(ctx), req)
}

func (c fsClient) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	return sharedClients().fs.Move(c.bind(ctx), req)
}

func (c fsClient) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	return sharedClients().fs.ListDir(c.bind(ctx), req)
}

func (c fsClient) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	return sharedClients().fs.Remove(c.bind(ctx), req)
}

func (c fsClient) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest]) (*connect.ServerStreamForClient[filesystem.WatchDirResponse], error) {
	return sharedClients().fs.WatchDir(c.bind(ctx), req)
}

func (c fsClient) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	return sharedClients().fs.CreateWatcher(c.bind(ctx), req)
}

func (c fsClient) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	return sharedClients().fs.GetWatcherEvents(c.bind(ctx), req)
}

func (c fsClient) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	return sharedClients().fs.RemoveWatcher(c.bind(ctx), req)
}

func (c filesClient) Hello(ctx context.Context, req *connect.Request[agentpb.HelloRequest]) (*connect.Response[agentpb.HelloResponse], error) {
	return sharedClients().files.Hello(c.bind(ctx), req)
}

func (c filesClient) ReadFile(ctx context.Context, req *connect.Request[agentpb.ReadFileRequest]) (*connect.ServerStreamForClient[agentpb.ReadFileResponse], error) {
	return sharedClients().files.ReadFile(c.bind(ctx), req)
}

func (c filesClient) WriteFile(ctx context.Context) *connect.ClientStreamForClient[agentpb.WriteFileRequest, agentpb.WriteFileResponse] {
	return sharedClients().files.WriteFile(c.bind(ctx))
}

func (c filesClient) Unpack(ctx context.Context) *connect.ClientStreamForClient[agentpb.UnpackRequest, agentpb.UnpackResponse] {
	return sharedClients().files.Unpack(c.bind(ctx))
}

func (c filesClient) EditFile(ctx context.Context, req *connect.Request[agentpb.EditFileRequest]) (*connect.Response[agentpb.EditFileResponse], error) {
	return sharedClients().files.EditFile(c.bind(ctx), req)
}
