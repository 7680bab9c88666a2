package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// headMu guards the heads the tests' logs report (from their writers).
var headMu sync.Mutex

func readHead(h *Head) Head {
	headMu.Lock()
	defer headMu.Unlock()
	return *h
}

func newLog(t *testing.T, opts Options) (*Log, string, ed25519.PrivateKey, *Head) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "audit")
	key, err := LoadOrCreateKey(filepath.Join(t.TempDir(), "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	head := &Head{}
	opts.OnHead = func(h Head) { headMu.Lock(); *head = h; headMu.Unlock() }
	l, err := Open(dir, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l, dir, key, head
}

// writeSome writes n records, some committed, some not, and closes.
func writeSome(t *testing.T, l *Log, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		r := Record{Kind: "exec.start", Tenant: "t", Sandbox: "s", Data: json.RawMessage(`{"argv":["true"]}`)}
		var err error
		if i%2 == 0 {
			err = l.Commit(context.Background(), r)
		} else {
			err = l.Append(r)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestHonestLogVerifies(t *testing.T) {
	l, dir, key, head := newLog(t, Options{SegmentBytes: 2000})
	writeSome(t, l, 50)
	s, err := Verify(dir, key.Public().(ed25519.PublicKey), head, false)
	if err != nil {
		t.Fatal(err)
	}
	if s.Segments < 3 || s.Records < 50 || s.Head != *head {
		t.Errorf("summary %+v, head %+v", s, *head)
	}
	// The chain goes on across a restart (and a new segment).
	l2, err := Open(dir, key, Options{OnHead: func(h Head) { headMu.Lock(); *head = h; headMu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	writeSome(t, l2, 3)
	if _, err := Verify(dir, key.Public().(ed25519.PublicKey), head, false); err != nil {
		t.Fatal(err)
	}
}

// Every kind of tampering fails verification and names the record.
func TestTamperingIsCaught(t *testing.T) {
	cases := map[string]func(lines [][]byte) [][]byte{
		"edit a byte": func(ls [][]byte) [][]byte {
			ls[3] = bytes.Replace(ls[3], []byte(`"true"`), []byte(`"fals"`), 1)
			return ls
		},
		"drop a record":              func(ls [][]byte) [][]byte { return append(ls[:3], ls[4:]...) },
		"swap two":                   func(ls [][]byte) [][]byte { ls[3], ls[4] = ls[4], ls[3]; return ls },
		"truncate mid-segment":       func(ls [][]byte) [][]byte { return ls[:5] },
		"cut the closing checkpoint": func(ls [][]byte) [][]byte { return ls[:len(ls)-1] },
		"forge a checkpoint": func(ls [][]byte) [][]byte {
			var r Record
			_ = json.Unmarshal(ls[len(ls)-1], &r)
			_, other, _ := ed25519.GenerateKey(rand.Reader)
			r.Sig = hexSig(other, r.Hash)
			b, _ := json.Marshal(r)
			ls[len(ls)-1] = b
			return ls
		},
		// A second "kind": Go keeps the last, another reader the first.
		"duplicate a key": func(ls [][]byte) [][]byte {
			ls[3] = bytes.Replace(ls[3], []byte(`"kind":`), []byte(`"kind":"innocent","kind":`), 1)
			return ls
		},
		"rehash an edited record": func(ls [][]byte) [][]byte {
			var r Record
			_ = json.Unmarshal(ls[3], &r)
			r.Kind = "nothing.to.see"
			r.Hash, _ = r.digest()
			b, _ := json.Marshal(r)
			ls[3] = b
			return ls
		},
	}
	for name, tamper := range cases {
		t.Run(name, func(t *testing.T) {
			l, dir, key, head := newLog(t, Options{})
			writeSome(t, l, 10)
			segs, _ := Segments(dir)
			b, _ := os.ReadFile(segs[0])
			lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
			lines = tamper(lines)
			if err := os.WriteFile(segs[0], append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Verify(dir, key.Public().(ed25519.PublicKey), head, false)
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("tampering not caught: %v", err)
			}
			if ve.Line == 0 && !strings.Contains(ve.Reason, "checkpoint") && !strings.Contains(ve.Reason, "head") {
				t.Errorf("the error does not name a record: %v", ve)
			}
		})
	}
	// A clean cut at a record boundary of a segment that did end with a
	// checkpoint: only the head kept apart catches it.
	t.Run("cut a whole segment off the end", func(t *testing.T) {
		l, dir, key, head := newLog(t, Options{SegmentBytes: 1500})
		writeSome(t, l, 30)
		segs, _ := Segments(dir)
		_ = os.Remove(segs[len(segs)-1])
		if _, err := Verify(dir, key.Public().(ed25519.PublicKey), nil, false); err != nil {
			t.Fatalf("without the head the cut log looks whole (expected): %v", err)
		}
		if _, err := Verify(dir, key.Public().(ed25519.PublicKey), head, false); err == nil {
			t.Fatal("a log cut at a segment boundary passed against its head")
		}
	})
}

func hexSig(k ed25519.PrivateKey, h string) string {
	return hex.EncodeToString(ed25519.Sign(k, []byte(h)))
}

// A crash mid-write leaves a torn line; the next writer cuts it off and
// closes the segment with a recovery checkpoint, and the log verifies.
func TestResumeAfterCrash(t *testing.T) {
	l, dir, key, head := newLog(t, Options{})
	for i := 0; i < 5; i++ {
		if err := l.Commit(context.Background(), Record{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	// "Crash": no Close; a torn write at the end.
	segs, _ := Segments(dir)
	f, _ := os.OpenFile(segs[0], os.O_WRONLY|os.O_APPEND, 0)
	_, _ = f.WriteString(`{"seq":6,"kind":"tor`)
	f.Close()
	// The head follows the log: wait until it shows what was acknowledged.
	var acked Head
	for i := 0; i < 200 && acked.Seq < 5; i++ {
		time.Sleep(5 * time.Millisecond)
		acked = readHead(head)
	}
	l2, err := Open(dir, key, Options{OnHead: func(h Head) { headMu.Lock(); *head = h; headMu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Commit(context.Background(), Record{Kind: "after"}); err != nil {
		t.Fatal(err)
	}
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Verify(dir, key.Public().(ed25519.PublicKey), head, false)
	if err != nil {
		t.Fatal(err)
	}
	if acked.Seq != 5 || s.Records != 5+1+1+1 {
		t.Errorf("acked %+v, summary %+v", acked, s)
	}
}

func TestCommitFailsWhenTheDiskDoes(t *testing.T) {
	l, _, _, _ := newLog(t, Options{})
	l.seg.Close() // writes fail from now on, as on a full or lost disk
	err := l.Commit(context.Background(), Record{Kind: "k"})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("commit on a broken disk: %v", err)
	}
	if err := l.Append(Record{Kind: "k"}); !errors.Is(err, ErrFailed) {
		t.Fatalf("later appends must be refused: %v", err)
	}
}

func TestRotationByAge(t *testing.T) {
	l, dir, key, head := newLog(t, Options{SegmentAge: time.Nanosecond})
	writeSome(t, l, 6)
	s, err := Verify(dir, key.Public().(ed25519.PublicKey), head, false)
	if err != nil {
		t.Fatal(err)
	}
	if s.Segments < 2 {
		t.Errorf("no rotation by age: %+v", s)
	}
}

// Records on disk go to an OTLP collector too, with their seq and hash.
func TestExportToCollector(t *testing.T) {
	var mu sync.Mutex
	var got []map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/logs" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad", 400)
			return
		}
		var body struct {
			ResourceLogs []struct {
				ScopeLogs []struct {
					LogRecords []map[string]any `json:"logRecords"`
				} `json:"scopeLogs"`
			} `json:"resourceLogs"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		for _, rl := range body.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				got = append(got, sl.LogRecords...)
			}
		}
		mu.Unlock()
	}))
	defer srv.Close()
	exp := NewExporter(srv.URL)
	l, _, _, head := newLog(t, Options{Export: exp})
	writeSome(t, l, 4)
	exp.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 5 || exp.Dropped() != 0 || exp.Failed() != 0 {
		t.Fatalf("exported %d records (dropped %d, failed %d)", len(got), exp.Dropped(), exp.Failed())
	}
	last, _ := json.Marshal(got[len(got)-1]["attributes"])
	if !strings.Contains(string(last), head.Hash) {
		t.Errorf("the collector's last record does not carry the head %s: %s", head.Hash, last)
	}
}

// FuzzVerifyCatchesEveryEdit: any one byte changed anywhere in an honest
// log makes verification fail.
func FuzzVerifyCatchesEveryEdit(f *testing.F) {
	dir := f.TempDir()
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	l, err := Open(filepath.Join(dir, "log"), key, Options{})
	if err != nil {
		f.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if err := l.Commit(context.Background(), Record{Kind: "exec.start", Tenant: "t", Data: json.RawMessage(`{"argv":["a","b"],"n":1}`)}); err != nil {
			f.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		f.Fatal(err)
	}
	segs, _ := Segments(filepath.Join(dir, "log"))
	honest, _ := os.ReadFile(segs[0])
	pub := key.Public().(ed25519.PublicKey)
	f.Add(uint16(10), byte('x'))
	f.Add(uint16(200), byte('"'))
	f.Fuzz(func(t *testing.T, at uint16, b byte) {
		i := int(at) % len(honest)
		if honest[i] == b {
			return
		}
		edited := bytes.Clone(honest)
		edited[i] = b
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "00000001.log"), edited, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Verify(d, pub, nil, false); err == nil {
			t.Fatalf("byte %d changed to %q and the log still verifies", i, b)
		}
	})
}

// A record longer than any line buffer (a sandbox's names can make one:
// a destroy record lists up to 1000 changed paths and link targets of
// 4 KiB each, JSON-escaped six-fold) survives a restart, and so does
// everything after it: resuming the chain must not cut the segment at a
// line it merely found long.
func TestResumeKeepsLongRecords(t *testing.T) {
	l, dir, key, head := newLog(t, Options{})
	if err := l.Commit(context.Background(), Record{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	long, _ := json.Marshal(map[string]string{"path": strings.Repeat("\x01", 3<<20)}) // 18 MiB escaped
	if err := l.Commit(context.Background(), Record{Kind: "long", Data: long}); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(context.Background(), Record{Kind: "after"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := Open(dir, key, Options{OnHead: func(h Head) { headMu.Lock(); *head = h; headMu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Commit(context.Background(), Record{Kind: "restarted"}); err != nil {
		t.Fatal(err)
	}
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Verify(dir, key.Public().(ed25519.PublicKey), head, false)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	segs, _ := Segments(dir)
	for _, p := range segs {
		if _, err := readSegment(p, 0, func(r *Record) error { kinds = append(kinds, r.Kind); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	got := strings.Join(kinds, " ")
	if !strings.Contains(got, "before long after") || !strings.Contains(got, "restarted") {
		t.Errorf("records after the restart: %s (summary %+v)", got, s)
	}
}

// A queued record has its place in the chain at once, before a record
// appended after it, and is on disk when its durable returns, without
// waiting for the flush interval.
func TestQueuedRecordIsInOrderAndDurableWhenSaid(t *testing.T) {
	l, dir, _, _ := newLog(t, Options{FlushInterval: time.Hour})
	defer l.Close()
	durable, err := l.Queue(Record{Kind: "sandbox.created", Sandbox: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append(Record{Kind: "egress", Sandbox: "s"}); err != nil {
		t.Fatal(err)
	}
	if err := durable(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, segName(1)))
	if err != nil {
		t.Fatal(err)
	}
	var first Record
	line, _, _ := bytes.Cut(b, []byte("\n"))
	if err := json.Unmarshal(line, &first); err != nil || first.Kind != "sandbox.created" || first.Seq != 1 {
		t.Fatalf("first record on disk: %+v %v (%q)", first, err, b)
	}
}

// An anchor (a head read earlier and kept elsewhere) holds the log to
// what was seen: the log that holds it verifies; one cut below it, or
// rewritten before it with a chain made whole again, verifies without the
// anchor (an open segment, no head kept apart) and fails with it.
func TestAnchorHoldsTheLogToWhatWasSeen(t *testing.T) {
	l, dir, key, head := newLog(t, Options{})
	pub := key.Public().(ed25519.PublicKey)
	for range 10 {
		if err := l.Commit(context.Background(), Record{Kind: "exec.start", Data: json.RawMessage(`{"argv":["true"]}`)}); err != nil {
			t.Fatal(err)
		}
	}
	anchor := l.Head()
	if anchor.Seq != 10 || anchor.Hash == "" {
		t.Fatalf("head after ten committed records: %+v", anchor)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readHead(head); got.Seq != 11 || l.Head() != got {
		t.Errorf("head after close %+v, told %+v; want the closing checkpoint's, seq 11", l.Head(), got)
	}
	if _, err := VerifyAnchored(dir, pub, nil, false, &anchor); err != nil {
		t.Fatalf("the intact log: %v", err)
	}
	if _, err := VerifyAnchored(dir, pub, nil, false, &Head{Seq: 12, Hash: anchor.Hash}); err == nil {
		t.Error("an anchor past the log's end verified")
	}
	segs, err := Segments(dir)
	if err != nil || len(segs) != 1 {
		t.Fatal(segs, err)
	}
	orig, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(orig, []byte("\n"))
	lines = lines[:10] // the ten records; the checkpoint is cut: an open segment
	cases := map[string][][]byte{
		"cut below the anchor": lines[:6],
		"rewritten before the anchor": func() [][]byte {
			out := make([][]byte, len(lines))
			prev := ""
			for i, ln := range lines {
				var r Record
				if err := json.Unmarshal(ln, &r); err != nil {
					t.Fatal(err)
				}
				if i == 3 {
					r.Data = json.RawMessage(`{"argv":["false"]}`)
				}
				if i > 0 {
					r.Prev = prev
				}
				r.Hash, _ = r.digest()
				prev = r.Hash
				b, _ := json.Marshal(&r)
				out[i] = append(b, '\n')
			}
			return out
		}(),
	}
	for name, ls := range cases {
		if err := os.WriteFile(segs[0], bytes.Join(ls, nil), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Verify(dir, pub, nil, true); err != nil {
			t.Fatalf("%s: the chain itself should hold (the anchor alone can tell): %v", name, err)
		}
		_, err := VerifyAnchored(dir, pub, nil, true, &anchor)
		var ve *VerifyError
		if !errors.As(err, &ve) {
			t.Errorf("%s: verified against the anchor: %v", name, err)
			continue
		}
		t.Logf("%s: %v", name, ve)
	}
}
