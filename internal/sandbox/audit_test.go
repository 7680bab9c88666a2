package sandbox

import (
	"context"
	"encoding/json"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/store"
)

type memAudit struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (m *memAudit) Commit(_ context.Context, r audit.Record) error { return m.Append(r) }
func (m *memAudit) Failed() error                                  { return nil }
func (m *memAudit) Append(r audit.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, r)
	return nil
}

// A sandbox cannot flood the log: past its egress record cap, records are
// dropped, counted, and the count recorded.
func TestEgressRecordsAreCapped(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: a})
	b := &box{rec: store.Sandbox{ID: "sb", Tenant: "t", Trigger: `{"task_id":"T"}`}, egressRate: newLimiter(MaxEgressRecords)}
	s.boxes["sb"] = b
	for i := 0; i < MaxEgressRecords+123; i++ {
		s.NoteEgress("sb", map[string]string{"decision": "denied"})
	}
	s.noteDropped(b)
	kinds := map[string]int{}
	var dropped struct {
		Records int `json:"records"`
	}
	for _, r := range a.recs {
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
	s.NoteEgress("sb", map[string]string{"decision": "allowed"})
	if a.recs[len(a.recs)-1].Kind != "egress" {
		t.Error("the cap did not refill")
	}
}

// Regression: the proxy's findings were recorded past the egress cap, a
// way to flood the log (a body full of placeholders).
func TestFindingsShareTheEgressCap(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: a})
	b := &box{rec: store.Sandbox{ID: "sb", Tenant: "t"}, egressRate: newLimiter(MaxEgressRecords)}
	s.boxes["sb"] = b
	for i := 0; i < MaxEgressRecords*3; i++ {
		s.NoteFinding("sb", map[string]any{"rule": "airlock-placeholder"})
	}
	if len(a.recs) != MaxEgressRecords || b.egressDropped.Load() != 2*MaxEgressRecords {
		t.Errorf("%d records, %d dropped", len(a.recs), b.egressDropped.Load())
	}
}

// patchWriter is an Host whose workspace changes write a huge patch
// by every shortcut a writer can be reached through.
type patchWriter struct {
	Host
	deadline time.Duration
}

func (p *patchWriter) Changes(ctx context.Context, w io.Writer, _ int64) (*lifecycle.WorkspaceChanges, error) {
	if d, ok := ctx.Deadline(); ok {
		p.deadline = time.Until(d)
	}
	chunk := strings.Repeat("+x\n", 1<<16)
	for range 40 {
		if _, err := io.WriteString(w, chunk); err != nil {
			return nil, err
		}
		if _, err := io.Copy(w, strings.NewReader(chunk)); err != nil {
			return nil, err
		}
	}
	return &lifecycle.WorkspaceChanges{Changes: []lifecycle.Change{{Path: "a", Kind: "added", Type: "file"}}, Unread: []string{"deep (deeper than 256 levels: not read)"}}, nil
}

// Regression: cappedBuffer embedded bytes.Buffer, so io.WriteString (and
// io.Copy) went around its Write and a 473 MB patch landed beside the log.
// The destroy record's reading has a deadline of RecordTime.
func TestPatchBesideTheLogIsCapped(t *testing.T) {
	dir := t.TempDir()
	s := New(Config{PatchDir: dir})
	inst := &patchWriter{}
	out := s.workspaceChanges(&box{rec: store.Sandbox{ID: "sb", Tenant: "t"}, inst: inst})
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("patch files: %v", ents)
	}
	fi, _ := ents[0].Info()
	if fi.Size() != MaxPatchBytes {
		t.Errorf("the patch is %d bytes, cap %d", fi.Size(), MaxPatchBytes)
	}
	if p, _ := out["patch"].(map[string]any); p["truncated"] != true {
		t.Errorf("the record does not say the patch was cut: %v", out["patch"])
	}
	if u, _ := out["unread"].([]string); len(u) != 1 {
		t.Errorf("the record does not name what was not read: %v", out)
	}
	if inst.deadline <= 0 || inst.deadline > RecordTime {
		t.Errorf("the reading's deadline is %v away, want at most %v", inst.deadline, RecordTime)
	}
}

// hugeNames is an Host whose workspace holds the longest names a
// sandbox can make, as many as a record lists: control bytes, escaped
// six-fold in JSON.
type hugeNames struct{ Host }

func (hugeNames) Changes(ctx context.Context, w io.Writer, _ int64) (*lifecycle.WorkspaceChanges, error) {
	long := strings.Repeat("\x01", 4095)
	out := &lifecycle.WorkspaceChanges{}
	for range 2000 {
		out.Changes = append(out.Changes, lifecycle.Change{Path: long, Kind: "added", Type: "file"})
		out.Unread = append(out.Unread, long+" (fifo: not archived)")
	}
	return out, nil
}

// Regression: the destroy record listed 1000 changed paths and 100
// unread names whatever their length: a sandbox's names made it about
// 27 MiB (and a download's record, its skipped names, 20).
func TestRecordOfHugeNamesIsCapped(t *testing.T) {
	s := New(Config{})
	out := s.workspaceChanges(&box{rec: store.Sandbox{ID: "sb", Tenant: "t"}, inst: hugeNames{}})
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 2*MaxRecordedBytes {
		t.Errorf("the record is %d bytes", len(b))
	}
	if out["truncated"] != true || out["changed"] != 2000 {
		t.Errorf("the record does not say it left paths out: truncated %v, changed %v", out["truncated"], out["changed"])
	}
	u, _ := out["unread"].([]string)
	if len(u) == 0 || !strings.HasPrefix(u[len(u)-1], "… ") {
		t.Errorf("the record does not count the unread names it left out: %d of them", len(u))
	}
	ch, _ := hugeNames{}.Changes(context.Background(), nil, 0)
	if r := recordedNames(ch.Unread); len(r) == 0 {
		t.Error("no skipped name recorded")
	} else if b, _ := json.Marshal(r); len(b) > MaxRecordedBytes {
		t.Errorf("a download's skipped names take %d bytes of its record", len(b))
	}
}
