package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// VerifyError names the first record that does not hold.
type VerifyError struct {
	File   string
	Line   int
	Seq    uint64 // of the record at fault (0 if it could not be read)
	Reason string
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("%s:%d (seq %d): %s", filepath.Base(e.File), e.Line, e.Seq, e.Reason)
}

// Summary is what a verified log holds.
type Summary struct {
	Segments    int
	Records     uint64
	Checkpoints int
	Head        Head
}

// Verify checks the log in dir: every record parses, its sequence number
// follows the last, it carries the previous record's hash and its own
// hash is right; every checkpoint is signed by pub; every segment but the
// newest ends with a checkpoint; and, when head is given (kept apart from
// the log), the log ends exactly there, so a log cut cleanly at a record
// boundary fails too. open says the newest segment may still be written to
// (a live daemon's); otherwise it must end with a checkpoint as well.
func Verify(dir string, pub ed25519.PublicKey, head *Head, open bool) (*Summary, error) {
	return VerifyAnchored(dir, pub, head, open, nil)
}

// VerifyAnchored is Verify, and when anchor is given (a head read from
// the daemon earlier and kept elsewhere: GET /v1/node's audit_head),
// the log must hold record anchor.Seq with hash anchor.Hash: a log cut
// below the anchor, or rewritten at or before it (however well its chain
// was remade), fails.
func VerifyAnchored(dir string, pub ed25519.PublicKey, head *Head, open bool, anchor *Head) (*Summary, error) {
	segs, err := Segments(dir)
	if err != nil {
		return nil, err
	}
	if len(segs) == 0 {
		return nil, &VerifyError{File: dir, Reason: "no audit segments"}
	}
	s := &Summary{Segments: len(segs)}
	var prev string
	var seq uint64
	var atHead, atAnchor string // the hashes of the records at head.Seq and anchor.Seq
	seen := func(r *Record) {
		if head != nil && r.Seq == head.Seq {
			atHead = r.Hash
		}
		if anchor != nil && r.Seq == anchor.Seq {
			atAnchor = r.Hash
		}
	}
	for i, path := range segs {
		last, err := verifySegment(path, pub, &prev, &seq, s, seen)
		if err != nil {
			return nil, err
		}
		newest := i == len(segs)-1
		if (!newest || !open) && (last == nil || last.Kind != KindCheckpoint) {
			return nil, &VerifyError{File: path, Seq: seq, Reason: "the segment does not end with a signed checkpoint (truncated?)"}
		}
	}
	s.Head = Head{Seq: seq, Hash: prev}
	// The head kept apart is written after each batch is on disk, so the
	// log may run past it (a crash in between), never stop short of it.
	switch {
	case head == nil || head.Seq == 0:
	case seq < head.Seq:
		return nil, &VerifyError{File: segs[len(segs)-1], Seq: seq, Reason: fmt.Sprintf("the log ends at seq %d but its head, kept apart, is seq %d: records were removed from the end", seq, head.Seq)}
	case atHead != head.Hash:
		return nil, &VerifyError{File: segs[len(segs)-1], Seq: head.Seq, Reason: "the record at the head kept apart has another hash: the log was rewritten"}
	}
	switch {
	case anchor == nil:
	case seq < anchor.Seq:
		return nil, &VerifyError{File: segs[len(segs)-1], Seq: seq, Reason: fmt.Sprintf("the log ends at seq %d, before the anchor's seq %d: records were removed from the end", seq, anchor.Seq)}
	case atAnchor != anchor.Hash:
		return nil, &VerifyError{File: segs[len(segs)-1], Seq: anchor.Seq, Reason: fmt.Sprintf("the record at the anchor's seq %d has another hash than the anchor: the log was rewritten", anchor.Seq)}
	}
	return s, nil
}

func verifySegment(path string, pub ed25519.PublicKey, prev *string, seq *uint64, s *Summary, seen func(*Record)) (*Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rd := bufio.NewReaderSize(f, 1<<20)
	var last *Record
	for line := 1; ; line++ {
		bad := func(r *Record, why string) error {
			var n uint64
			if r != nil {
				n = r.Seq
			}
			return &VerifyError{File: path, Line: line, Seq: n, Reason: why}
		}
		raw, err := rd.ReadBytes('\n')
		if err == io.EOF && len(raw) == 0 {
			return last, nil
		}
		if err == io.EOF {
			return nil, bad(nil, "the last line is cut short (no newline)")
		}
		if err != nil {
			return nil, err
		}
		raw = raw[:len(raw)-1]
		var r Record
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, bad(nil, "not a record: "+err.Error())
		}
		// Only the canonical form is a record: a line another JSON reader
		// could read differently (a duplicate key, a key in other case,
		// extra fields) is not one, whatever its hash.
		if canon, err := json.Marshal(&r); err != nil || !bytes.Equal(canon, raw) {
			return nil, bad(&r, "not in canonical form (edited)")
		}
		switch {
		case r.Seq != *seq+1:
			return nil, bad(&r, fmt.Sprintf("sequence %d follows %d (a record was removed, or records reordered)", r.Seq, *seq))
		case r.Prev != *prev:
			return nil, bad(&r, "its previous-record hash does not match the record before it")
		}
		h, err := r.digest()
		if err != nil {
			return nil, bad(&r, err.Error())
		}
		if h != r.Hash {
			return nil, bad(&r, "its hash does not match its contents (edited)")
		}
		if r.Kind == KindCheckpoint {
			sig, err := hex.DecodeString(r.Sig)
			if err != nil || hex.EncodeToString(sig) != r.Sig || !ed25519.Verify(pub, []byte(r.Hash), sig) {
				return nil, bad(&r, "the checkpoint's signature is not the audit key's (forged)")
			}
			s.Checkpoints++
		} else if r.Sig != "" {
			return nil, bad(&r, "a signature on a record that is not a checkpoint")
		}
		*seq, *prev = r.Seq, r.Hash
		seen(&r)
		s.Records++
		last = &r
	}
}
