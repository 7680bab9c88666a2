package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
)

// audit report shows what the sandbox named quoted.
func TestReportQuotesSandboxNames(t *testing.T) {
	rec := func(kind string, data map[string]any) *audit.Record {
		b, _ := json.Marshal(data)
		return &audit.Record{Kind: kind, Sandbox: "sb", Time: time.Now(), Data: b}
	}
	var out bytes.Buffer
	err := writeReport(&out, []*audit.Record{
		rec("exec.start", map[string]any{"exec_id": "1", "argv": []string{"sh", "-c", "printf '\x1b]52;c;aGk=\a'"}}),
		rec("exec.end", map[string]any{"exec_id": "1", "status": "exited\x1b[2K"}),
		rec("file.write", map[string]any{"path": "/workspace/a\n+++ b/forged"}),
		rec("egress", map[string]any{"host": "evil\x1b[2J.test", "decision": "denied"}),
		rec("sandbox.destroyed", map[string]any{"reason": "exit", "workspace": map[string]any{"paths": []any{map[string]any{"kind": "added", "path": "x\x1b[2K", "size": 1}}}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.ContainsAny(s, "\x1b\a") || strings.Contains(s, "\n+++ b/forged") {
		t.Fatalf("raw bytes in the report:\n%q", s)
	}
}

// audit report counts the files changed as the destroy record does, not
// by the paths it lists: a record lists at most 1000 (and 1 MiB of them),
// so a sandbox that changed more must not read as one that changed fewer.
func TestReportCountsEveryChange(t *testing.T) {
	b, _ := json.Marshal(map[string]any{"reason": "exit", "workspace": map[string]any{"changed": 5000, "truncated": true,
		"paths": []any{map[string]any{"kind": "added", "path": "a", "size": 1}, map[string]any{"kind": "added", "path": "b", "size": 1}}}})
	var out bytes.Buffer
	if err := writeReport(&out, []*audit.Record{{Kind: "sandbox.destroyed", Sandbox: "sb", Time: time.Now(), Data: b}}); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "files changed in /workspace: 5000 (2 listed)") {
		t.Errorf("report:\n%s", s)
	}
}
