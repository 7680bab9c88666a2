package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func commitFor(t *testing.T, l *Log, tenant string, i int) {
	t.Helper()
	if err := l.Commit(context.Background(), Record{Kind: "exec.start", Tenant: tenant, Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}); err != nil {
		t.Fatal(err)
	}
}

// seqsOf reads tenant's records through x.
func seqsOf(t *testing.T, x *Index, tenant string) []uint64 {
	t.Helper()
	var out []uint64
	if err := x.ReadTenant(context.Background(), tenant, func(r *Record) error {
		if r.Tenant != tenant {
			t.Fatalf("record %d of %q given to %q", r.Seq, r.Tenant, tenant)
		}
		out = append(out, r.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// scanSeqs reads tenant's records the slow way: the whole log.
func scanSeqs(t *testing.T, dir, tenant string) []uint64 {
	t.Helper()
	var out []uint64
	if err := Read(context.Background(), dir, false, func(r *Record) error {
		if r.Tenant == tenant {
			out = append(out, r.Seq)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// Regression (issue 12, item 14): every tenant's read of the log read all
// of it. The index gives a tenant exactly its records, in order, across
// segments, and is brought up to date with what was appended since.
func TestIndexGivesATenantItsRecords(t *testing.T) {
	l, dir, _, _ := newLog(t, Options{SegmentBytes: 2 << 10})
	x := NewIndex(dir)
	for i := 0; i < 60; i++ {
		commitFor(t, l, []string{"a", "b", "c", ""}[i%4], i)
	}
	for _, tn := range []string{"a", "b", "nobody"} {
		if got, want := seqsOf(t, x, tn), scanSeqs(t, dir, tn); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", tn, got, want)
		}
	}
	// Appended since: indexed from where the last read stopped.
	before, _ := os.ReadFile(filepath.Join(dir, "index", "state"))
	for i := 0; i < 30; i++ {
		commitFor(t, l, "a", 100+i)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := seqsOf(t, x, "a"), scanSeqs(t, dir, "a"); !slices.Equal(got, want) || len(got) != 45 {
		t.Errorf("after appends: %d records %v, want %v", len(got), got, want)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "index", "state"))
	if segs, _ := Segments(dir); string(before) == string(after) || !strings.Contains(string(after), filepath.Base(segs[len(segs)-1])) {
		t.Errorf("state %s → %s", before, after)
	}
}

// An index edited to point one tenant at another's record is caught
// (each record read must be the one the index names, the tenant's, its
// hash its own) and rebuilt from the log; a record edited in the log
// fails the read.
func TestIndexIsCheckedAgainstTheLog(t *testing.T) {
	l, dir, _, _ := newLog(t, Options{})
	x := NewIndex(dir)
	for i := 0; i < 10; i++ {
		commitFor(t, l, []string{"a", "b"}[i%2], i)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	want := seqsOf(t, x, "a")
	// Point a's index at b's records (same lines, b's offsets).
	aFile, bFile := filepath.Join(dir, "index", tenantFile("a")), filepath.Join(dir, "index", tenantFile("b"))
	bIdx, _ := os.ReadFile(bFile)
	if err := os.WriteFile(aFile, bIdx, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := seqsOf(t, x, "a"); !slices.Equal(got, want) {
		t.Errorf("after the index was edited: %v, want %v", got, want)
	}
	// Edit one of a's records in the log, keeping its length.
	segs, _ := Segments(dir)
	b, _ := os.ReadFile(segs[0])
	edited := strings.Replace(string(b), `{"i":2}`, `{"i":7}`, 1)
	if edited == string(b) {
		t.Fatal("nothing to edit")
	}
	if err := os.WriteFile(segs[0], []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	err := x.ReadTenant(context.Background(), "a", func(*Record) error { return nil })
	if !errors.Is(err, ErrIndexMismatch) {
		t.Errorf("an edited record: %v, want ErrIndexMismatch", err)
	}
}
