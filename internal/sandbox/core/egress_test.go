package core

import (
	"encoding/json"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil/memlog"
)

// memAudit is an audit log in memory.
type memAudit = memlog.Log

// A sandbox cannot flood the log: past its egress record cap, records are
// dropped, counted, and the count recorded.
func TestEgressRecordsAreCapped(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil)})
	b := &Box{Rec: store.Sandbox{ID: "sb", Tenant: "t", Trigger: `{"task_id":"T"}`}, EgressRate: NewLimiter(MaxEgressRecords)}
	s.Boxes["sb"] = b
	for i := 0; i < MaxEgressRecords+123; i++ {
		s.NoteEgress("sb", eventlog.Event{Decision: "denied"})
	}
	s.NoteDropped(b)
	kinds := map[string]int{}
	var dropped struct {
		Records int `json:"records"`
	}
	for _, r := range a.Recs {
		kinds[r.Kind]++
		if r.Kind == "audit.dropped" {
			_ = json.Unmarshal(r.Data, &dropped)
		}
		if r.Tenant != "t" || r.Trigger != "T" {
			t.Errorf("record %+v", r)
		}
	}
	if kinds["egress"] != MaxEgressRecords || kinds["audit.dropped"] != 1 || dropped.Records != 123 {
		t.Errorf("kinds %v, dropped %+v", kinds, dropped)
	}
	// The next second has room again.
	s.NoteEgress("sb", eventlog.Event{Decision: "allowed"})
	if a.Recs[len(a.Recs)-1].Kind != "egress" {
		t.Error("the cap did not refill")
	}
}

// Regression: the proxy's findings were recorded past the egress cap, a
// way to flood the log (a body full of placeholders).
func TestFindingsShareTheEgressCap(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil)})
	b := &Box{Rec: store.Sandbox{ID: "sb", Tenant: "t"}, EgressRate: NewLimiter(MaxEgressRecords)}
	s.Boxes["sb"] = b
	for i := 0; i < MaxEgressRecords*3; i++ {
		s.NoteFinding("sb", record.SecretFinding{Rule: "airlock-placeholder"})
	}
	if len(a.Recs) != MaxEgressRecords || b.EgressDropped.Load() != 2*MaxEgressRecords {
		t.Errorf("%d records, %d dropped", len(a.Recs), b.EgressDropped.Load())
	}
}
