// Package audit is the tamper-evident record of everything sandboxes did:
// append-only segment files of JSON lines, each record carrying the hash of
// the one before it, each segment closed by a checkpoint signed with the
// daemon's ed25519 key. One writer appends with group commit: a record the
// caller waits for is fsynced before Commit returns; others are written in
// batches at most FlushInterval apart. Verify checks chain, order,
// signatures and completeness. It imports only the standard library.
package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Sources of a record's facts.
const (
	Observed = "observed" // seen by the host itself: API calls, cgroup kills, egress
	Reported = "reported" // told by the sandbox's agent: its processes and their ends
)

// KindCheckpoint is a signed checkpoint closing a segment (or a run).
const KindCheckpoint = "checkpoint"

// Record is one line of the log.
type Record struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Tenant  string    `json:"tenant,omitempty"`
	Sandbox string    `json:"sandbox,omitempty"`
	Trigger string    `json:"trigger,omitempty"`
	// Actor is who made the call when it is not the tenant's own key:
	// "admin" for the admin key.
	Actor  string          `json:"actor,omitempty"`
	Source string          `json:"source"`
	Data   json.RawMessage `json:"data,omitempty"`
	Prev   string          `json:"prev"`
	Hash   string          `json:"hash"`
	Sig    string          `json:"sig,omitempty"` // checkpoints: ed25519 over Hash
}

// digest is the record's hash: SHA-256 of its JSON without Hash and Sig.
func (r *Record) digest() (string, error) {
	c := *r
	c.Hash, c.Sig = "", ""
	b, err := json.Marshal(&c)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// Head is the last record written: kept apart from the log (the daemon's
// database), it catches a log cut cleanly at a record boundary.
type Head struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// Options configure a Log.
type Options struct {
	// SegmentBytes rotates to a new segment past this size (default 64 MiB);
	// SegmentAge past this age (default a day).
	SegmentBytes int64
	SegmentAge   time.Duration
	// FlushInterval bounds how long a record nobody waits for stays
	// unwritten (default 100 ms): the loss window of a crash.
	FlushInterval time.Duration
	// OnHead is told the head after every batch is on disk.
	OnHead func(Head)
	// Export, when set, receives every batch once it is on disk.
	Export *Exporter
}

// Log appends records to segment files in a directory.
type Log struct {
	dir  string
	key  ed25519.PrivateKey
	opts Options

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*Record
	waiters  []chan error // of the queued records that are waited for
	seq      uint64       // last assigned
	prev     string       // hash of the last assigned record
	failed   error        // the log cannot be written: refuse work
	closing  bool
	closeErr error // the closing checkpoint could not be made
	head     Head  // the last record on disk (Head)
	due      bool  // FlushInterval passed: write what is queued
	done     chan struct{}

	seg     *os.File
	segSize int64
	segOpen time.Time
	segNo   int
	single  string // the one file of a single-file log
}

// OpenFile starts a log that is one new file (an `airlock run`'s): no
// rotation; Close ends it with the signed closing checkpoint.
func OpenFile(path string, key ed25519.PrivateKey, opts Options) (*Log, error) {
	if opts.FlushInterval == 0 {
		opts.FlushInterval = 100 * time.Millisecond
	}
	opts.SegmentBytes, opts.SegmentAge = 1<<62, 1<<62
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	l := &Log{dir: filepath.Dir(path), key: key, opts: opts, done: make(chan struct{}), single: path}
	l.cond = sync.NewCond(&l.mu)
	if err := l.openSegment(); err != nil {
		return nil, err
	}
	go l.run()
	return l, nil
}

// ErrFailed wraps the error that stopped the log (a full disk, say).
var ErrFailed = errors.New("the audit log cannot be written")

const segExt = ".log"

func segName(n int) string { return fmt.Sprintf("%08d%s", n, segExt) }

// Segments lists dir's segment files in order; a log that is one file
// (an `airlock run`'s) is its own only segment.
func Segments(dir string) ([]string, error) {
	if fi, err := os.Stat(dir); err == nil && fi.Mode().IsRegular() {
		return []string{dir}, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), segExt) && !e.IsDir() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// Open opens the log in dir (root-only), continuing the chain of what is
// there. It does not check the old records (Verify does).
func Open(dir string, key ed25519.PrivateKey, opts Options) (*Log, error) {
	if opts.SegmentBytes == 0 {
		opts.SegmentBytes = 64 << 20
	}
	if opts.FlushInterval == 0 {
		opts.FlushInterval = 100 * time.Millisecond
	}
	if opts.SegmentAge == 0 {
		opts.SegmentAge = 24 * time.Hour
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	l := &Log{dir: dir, key: key, opts: opts, done: make(chan struct{})}
	l.cond = sync.NewCond(&l.mu)
	segs, err := Segments(dir)
	if err != nil {
		return nil, err
	}
	l.segNo = 1
	if len(segs) > 0 {
		if err := l.resume(segs[len(segs)-1]); err != nil {
			return nil, err
		}
	}
	if err := l.openSegment(); err != nil {
		return nil, err
	}
	go l.run()
	return l, nil
}

// resume continues the chain after the last segment an earlier writer
// left. A torn last line (a crash mid-write: never acknowledged) is cut
// off; a segment the writer did not close gets its checkpoint now, marked
// as a recovery. The next records go to a new segment.
func (l *Log) resume(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var last *Record
	var good int64
	// Lines are read whole, however long: a record is as long as its data
	// (a sandbox's names can make it tens of MiB), and cutting at a line
	// merely found long would delete it and every record after it, with a
	// chain that still verifies.
	rd := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := rd.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			break // a torn last line (no newline) is not kept
		}
		if err != nil {
			return err
		}
		var r Record
		if json.Unmarshal(line, &r) != nil {
			break
		}
		last = &r
		good += int64(len(line))
	}
	if err := f.Truncate(good); err != nil {
		return err
	}
	if _, err := fmt.Sscanf(filepath.Base(path), "%08d", &l.segNo); err != nil {
		return fmt.Errorf("audit segment %s: %v", path, err)
	}
	l.segNo++
	if last == nil {
		return nil
	}
	l.seq, l.prev = last.Seq, last.Hash
	l.head = Head{Seq: last.Seq, Hash: last.Hash}
	if last.Kind == KindCheckpoint {
		return nil
	}
	cp, err := l.checkpoint(map[string]bool{"recovered": true})
	if err != nil {
		return err
	}
	b, _ := json.Marshal(cp)
	if _, err := f.WriteAt(append(b, '\n'), good); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	l.head = Head{Seq: cp.Seq, Hash: cp.Hash}
	return nil
}

func (l *Log) openSegment() error {
	p := filepath.Join(l.dir, segName(l.segNo))
	if l.single != "" {
		p = l.single
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	l.seg, l.segSize, l.segOpen = f, 0, time.Now()
	return nil
}

// assign gives r its place in the chain; l.mu is held.
func (l *Log) assign(r *Record) error {
	if l.failed != nil {
		return l.failed
	}
	if l.closing {
		return fmt.Errorf("%w: closed", ErrFailed)
	}
	l.seq++
	r.Seq, r.Prev = l.seq, l.prev
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	if r.Source == "" {
		r.Source = Observed
	}
	h, err := r.digest()
	if err != nil {
		return err
	}
	r.Hash = h
	l.prev = h
	return nil
}

// Append queues a record nobody waits for; it is on disk within
// FlushInterval. It fails only when the log has failed.
func (l *Log) Append(r Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.assign(&r); err != nil {
		return err
	}
	l.queue = append(l.queue, &r)
	return nil
}

// Commit appends a record and returns once it (and everything before it)
// is on disk. Records committed together share one fsync.
func (l *Log) Commit(ctx context.Context, r Record) error {
	ch, err := l.queueWaited(r)
	if err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Queue appends a record as Commit does (its place in the chain is
// taken now, and the writer is woken for it) without waiting: durable
// returns once it, and everything before it, is on disk. Only one
// caller may call durable, once.
func (l *Log) Queue(r Record) (durable func() error, err error) {
	ch, err := l.queueWaited(r)
	if err != nil {
		return nil, err
	}
	return func() error { return <-ch }, nil
}

// queueWaited assigns r, queues it with a waiter and wakes the writer;
// the channel gets the outcome of r's batch.
func (l *Log) queueWaited(r Record) (chan error, error) {
	ch := make(chan error, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.assign(&r); err != nil {
		return nil, err
	}
	l.queue = append(l.queue, &r)
	l.waiters = append(l.waiters, ch)
	l.cond.Signal()
	return ch, nil
}

// Head is the last record on disk (zero: none yet): what a copy of the
// log kept elsewhere can be anchored to (VerifyAnchored).
func (l *Log) Head() Head {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head
}

// Failed reports why the log stopped, or nil.
func (l *Log) Failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed
}

// run is the one writer: it takes what is queued, writes it, fsyncs once,
// and answers every waiter of the batch. Records nobody waits for go out
// at the next tick.
func (l *Log) run() {
	defer close(l.done)
	stop := make(chan struct{})
	defer close(stop)
	// The head kept apart follows the log (it may lag it, never lead it)
	// from a goroutine of its own: only the newest matters, and the writer
	// must not wait for the database between batches.
	heads := make(chan Head, 1)
	headsDone := make(chan struct{})
	go func() {
		defer close(headsDone)
		for h := range heads {
			if l.opts.OnHead != nil {
				l.opts.OnHead(h)
			}
		}
	}()
	defer func() { close(heads); <-headsDone }()
	go func() {
		tick := time.NewTicker(l.opts.FlushInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				l.mu.Lock()
				l.due = true
				l.cond.Signal()
				l.mu.Unlock()
			}
		}
	}()
	for {
		l.mu.Lock()
		for len(l.waiters) == 0 && !l.closing && !(l.due && len(l.queue) > 0) {
			l.cond.Wait()
		}
		batch, waiters, closing := l.queue, l.waiters, l.closing
		l.queue, l.waiters, l.due = nil, nil, false
		if closing && l.failed == nil {
			// The closing checkpoint goes out with the last batch: one
			// write, one fsync.
			l.closing = false // the checkpoint is the last record
			cp, err := l.checkpoint(map[string]bool{"closed": true})
			l.closing = true
			if err != nil {
				l.closeErr = err
			} else {
				batch = append(batch, cp)
			}
		}
		l.mu.Unlock()
		head, err := l.write(batch, closing)
		if err == nil && head != nil {
			// Before the waiters hear: a record committed is within Head.
			l.mu.Lock()
			l.head = *head
			l.mu.Unlock()
		}
		for _, w := range waiters {
			w <- err
		}
		if err == nil && l.opts.Export != nil && len(batch) > 0 {
			out := make([]Record, len(batch))
			for i, r := range batch {
				out[i] = *r
			}
			l.opts.Export.Export(out)
		}
		if err == nil && head != nil {
			select {
			case heads <- *head:
			default:
				// One is pending: replace it with this newer one.
				select {
				case <-heads:
				default:
				}
				heads <- *head
			}
		}
		if closing {
			return
		}
	}
}

// write writes batch and fsyncs once; the last batch (closing) ends the
// log and never rotates it.
func (l *Log) write(batch []*Record, closing bool) (*Head, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	var buf bytes.Buffer
	for _, r := range batch {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	_, err := l.seg.Write(buf.Bytes())
	if err == nil {
		err = l.seg.Sync()
	}
	if err != nil {
		l.mu.Lock()
		if l.failed == nil {
			l.failed = fmt.Errorf("%w: %v", ErrFailed, err)
		}
		l.mu.Unlock()
		return nil, l.Failed()
	}
	l.segSize += int64(buf.Len())
	last := batch[len(batch)-1]
	if !closing && (l.segSize >= l.opts.SegmentBytes || time.Since(l.segOpen) >= l.opts.SegmentAge) {
		return l.rotate()
	}
	return &Head{Seq: last.Seq, Hash: last.Hash}, nil
}

// checkpoint makes the signed record that closes a segment; l.mu is held
// (or the writer is not running yet).
func (l *Log) checkpoint(data any) (*Record, error) {
	r := &Record{Kind: KindCheckpoint, Source: Observed}
	if data != nil {
		b, err := json.Marshal(data)
		if err != nil {
			return nil, err
		}
		r.Data = b
	}
	if err := l.assign(r); err != nil {
		return nil, err
	}
	r.Sig = hex.EncodeToString(ed25519.Sign(l.key, []byte(r.Hash)))
	return r, nil
}

// rotate closes the segment with a checkpoint and starts the next one;
// the chain runs on across segments.
func (l *Log) rotate() (*Head, error) {
	l.mu.Lock()
	cp, err := l.checkpoint(nil)
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := l.writeOne(cp); err != nil {
		return nil, err
	}
	l.seg.Close()
	l.segNo++
	return &Head{Seq: cp.Seq, Hash: cp.Hash}, l.openSegment()
}

func (l *Log) writeOne(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := l.seg.Write(append(b, '\n')); err != nil {
		return err
	}
	if err := l.seg.Sync(); err != nil {
		return err
	}
	if l.opts.Export != nil {
		l.opts.Export.Export([]Record{*r})
	}
	return nil
}

// Close writes what is queued and a closing checkpoint, together (the
// writer's last batch), and hands the checkpoint's head to OnHead.
func (l *Log) Close() error {
	l.mu.Lock()
	l.closing = true
	l.cond.Signal()
	l.mu.Unlock()
	<-l.done
	l.mu.Lock()
	failed, err := l.failed, l.closeErr
	l.mu.Unlock()
	if failed != nil {
		l.seg.Close()
		return failed
	}
	if err != nil {
		l.seg.Close()
		return err
	}
	return l.seg.Close()
}

// LoadOrCreateKey reads the ed25519 signing key at path (PEM), making one
// (root-only) on first use.
func LoadOrCreateKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		blk, _ := pem.Decode(b)
		if blk == nil || blk.Type != "AIRLOCK AUDIT KEY" || len(blk.Bytes) != ed25519.SeedSize {
			return nil, fmt.Errorf("audit key %s: not an airlock audit key", path)
		}
		return ed25519.NewKeyFromSeed(blk.Bytes), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "AIRLOCK AUDIT KEY", Bytes: priv.Seed()})
	tmp := path + ".new"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return nil, err
	}
	return priv, os.Rename(tmp, path)
}

// PublicKeyPEM is the public half of key, for `airlock audit pubkey`.
func PublicKeyPEM(key ed25519.PrivateKey) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "AIRLOCK AUDIT PUBLIC KEY", Bytes: key.Public().(ed25519.PublicKey)})
}

// ParsePublicKey reads a PublicKeyPEM.
func ParsePublicKey(b []byte) (ed25519.PublicKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "AIRLOCK AUDIT PUBLIC KEY" || len(blk.Bytes) != ed25519.PublicKeySize {
		return nil, errors.New("not an airlock audit public key")
	}
	return ed25519.PublicKey(blk.Bytes), nil
}
