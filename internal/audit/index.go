package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// Index finds one tenant's records in the log without reading the
// others': a file per tenant in the log's index/ directory lists where
// each of its records is (segment, offset, length, seq, hash). It is
// brought up to date at each read by indexing only what was appended
// since the last one (index/state says how far it went). It is a cache,
// not evidence: every record read through it must be at its place with
// the seq, hash and tenant the index gives, and its hash must be its own
// (the chain's check, record by record); a mismatch fails the read and
// discards the index, which the next read rebuilds. One Index serves one
// process; it is safe for concurrent use.
type Index struct {
	dir string // the log's
	mu  sync.Mutex
}

// NewIndex returns the index of the log in dir.
func NewIndex(dir string) *Index { return &Index{dir: dir} }

// ErrIndexMismatch says the index and the log disagree.
var ErrIndexMismatch = errors.New("the audit index does not match the log")

type indexState struct {
	Segment string `json:"segment"` // base name of the last segment indexed
	Offset  int64  `json:"offset"`  // bytes of it indexed (whole lines)
}

type indexEntry struct {
	segment     string
	offset, len int64
	seq         uint64
	hash        string
}

func (x *Index) path(name string) string { return filepath.Join(x.dir, "index", name) }

func tenantFile(tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return hex.EncodeToString(sum[:16]) + ".idx"
}

// ReadTenant calls fn for every record of tenant, in order. An index
// found not to match the log before any record was given to fn is
// rebuilt once, from the log.
func (x *Index) ReadTenant(ctx context.Context, tenant string, fn func(*Record) error) error {
	given := 0
	err := x.readTenant(ctx, tenant, func(r *Record) error { given++; return fn(r) })
	if errors.Is(err, ErrIndexMismatch) && given == 0 {
		err = x.readTenant(ctx, tenant, fn)
	}
	return err
}

func (x *Index) readTenant(ctx context.Context, tenant string, fn func(*Record) error) error {
	x.mu.Lock()
	err := x.update()
	var entries []indexEntry
	if err == nil {
		entries, err = x.entries(tenant)
	}
	x.mu.Unlock()
	if err != nil {
		return err
	}
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		f, ok := files[e.segment]
		if !ok {
			var err error
			f, err = os.Open(filepath.Join(x.dir, e.segment))
			if errors.Is(err, os.ErrNotExist) {
				continue // a segment removed from the log
			}
			if err != nil {
				return err
			}
			files[e.segment] = f
		}
		r, err := readAt(f, e)
		if err == nil && r.Tenant != tenant {
			err = fmt.Errorf("%w: seq %d is not tenant %s's", ErrIndexMismatch, e.seq, tenant)
		}
		if err != nil {
			x.discard()
			return err
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// readAt reads the record e points at and checks it is the one e names,
// and whole.
func readAt(f *os.File, e indexEntry) (*Record, error) {
	buf := make([]byte, e.len)
	if _, err := f.ReadAt(buf, e.offset); err != nil {
		return nil, fmt.Errorf("%w: seq %d: %v", ErrIndexMismatch, e.seq, err)
	}
	var r Record
	if err := json.Unmarshal(buf, &r); err != nil {
		return nil, fmt.Errorf("%w: seq %d: %v", ErrIndexMismatch, e.seq, err)
	}
	h, err := r.digest()
	if err != nil || h != r.Hash || r.Hash != e.hash || r.Seq != e.seq {
		return nil, fmt.Errorf("%w: seq %d at %s:%d (run airlock audit verify)", ErrIndexMismatch, e.seq, e.segment, e.offset)
	}
	return &r, nil
}

// discard removes the index; the next read rebuilds it.
func (x *Index) discard() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.discardLocked()
}

// update indexes what was appended to the log since the last update;
// x.mu is held.
func (x *Index) update() error {
	if err := os.MkdirAll(filepath.Join(x.dir, "index"), 0o700); err != nil {
		return err
	}
	var st indexState
	if b, err := os.ReadFile(x.path("state")); err == nil {
		if json.Unmarshal(b, &st) != nil {
			st = indexState{}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	segs, err := Segments(x.dir)
	if err != nil {
		return err
	}
	add := map[string]*bytes.Buffer{} // tenant file → new lines
	was := st
	for _, p := range segs {
		name := filepath.Base(p)
		if name < st.Segment {
			continue
		}
		from := int64(0)
		if name == st.Segment {
			from = st.Offset
		}
		n, err := indexSegment(p, from, add)
		if err != nil {
			return err
		}
		st = indexState{Segment: name, Offset: n}
	}
	if st == was {
		return nil // nothing appended since
	}
	// Entries first, then how far they go: a crash in between indexes
	// some records twice, and entries() keeps the first.
	for file, b := range add {
		f, err := os.OpenFile(x.path(file), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		_, err = f.Write(b.Bytes())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	b, _ := json.Marshal(st)
	tmp := x.path("state.new")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, x.path("state"))
}

// indexSegment indexes the whole lines of segment p from byte from, and
// returns how far it got.
func indexSegment(p string, from int64, add map[string]*bytes.Buffer) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return from, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return from, err
	}
	name := filepath.Base(p)
	rd := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return from, nil // the end, or a torn last line: not yet
		}
		var r struct {
			Seq    uint64 `json:"seq"`
			Tenant string `json:"tenant"`
			Hash   string `json:"hash"`
		}
		if json.Unmarshal(line, &r) == nil && r.Tenant != "" && !strings.ContainsAny(r.Hash, " \n") {
			file := tenantFile(r.Tenant)
			if add[file] == nil {
				add[file] = &bytes.Buffer{}
			}
			fmt.Fprintf(add[file], "%s %d %d %d %s\n", name, from, len(line), r.Seq, r.Hash)
		}
		from += int64(len(line))
	}
}

// entries lists tenant's index entries in order; x.mu is held.
func (x *Index) entries(tenant string) ([]indexEntry, error) {
	b, err := os.ReadFile(x.path(tenantFile(tenant)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []indexEntry
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		e, ok := parseEntry(line)
		if !ok {
			x.discardLocked()
			return nil, fmt.Errorf("%w: a bad entry in %s", ErrIndexMismatch, tenantFile(tenant))
		}
		if len(out) > 0 && e.seq <= out[len(out)-1].seq {
			continue // indexed twice (a crash between entries and state)
		}
		out = append(out, e)
	}
	return out, nil
}

func (x *Index) discardLocked() { _ = os.RemoveAll(filepath.Join(x.dir, "index")) }

// parseEntry reads one line of a tenant's index file.
func parseEntry(line string) (indexEntry, bool) {
	f := strings.Fields(line)
	if len(f) != 5 || !strings.HasSuffix(f[0], segExt) || filepath.Base(f[0]) != f[0] {
		return indexEntry{}, false
	}
	off, err1 := strconv.ParseInt(f[1], 10, 64)
	n, err2 := strconv.ParseInt(f[2], 10, 64)
	seq, err3 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || off < 0 || n <= 0 || n > 64<<20 {
		return indexEntry{}, false
	}
	return indexEntry{segment: f[0], offset: off, len: n, seq: seq, hash: f[4]}, true
}
