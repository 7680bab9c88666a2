// Package files is the sandbox service's calls on a sandbox's files:
// read, write and edit (scanned for credentials), stat, list, make
// directories, move, remove and watch through its agent, upload a tar
// through it, and download and diff /workspace read from the host; every
// call is recorded. File bodies and archives are streamed, in chunks,
// never whole in the daemon's memory: what bounds them is the sandbox's
// disk (--disk), which fails a write inside with ENOSPC, and a failed
// write or upload changes nothing.
package files

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"path"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/agentpb"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Files is the service's calls on files, on its Core.
type Files struct{ *core.Core }

// New makes the calls on files of c's sandboxes.
func New(c *core.Core) *Files { return &Files{c} }

// Caps on file calls. No byte count is capped: the daemon holds at most a
// chunk of a file at a time, and the sandbox's disk bounds what is
// written into it.
const (
	maxArchiveFiles = 100_000 // entries of one upload
	// streamChunk is how much of a file one message to the agent carries.
	streamChunk = 256 << 10
)

// cleanPath checks a path given for a sandbox's filesystem. Paths are
// resolved by the agent inside the sandbox; this rejects what no file
// there can be called.
func cleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Invalid("path is empty")
	case len(p) > 4096:
		return "", errdefs.Invalid("path is longer than 4096 bytes")
	case strings.ContainsRune(p, 0):
		return "", errdefs.Invalid("path contains a NUL byte")
	}
	if !strings.HasPrefix(p, "/") {
		return p, nil // relative to the user's home, resolved inside
	}
	return path.Clean(p), nil
}

func entry(e *filesystem.EntryInfo) api.FileEntry {
	out := api.FileEntry{Name: e.GetName(), Path: e.GetPath(), Size: e.GetSize(), Mode: e.GetPermissions(), Owner: e.GetOwner(), Group: e.GetGroup(), Modified: e.GetModifiedTime().AsTime()}
	switch {
	case e.SymlinkTarget != nil:
		out.Type, out.Target = "symlink", e.GetSymlinkTarget()
	case e.GetType() == filesystem.FileType_FILE_TYPE_DIRECTORY:
		out.Type = "dir"
	default:
		out.Type = "file"
	}
	return out
}

// ReadFile streams a file of the sandbox to w (at most max bytes when max
// is above 0).
func (s *Files) ReadFile(ctx context.Context, t *tenant.Principal, id, p, user string, w io.Writer, max int64) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	if err := core.ValidUser(user); err != nil {
		return err
	}
	if max < 0 {
		return errdefs.Invalid("max_bytes is negative")
	}
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	stream, err := b.Agent.Files.ReadFile(ctx, connect.NewRequest(&agentpb.ReadFileRequest{Path: p, User: user, MaxBytes: max}))
	if err != nil {
		return core.AgentError(err)
	}
	defer stream.Close()
	var n int64
	dg := record.NewDigester()
	for stream.Receive() {
		d := stream.Msg().GetData()
		if n += int64(len(d)); max > 0 && n > max {
			return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("%s is larger than %d bytes", p, max))
		}
		dg.Add(d)
		if _, err := w.Write(d); err != nil {
			return err
		}
	}
	if err := stream.Err(); err != nil {
		return core.AgentError(err)
	}
	return s.fileRecord(ctx, t, b, record.FileRead{FileCall: fileCall(p, user), Content: dg.Digest()})
}

// fileRecord records one file call on a sandbox once it succeeded.
func (s *Files) fileRecord(ctx context.Context, t *tenant.Principal, b *core.Box, d record.Data) error {
	return s.Cfg.Audit.Commit(ctx, b.WhoFor(t), d)
}

// fileCall is what every file call's record says.
func fileCall(p, user string) record.FileCall {
	return record.FileCall{Path: p, User: core.UserOr(user)}
}

// WriteFile replaces (or creates) a file of the sandbox with what r
// reads, streamed to its agent: the file changes only once r ended
// without error (a failure of r, or of the sandbox's disk, leaves it as it
// was). The head of a text file is scanned for credentials (scanHead).
func (s *Files) WriteFile(ctx context.Context, t *tenant.Principal, id, p, user string, mode fs.FileMode, r io.Reader, parents bool) error {
	_, err := s.WriteFileAt(ctx, t, id, p, user, mode, r, parents)
	return err
}

// WriteFileAt is WriteFile that returns the path the sandbox's agent
// wrote: absolute and clean (a relative path is taken from the user's
// home), as the sandbox reported it ("" when it reported none that a
// file can have).
func (s *Files) WriteFileAt(ctx context.Context, t *tenant.Principal, id, p, user string, mode fs.FileMode, r io.Reader, parents bool) (resolved string, err error) {
	p, err = cleanPath(p)
	if err != nil {
		return "", err
	}
	if err := core.ValidUser(user); err != nil {
		return "", err
	}
	b, err := s.Use(t, id)
	if err != nil {
		return "", err
	}
	// The summary of the scan, once the size of what went unread is
	// known.
	bud := core.NewScanBudget()
	defer func() {
		if serr := s.ScanSummary(ctx, b.WhoFor(t), "write", bud); err == nil {
			err = serr
		}
	}()
	body, unread, err := s.scanHead(ctx, t, b.WhoFor(t), "write", "file "+p, r, bud)
	if err != nil {
		return "", err
	}
	// On a failure on this side the stream ends without its last message:
	// the agent then keeps nothing of it, and answers once it dropped it.
	st := b.Agent.Files.WriteFile(ctx)
	first := &agentpb.WriteFileRequest{Path: p, User: user, Mode: uint32(mode.Perm()), MakeParents: parents}
	dg := record.NewDigester()
	var sent bool
	_, rerr, serr := pump(body, dg, func(d []byte, last bool) error {
		m := first
		if sent {
			m = &agentpb.WriteFileRequest{}
		}
		sent = true
		m.Data, m.Last = d, last
		return st.Send(m)
	})
	if rerr != nil {
		_, _ = st.CloseAndReceive()
		return "", rerr
	}
	res, err := st.CloseAndReceive()
	if serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return "", core.AgentError(err)
	}
	unread()
	return reportedPath(res.Msg.GetPath()), s.fileRecord(ctx, t, b, record.FileWrite{FileCall: fileCall(p, user), Mode: fmt.Sprintf("%o", mode.Perm()), Content: dg.Digest()})
}

// reportedPath is a path the sandbox's agent reported, if it is one a
// file there can have (absolute, clean, at most 4096 bytes, no NUL);
// otherwise "".
func reportedPath(p string) string {
	if len(p) > 4096 || !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsRune(p, 0) {
		return ""
	}
	return p
}

// scanHead scans the head of a file's bytes (what is left of bud, at most
// core.MaxScanBytes) when it is text, as a value read in part when more
// follows, and returns a reader of the whole content: under the redact
// policy with the head redacted, the rest as it was. It holds at most the
// head in memory. unread, called once the rest went through, counts it
// for the call's summary.
func (s *Files) scanHead(ctx context.Context, t *tenant.Principal, who record.Who, call, where string, r io.Reader, bud *core.ScanBudget) (body io.Reader, unread func(), err error) {
	br := bufio.NewReaderSize(r, core.MaxScanBytes+1)
	head, err := br.Peek(core.MaxScanBytes + 1)
	if err != nil && err != io.EOF {
		return nil, nil, readErr(err)
	}
	more := len(head) > core.MaxScanBytes
	head = head[:min(len(head), core.MaxScanBytes)]
	if !isText(head, more) {
		return br, func() {}, nil
	}
	text := string(head)
	if err := s.ScanFields(ctx, t, who, call, []core.Field{{Where: where, Val: &text, More: more}}, bud); err != nil {
		return nil, nil, err
	}
	if _, err := br.Discard(len(head)); err != nil {
		return nil, nil, readErr(err)
	}
	cr := &countReader{r: br}
	return io.MultiReader(strings.NewReader(text), cr), func() { bud.Unread(cr.n) }, nil
}

// isText says whether a file's head is UTF-8 text: valid, but for a rune
// cut at its end when more follows.
func isText(head []byte, more bool) bool {
	if utf8.Valid(head) {
		return true
	}
	for cut := 1; more && cut < utf8.UTFMax && cut <= len(head); cut++ {
		if utf8.Valid(head[:len(head)-cut]) && !utf8.FullRune(head[len(head)-cut:]) {
			return true
		}
	}
	return false
}

// readErr is a failure to read what a client sends (it broke off, or its
// archive is cut short): the request's fault, said as such.
func readErr(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return errdefs.Invalid("reading what was sent: " + err.Error())
}

// countReader counts what it reads.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// pump sends what r reads through send in chunks of streamChunk (at
// least one, the last saying so), adding them to dg. A failure to read r
// is rerr (the caller's side); of send, serr (the agent's: its answer
// says why).
func pump(r io.Reader, dg *record.Digester, send func(d []byte, last bool) error) (n int64, rerr, serr error) {
	buf := make([]byte, streamChunk)
	next := make([]byte, streamChunk)
	fill := func(b []byte) (int, error) {
		k := 0
		for k < len(b) {
			m, err := r.Read(b[k:])
			k += m
			if err != nil {
				return k, err
			}
		}
		return k, nil
	}
	k, err := fill(buf)
	for {
		if err != nil && err != io.EOF {
			return n, readErr(err), nil
		}
		// Read ahead one chunk, to know whether this one is the last.
		var nk int
		var nerr error
		if err == nil {
			nk, nerr = fill(next)
		}
		last := err == io.EOF || (nk == 0 && nerr == io.EOF)
		dg.Add(buf[:k])
		n += int64(k)
		if err := send(buf[:k], last); err != nil {
			return n, nil, err
		}
		if last {
			return n, nil, nil
		}
		buf, next, k, err = next, buf, nk, nerr
	}
}

// Edit replaces one exact, unique occurrence of a string in a file.
func (s *Files) Edit(ctx context.Context, t *tenant.Principal, id string, req *api.Edit) error {
	p, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	if err := core.ValidUser(req.User); err != nil {
		return err
	}
	if req.Old == "" {
		return errdefs.Invalid("old is empty")
	}
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	r := *req
	req = &r
	if err := s.ScanCall(ctx, t, b.WhoFor(t), "edit", []core.Field{{Where: "the new text for " + p, Val: &req.New}}); err != nil {
		return err
	}
	res, err := b.Agent.Files.EditFile(ctx, connect.NewRequest(&agentpb.EditFileRequest{Path: p, Old: req.Old, New: req.New, User: req.User}))
	if err != nil {
		return core.AgentError(err)
	}
	old, new := record.NewDigester(), record.NewDigester()
	old.Add([]byte(req.Old))
	new.Add([]byte(req.New))
	return s.fileRecord(ctx, t, b, record.FileEdit{FileCall: fileCall(p, req.User), Old: old.Digest(), New: new.Digest(), SizeReported: res.Msg.GetSize()})
}

// Stat describes one file.
func (s *Files) Stat(ctx context.Context, t *tenant.Principal, id, p, user string) (*api.FileEntry, error) {
	p, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	b, err := s.Use(t, id)
	if err != nil {
		return nil, err
	}
	res, err := b.Agent.FS.Stat(ctx, core.AsUser(connect.NewRequest(&filesystem.StatRequest{Path: p}), user))
	if err != nil {
		return nil, core.AgentError(err)
	}
	e := entry(res.Msg.GetEntry())
	return &e, s.fileRecord(ctx, t, b, record.FileStat{FileCall: fileCall(p, user)})
}

// ListDir lists a directory, depth levels deep (1: its entries only).
func (s *Files) ListDir(ctx context.Context, t *tenant.Principal, id, p, user string, depth int) ([]api.FileEntry, error) {
	p, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	if depth < 0 || depth > 64 {
		return nil, errdefs.Invalid("depth: 1 to 64")
	}
	b, err := s.Use(t, id)
	if err != nil {
		return nil, err
	}
	res, err := b.Agent.FS.ListDir(ctx, core.AsUser(connect.NewRequest(&filesystem.ListDirRequest{Path: p, Depth: uint32(depth)}), user))
	if err != nil {
		return nil, core.AgentError(err)
	}
	out := make([]api.FileEntry, 0, len(res.Msg.GetEntries()))
	for _, e := range res.Msg.GetEntries() {
		out = append(out, entry(e))
	}
	return out, s.fileRecord(ctx, t, b, record.FileList{FileCall: fileCall(p, user), Depth: depth, Entries: len(out)})
}

// MakeDir creates a directory and its parents.
func (s *Files) MakeDir(ctx context.Context, t *tenant.Principal, id string, req *api.MakeDir) (*api.FileEntry, error) {
	p, err := cleanPath(req.Path)
	if err != nil {
		return nil, err
	}
	b, err := s.Use(t, id)
	if err != nil {
		return nil, err
	}
	res, err := b.Agent.FS.MakeDir(ctx, core.AsUser(connect.NewRequest(&filesystem.MakeDirRequest{Path: p}), req.User))
	if err != nil {
		return nil, core.AgentError(err)
	}
	e := entry(res.Msg.GetEntry())
	return &e, s.fileRecord(ctx, t, b, record.FileMkdir{FileCall: fileCall(p, req.User)})
}

// Move renames a file or directory.
func (s *Files) Move(ctx context.Context, t *tenant.Principal, id string, req *api.Move) (*api.FileEntry, error) {
	from, err := cleanPath(req.From)
	if err != nil {
		return nil, err
	}
	to, err := cleanPath(req.To)
	if err != nil {
		return nil, err
	}
	b, err := s.Use(t, id)
	if err != nil {
		return nil, err
	}
	res, err := b.Agent.FS.Move(ctx, core.AsUser(connect.NewRequest(&filesystem.MoveRequest{Source: from, Destination: to}), req.User))
	if err != nil {
		return nil, core.AgentError(err)
	}
	e := entry(res.Msg.GetEntry())
	return &e, s.fileRecord(ctx, t, b, record.FileMove{FileCall: fileCall(from, req.User), To: to})
}

// Remove deletes a file or a directory tree.
func (s *Files) Remove(ctx context.Context, t *tenant.Principal, id, p, user string) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	if _, err = b.Agent.FS.Remove(ctx, core.AsUser(connect.NewRequest(&filesystem.RemoveRequest{Path: p}), user)); err != nil {
		return core.AgentError(err)
	}
	return s.fileRecord(ctx, t, b, record.FileRemove{FileCall: fileCall(p, user)})
}

var opNames = map[filesystem.EventType]string{
	filesystem.EventType_EVENT_TYPE_CREATE: "create", filesystem.EventType_EVENT_TYPE_WRITE: "write",
	filesystem.EventType_EVENT_TYPE_REMOVE: "remove", filesystem.EventType_EVENT_TYPE_RENAME: "rename",
	filesystem.EventType_EVENT_TYPE_CHMOD: "chmod",
}

// Watch streams changes under a directory until ctx ends: first a start
// event with the path asked for, then each change with its absolute path.
func (s *Files) Watch(ctx context.Context, t *tenant.Principal, id, p, user string, recursive bool, emit func(*api.WatchEvent) error) error {
	return s.watch(ctx, t, id, p, user, recursive, false, emit)
}

// WatchRelative is Watch as E2B's envd tells it: the start event has the
// directory's absolute path as the sandbox resolved it, and each change
// its path relative to that directory.
func (s *Files) WatchRelative(ctx context.Context, t *tenant.Principal, id, p, user string, recursive bool, emit func(*api.WatchEvent) error) error {
	return s.watch(ctx, t, id, p, user, recursive, true, emit)
}

func (s *Files) watch(ctx context.Context, t *tenant.Principal, id, p, user string, recursive, relative bool, emit func(*api.WatchEvent) error) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	stream, err := b.Agent.FS.WatchDir(ctx, core.AsUser(connect.NewRequest(&filesystem.WatchDirRequest{Path: p, Recursive: recursive}), user))
	if err != nil {
		return core.AgentError(err)
	}
	if err := s.fileRecord(ctx, t, b, record.FileWatch{FileCall: fileCall(p, user), Recursive: recursive}); err != nil {
		return err
	}
	defer stream.Close()
	started := false
	root := p
	for stream.Receive() {
		switch e := stream.Msg().GetEvent().(type) {
		case *filesystem.WatchDirResponse_Start:
			started = true
			if relative {
				if root = reportedPath(e.Start.GetPath()); root == "" {
					return errdefs.New(errdefs.ErrInternal, "the sandbox's agent did not report the watched directory (reported by the sandbox)")
				}
			}
			if err := emit(&api.WatchEvent{Op: "start", Path: root}); err != nil {
				return err
			}
		case *filesystem.WatchDirResponse_Filesystem:
			name := e.Filesystem.GetName()
			if len(name) > 4096 {
				continue
			}
			if relative {
				rel, ok := strings.CutPrefix(name, strings.TrimSuffix(root, "/")+"/")
				if !ok || rel == "" {
					continue // not under the watched directory
				}
				name = rel
			}
			if err := emit(&api.WatchEvent{Path: name, Op: opNames[e.Filesystem.GetType()]}); err != nil {
				return err
			}
		}
	}
	if !started {
		return core.AgentError(stream.Err())
	}
	if ctx.Err() != nil {
		return nil
	}
	return core.AgentError(stream.Err())
}

// Upload unpacks a tar stream into the existing directory dir of the
// sandbox, streamed through its agent, all or nothing (the agent's
// Unpack): regular files and directories only, every name kept under dir,
// a directory dir already has merged into, a file replaced. An archive
// that breaks off or is refused midway, or a disk that fills, leaves dir
// as it was. It returns the names it skipped.
func (s *Files) Upload(ctx context.Context, t *tenant.Principal, id, dir, user string, r io.Reader) (skipped []string, err error) {
	dir, err = cleanPath(dir)
	if err != nil {
		return nil, err
	}
	if err := core.ValidUser(user); err != nil {
		return nil, err
	}
	b, err := s.Use(t, id)
	if err != nil {
		return nil, err
	}
	// The archive's text files share one call's scanning budget.
	bud := core.NewScanBudget()
	defer func() {
		if serr := s.ScanSummary(ctx, b.WhoFor(t), "upload", bud); err == nil {
			err = serr
		}
	}()
	// On a failure on this side the stream ends without its end message:
	// the agent then keeps nothing of it, and answers once it removed what
	// it staged.
	st := b.Agent.Files.Unpack(ctx)
	mine := func(err error) ([]string, error) {
		_, _ = st.CloseAndReceive()
		return skipped, err
	}
	agents := func() ([]string, error) {
		_, err := st.CloseAndReceive()
		return skipped, core.AgentError(err)
	}
	entry := func(name string, dir bool, mode int64) error {
		return st.Send(&agentpb.UnpackRequest{Part: &agentpb.UnpackRequest_Entry{Entry: &agentpb.UnpackEntry{Name: name, Dir: dir, Mode: uint32(mode & 0o777)}}})
	}
	if err := st.Send(&agentpb.UnpackRequest{Part: &agentpb.UnpackRequest_Begin{Begin: &agentpb.UnpackBegin{Dir: dir, User: user}}}); err != nil {
		return agents()
	}
	tr := tar.NewReader(r)
	var total int64
	n := 0
	for ; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return mine(errdefs.Invalid("upload: not a tar stream: " + err.Error()))
		}
		if n >= maxArchiveFiles {
			return mine(errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("upload: more than %d entries", maxArchiveFiles)))
		}
		rel := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if rel == "" || strings.ContainsRune(rel, 0) {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := entry(rel, true, h.Mode); err != nil {
				return agents()
			}
		case tar.TypeReg:
			if err := entry(rel, false, h.Mode); err != nil {
				return agents()
			}
			body, unread, err := s.scanHead(ctx, t, b.WhoFor(t), "upload", "file "+path.Join(dir, rel), tr, bud)
			if err != nil {
				return mine(err)
			}
			sent, rerr, serr := pump(body, record.NewDigester(), func(d []byte, _ bool) error {
				if len(d) == 0 {
					return nil
				}
				return st.Send(&agentpb.UnpackRequest{Part: &agentpb.UnpackRequest_Data{Data: d}})
			})
			total += sent
			switch {
			case rerr != nil:
				return mine(rerr)
			case serr != nil:
				return agents()
			}
			unread()
		default:
			skipped = append(skipped, h.Name)
		}
	}
	if err := st.Send(&agentpb.UnpackRequest{Part: &agentpb.UnpackRequest_End{End: true}}); err != nil {
		return agents()
	}
	if _, err := st.CloseAndReceive(); err != nil {
		return skipped, core.AgentError(err)
	}
	return skipped, s.fileRecord(ctx, t, b, record.FileUpload{FileCall: fileCall(dir, user), Entries: n, Bytes: total, Skipped: len(skipped)})
}

// Download streams a tar of /workspace/rel, read from the host by the
// safe-access rules on the frozen sandbox (not through the agent). start
// is called before the first byte, with what the archive leaves out, once
// it is known to fit (past workspace.MaxTarEntries: too_large, nothing
// sent), and returns where the archive goes. The call is recorded before the first
// byte; what was sent is noted after the last (file.sent).
func (s *Files) Download(ctx context.Context, t *tenant.Principal, id, p string, start func(skipped []string) io.Writer) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	rel, ok := strings.CutPrefix(p, "/workspace")
	if !ok || (rel != "" && rel[0] != '/') {
		return errdefs.Invalid("download reads /workspace (or a path under it) from the host; read other files with cat")
	}
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	dg := record.NewDigester()
	var recErr error
	err = b.Inst.Archive(ctx, strings.TrimPrefix(rel, "/"), math.MaxInt64, func(skipped []string) io.Writer {
		if recErr = s.fileRecord(ctx, t, b, record.FileDownload{FileCall: fileCall(p, ""), Skipped: record.Names(skipped)}); recErr != nil {
			return failWriter{recErr} // nothing leaves unrecorded
		}
		return io.MultiWriter(start(skipped), digestWriter{dg})
	})
	if recErr != nil {
		return recErr
	}
	tar := dg.Digest()
	s.Cfg.Audit.Note(b.WhoFor(t), record.FileSent{Op: "download", Path: p, Tar: &tar, Complete: err == nil})
	return err
}

// failWriter refuses every write with its error.
type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

type digestWriter struct{ d *record.Digester }

func (w digestWriter) Write(p []byte) (int, error) { w.d.Add(p); return len(p), nil }

// Diff streams the unified diff of the sandbox's /workspace since creation
// (names only for binary files, deletions and special files), at most
// about workspace's MaxDiffBytes; past it files are named, and the diff
// ends by saying so. The call is recorded before the first byte.
func (s *Files) Diff(ctx context.Context, t *tenant.Principal, id string, w io.Writer) error {
	b, err := s.Use(t, id)
	if err != nil {
		return err
	}
	if err := s.fileRecord(ctx, t, b, record.FileDiff{FileCall: fileCall("/workspace", "")}); err != nil {
		return err
	}
	dg := record.NewDigester()
	err = b.Inst.Diff(ctx, io.MultiWriter(w, digestWriter{dg}))
	patch := dg.Digest()
	s.Cfg.Audit.Note(b.WhoFor(t), record.FileSent{Op: "diff", Path: "/workspace", Patch: &patch, Complete: err == nil})
	return err
}
