package core

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// An agent's error message is the sandbox's text: it reaches a person
// quoted, classed and labelled.
func TestAgentErrorIsQuoted(t *testing.T) {
	err := AgentError(connect.NewError(connect.CodeNotFound, errors.New("open /workspace/x\x1b]52;c;aGk=\a\n+++ b/forged: no such file")))
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("class: %v", err)
	}
	if msg := err.Error(); strings.ContainsAny(msg, "\x1b\a\n") || !strings.HasSuffix(msg, "(reported by the sandbox)") {
		t.Errorf("%q", msg)
	}
}
