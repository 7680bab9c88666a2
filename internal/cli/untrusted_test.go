package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
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

// audit report --json is the text report's summary as one object, with
// names exactly as recorded (JSON escapes them) and every list a list.
func TestReportAsJSON(t *testing.T) {
	rec := func(kind string, data map[string]any) *audit.Record {
		b, _ := json.Marshal(data)
		return &audit.Record{Kind: kind, Sandbox: "sb", Tenant: "t_1", Time: time.Now(), Data: b}
	}
	rp := summarize([]*audit.Record{
		rec("sandbox.created", map[string]any{"image": "host", "trigger": map[string]any{"task_id": "T-42"}}),
		rec("exec.start", map[string]any{"exec_id": "1", "argv": []string{"sh", "-c", "echo \x1b[2J"}}),
		rec("exec.end", map[string]any{"exec_id": "1", "exit_code": 0, "status": "exited"}),
		rec("egress", map[string]any{"host": "evil\x1b.test", "decision": "denied"}),
		rec("egress", map[string]any{"host": "evil\x1b.test", "decision": "denied"}),
		rec("sandbox.destroyed", map[string]any{"reason": "exit", "oom_kills": 1, "workspace": map[string]any{"changed": 1,
			"paths": []any{map[string]any{"kind": "added", "path": "a\nb", "size": 3}}}}),
	})
	var out bytes.Buffer
	if err := cmdutil.PrintJSON(&out, rp); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Sandbox string         `json:"sandbox_id"`
		Tenant  string         `json:"tenant"`
		Trigger map[string]any `json:"trigger"`
		Calls   []struct {
			Kind     string   `json:"kind"`
			Argv     []string `json:"argv"`
			ExitCode *int     `json:"exit_code"`
		} `json:"calls"`
		Limits   []string          `json:"limits"`
		Denied   map[string]int    `json:"hosts_denied"`
		Allowed  map[string]int    `json:"hosts_allowed"`
		Findings []json.RawMessage `json:"credentials_found"`
		Changed  int               `json:"files_changed"`
		Files    []struct{ Path string }
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if got.Sandbox != "sb" || got.Tenant != "t_1" || got.Trigger["task_id"] != "T-42" || len(got.Calls) != 2 ||
		got.Calls[0].Argv[2] != "echo \x1b[2J" || got.Calls[1].ExitCode == nil || *got.Calls[1].ExitCode != 0 ||
		got.Denied["evil\x1b.test"] != 2 || got.Allowed == nil || got.Findings == nil || got.Changed != 1 ||
		len(got.Files) != 1 || got.Files[0].Path != "a\nb" || strings.Join(got.Limits, ",") != "memory" {
		t.Errorf("report as JSON:\n%s", out.String())
	}
	if strings.Contains(out.String(), "null") {
		t.Errorf("a list or map printed as null:\n%s", out.String())
	}
}
