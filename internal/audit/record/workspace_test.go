package record

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/workspace"
)

// patchWriter is a sandbox whose workspace changes write a huge patch
// by every shortcut a writer can be reached through.
type patchWriter struct {
	deadline time.Duration
}

func (p *patchWriter) Changes(ctx context.Context, w io.Writer, _ int64) (*workspace.Report, error) {
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
	return &workspace.Report{Changes: []workspace.Reported{{Path: "a", Kind: "added", Type: "file"}}, Unread: []string{"deep (deeper than 256 levels: not read)"}}, nil
}

// Regression: cappedBuffer embedded bytes.Buffer, so io.WriteString (and
// io.Copy) went around its Write and a 473 MB patch landed beside the log.
// The destroy record's reading has a deadline of ReadTime.
func TestPatchBesideTheLogIsCapped(t *testing.T) {
	dir := t.TempDir()
	inst := &patchWriter{}
	out := ReadWorkspace(inst, "sb", dir)
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("patch files: %v", ents)
	}
	fi, _ := ents[0].Info()
	if fi.Size() != MaxPatchBytes {
		t.Errorf("the patch is %d bytes, cap %d", fi.Size(), MaxPatchBytes)
	}
	if out.Patch == nil || !out.Patch.Truncated {
		t.Errorf("the record does not say the patch was cut: %+v", out.Patch)
	}
	if len(out.Unread) != 1 {
		t.Errorf("the record does not name what was not read: %+v", out)
	}
	if inst.deadline <= 0 || inst.deadline > ReadTime {
		t.Errorf("the reading's deadline is %v away, want at most %v", inst.deadline, ReadTime)
	}
}

// hugeNames is a sandbox whose workspace holds the longest names a
// sandbox can make, as many as a record lists: control bytes, escaped
// six-fold in JSON.
type hugeNames struct{}

func (hugeNames) Changes(ctx context.Context, w io.Writer, _ int64) (*workspace.Report, error) {
	long := strings.Repeat("\x01", 4095)
	out := &workspace.Report{}
	for range 2000 {
		out.Changes = append(out.Changes, workspace.Reported{Path: long, Kind: "added", Type: "file"})
		out.Unread = append(out.Unread, long+" (fifo: not archived)")
	}
	return out, nil
}

// Regression: the destroy record listed 1000 changed paths and 100
// unread names whatever their length: a sandbox's names made it about
// 27 MiB (and a download's record, its skipped names, 20).
func TestRecordOfHugeNamesIsCapped(t *testing.T) {
	out := ReadWorkspace(hugeNames{}, "sb", "")
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 2*MaxListedBytes {
		t.Errorf("the record is %d bytes", len(b))
	}
	if !out.Truncated || out.Changed != 2000 {
		t.Errorf("the record does not say it left paths out: truncated %v, changed %v", out.Truncated, out.Changed)
	}
	u := out.Unread
	if len(u) == 0 || !strings.HasPrefix(u[len(u)-1], "… ") {
		t.Errorf("the record does not count the unread names it left out: %d of them", len(u))
	}
	ch, _ := hugeNames{}.Changes(context.Background(), nil, 0)
	if r := Names(ch.Unread); len(r) == 0 {
		t.Error("no skipped name recorded")
	} else if b, _ := json.Marshal(r); len(b) > MaxListedBytes {
		t.Errorf("a download's skipped names take %d bytes of its record", len(b))
	}
}
