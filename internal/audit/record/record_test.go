package record

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/audit"
)

// Every kind is read back as the type it was written with, and only the
// sandbox's report of its processes is "reported".
func TestEveryKindReadsBackAsItsType(t *testing.T) {
	if len(Kinds()) < 30 {
		t.Fatalf("only %d kinds", len(Kinds()))
	}
	for _, kind := range Kinds() {
		d := kinds[kind]()
		if d.Kind() != kind {
			t.Errorf("%T says %q, registered as %q", d, d.Kind(), kind)
		}
		v := reflect.ValueOf(d).Elem().Interface().(Data)
		r, err := Make(Who{Tenant: "t", Sandbox: "s"}, v)
		if err != nil {
			t.Fatal(err)
		}
		want := audit.Observed
		if kind == "exec.end" {
			want = audit.Reported
		}
		if r.Kind != kind || r.Source != want || r.Tenant != "t" || r.Sandbox != "s" {
			t.Errorf("%s: record %+v", kind, r)
		}
		back, err := Decode(&r)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if reflect.TypeOf(back).Elem() != reflect.TypeOf(v) {
			t.Errorf("%s read back as %T", kind, back)
		}
	}
	if r, _ := Make(Who{Tenant: "t", Actor: "admin"}, SandboxPaused{}); r.Actor != "admin" {
		t.Errorf("the actor is not on the record: %+v", r)
	}
	if _, err := Decode(&audit.Record{Kind: "no.such"}); err == nil {
		t.Error("an unknown kind decoded")
	}
}

// Regression (issue 13): a run's destroy record listed its workspace as a
// bare list of changes, the daemon's as an object; the record now has one
// shape, and an old run's list is an error a reader reports, not a silent
// empty report.
func TestDestroyRecordHasOneWorkspaceShape(t *testing.T) {
	r, _ := Make(Who{}, SandboxDestroyed{Reason: "exit", Workspace: &Workspace{Changed: 1}})
	var m struct{ Workspace map[string]any }
	if err := json.Unmarshal(r.Data, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"changed", "truncated", "paths", "patch"} {
		if _, ok := m.Workspace[k]; !ok {
			t.Errorf("the workspace has no %q: %s", k, r.Data)
		}
	}
	old := audit.Record{Kind: "sandbox.destroyed", Data: json.RawMessage(`{"reason":"exit","workspace":[{"path":"a"}]}`)}
	if _, err := Decode(&old); err == nil {
		t.Error("an old run's workspace list decoded")
	}
}
