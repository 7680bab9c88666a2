package execs

import (
	"maps"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/spec"
)

// A sandbox made ahead for a pool got its env after its agent started:
// each command is sent it, under its own, but for the agent's HOME, USER
// and LOGNAME; any other sandbox's commands are sent their own alone.
func TestCommandEnvOfAPooledSandbox(t *testing.T) {
	own := map[string]string{"X": "cmd", "B": "cmd"}
	pooled := &spec.Spec{Pool: "py", Env: []string{"A=sb", "B=sb", "HOME=/evil", "USER=root"}}
	want := map[string]string{"A": "sb", "B": "cmd", "X": "cmd"}
	if got := commandEnv(pooled, own); !maps.Equal(got, want) {
		t.Errorf("pooled: %v, want %v", got, want)
	}
	made := &spec.Spec{Env: []string{"A=sb"}}
	if got := commandEnv(made, own); !maps.Equal(got, own) {
		t.Errorf("not pooled: %v, want %v", got, own)
	}
}
