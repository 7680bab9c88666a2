package core

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/agentpb/agentpbconnect"
)

// helloAgent answers Hello with its protocol.
type helloAgent struct {
	agentpbconnect.UnimplementedAgentHandler
	protocol uint32
}

func (a helloAgent) Hello(context.Context, *connect.Request[agentpb.HelloRequest]) (*connect.Response[agentpb.HelloResponse], error) {
	return connect.NewResponse(&agentpb.HelloResponse{Protocol: a.protocol}), nil
}

func serveAgent(t *testing.T, protocol uint32) string {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	_, h := agentpbconnect.NewAgentHandler(helloAgent{protocol: protocol})
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// The agents' clients are shared by every sandbox, and each call still
// reaches its own sandbox's agent alone: two agents, each asked in turn,
// answer each for itself; a call that names no sandbox goes nowhere.
func TestSharedClientsReachOnlyTheirOwnAgent(t *testing.T) {
	ctx := context.Background()
	good, other := NewAgent(serveAgent(t, AgentProtocol)), NewAgent(serveAgent(t, AgentProtocol+1))
	defer good.Close()
	defer other.Close()
	for range 2 {
		if err := good.Hello(ctx); err != nil {
			t.Errorf("its own agent: %v", err)
		}
		if err := other.Hello(ctx); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("speaks protocol %d", AgentProtocol+1)) {
			t.Errorf("the other agent: %v", err)
		}
	}
	if _, err := sharedClients().files.Hello(ctx, connect.NewRequest(&agentpb.HelloRequest{})); err == nil || !strings.Contains(err.Error(), "without its sandbox") {
		t.Errorf("a call without a sandbox: %v", err)
	}
}
