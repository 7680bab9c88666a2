package tenant

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// Regression (issue 12, item 14): every request with a bad key appended
// an audit record (3,000 a second). Past the caps, failures are counted,
// never silently: a summary per second names how many, from where.
func TestFailedAuthRecordsAreCapped(t *testing.T) {
	db, err := store.Open(t.TempDir() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Unix(1_800_000_000, 0)
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil), Store: db, Now: func() time.Time { return now }})
	ctx := context.Background()
	// One source floods; others try a few times each.
	for i := 0; i < 3000; i++ {
		_, _ = s.Authenticate(ctx, fmt.Sprintf("bad-%d", i), "192.0.2.7:4000")
	}
	for i := 0; i < 200; i++ {
		_, _ = s.Authenticate(ctx, "", fmt.Sprintf("198.51.100.%d:1", i))
	}
	count := func() (failed int, sum []map[string]any) {
		for _, r := range a.Recs {
			switch r.Kind {
			case "auth.failed":
				failed++
			case "audit.dropped":
				var m map[string]any
				_ = json.Unmarshal(r.Data, &m)
				sum = append(sum, m)
			}
		}
		return
	}
	failed, sums := count()
	if failed != MaxAuthFailedRecords || len(sums) != 0 {
		t.Fatalf("first second: %d auth.failed, %d summaries", failed, len(sums))
	}
	// The tick a second later records what was dropped.
	now = now.Add(time.Second)
	s.noteAuthDropped(now)
	failed, sums = count()
	if len(sums) != 1 {
		t.Fatalf("%d summaries", len(sums))
	}
	sum := sums[0]
	src, _ := sum["sources"].(map[string]any)
	if sum["kind"] != "auth.failed" || sum["records"] != float64(3000+200-MaxAuthFailedRecords) ||
		src["192.0.2.7"] != float64(3000-MaxAuthFailedPerSource) || len(src) != maxDroppedSources || sum["other_sources"] == nil {
		t.Errorf("summary %v", sum)
	}
	// A new second records again, from the flooding source too, and a
	// quiet second makes no summary.
	_, _ = s.Authenticate(ctx, "bad", "192.0.2.7:4000")
	s.noteAuthDropped(now.Add(2 * time.Second))
	if f, sums := count(); f != failed+1 || len(sums) != 1 {
		t.Errorf("after the window: %d auth.failed, %d summaries", f, len(sums))
	}
	if r := a.Recs[len(a.Recs)-1]; r.Kind != "auth.failed" || !json.Valid(r.Data) || string(r.Data) == "" {
		t.Errorf("last record %s %s", r.Kind, r.Data)
	}
}

// The next failure after a dropping second records the summary too (a
// daemon whose tick has not run yet).
func TestFailedAuthSummaryAtTheNextFailure(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil), Now: func() time.Time { return now }})
	for i := 0; i < MaxAuthFailedPerSource+5; i++ {
		_, _ = s.Authenticate(context.Background(), "", "[2001:db8::1]:80")
	}
	now = now.Add(1500 * time.Millisecond)
	_, _ = s.Authenticate(context.Background(), "", "[2001:db8::1]:80")
	kinds := []string{}
	for _, r := range a.Recs[MaxAuthFailedPerSource:] {
		kinds = append(kinds, r.Kind)
	}
	if fmt.Sprint(kinds) != "[audit.dropped auth.failed]" || !json.Valid(a.Recs[MaxAuthFailedPerSource].Data) {
		t.Errorf("records after the cap: %v", kinds)
	}
	var sum struct {
		Records int              `json:"records"`
		Sources map[string]int64 `json:"sources"`
	}
	_ = json.Unmarshal(a.Recs[MaxAuthFailedPerSource].Data, &sum)
	if sum.Records != 5 || sum.Sources["2001:db8::1"] != 5 {
		t.Errorf("summary %+v", sum)
	}
}

// When the service stops, what was dropped in its last second is
// recorded too.
func TestFailedAuthSummaryWhenTheServiceStops(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil), Now: func() time.Time { return now }})
	for i := 0; i < MaxAuthFailedPerSource+3; i++ {
		_, _ = s.Authenticate(context.Background(), "", "")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Run(ctx)
	last := a.Recs[len(a.Recs)-1]
	if len(a.Recs) != MaxAuthFailedPerSource+1 || last.Kind != "audit.dropped" || !strings.Contains(string(last.Data), `"local":3`) {
		t.Errorf("%d records, last %s %s", len(a.Recs), last.Kind, last.Data)
	}
}
