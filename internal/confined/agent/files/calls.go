package files

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/agentpb"
)

// Calls are airlock's own file calls of the Agent service: read, write
// and edit a whole file, as the user a request names.
type Calls struct{ users Users }

// NewCalls makes the calls for users.
func NewCalls(users Users) *Calls { return &Calls{users: users} }

// path is the user a request names and its path resolved for that user.
func (s *Calls) path(user, p string) (User, string, error) {
	u, err := s.users.Lookup(user)
	if err != nil {
		return User{}, "", err
	}
	p, err = Resolve(u, p)
	return u, p, err
}

// ReadFile streams a regular file in chunks, refusing one past the
// request's max_bytes (also when it grows while read).
func (s *Calls) ReadFile(_ context.Context, req *connect.Request[agentpb.ReadFileRequest], stream *connect.ServerStream[agentpb.ReadFileResponse]) error {
	_, p, err := s.path(req.Msg.GetUser(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return ConnectError(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ConnectError(err)
	}
	if !fi.Mode().IsRegular() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a regular file", p))
	}
	limit := req.Msg.GetMaxBytes()
	if limit > 0 && fi.Size() > limit {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s is %d bytes, more than the %d asked for", p, fi.Size(), limit))
	}
	buf := make([]byte, readChunk)
	var total int64
	for {
		n, err := f.Read(buf)
		if n > 0 {
			total += int64(n)
			if limit > 0 && total > limit {
				return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s grew past %d bytes while read", p, limit))
			}
			if err := stream.Send(&agentpb.ReadFileResponse{Data: buf[:n]}); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return ConnectError(err)
		}
	}
}

// writeFile replaces p's contents atomically with what r reads (a
// temporary file beside it, renamed over it only once r ended without
// error, removed on any failure), keeping p's mode and owner, or creating
// it for u. It returns the bytes written.
func writeFile(p string, r io.Reader, mode os.FileMode, u User, parents bool) (int64, error) {
	dir := filepath.Dir(p)
	if parents {
		if err := mkdirAll(dir, u); err != nil {
			return 0, err
		}
	}
	uid, gid := int(u.UID), int(u.GID)
	// A link at p is replaced, never followed: what it points to lends
	// the new file neither its owner nor its mode.
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSymlink == 0 {
		if !fi.Mode().IsRegular() {
			return 0, &fs.PathError{Op: "write", Path: p, Err: syscall.EISDIR}
		}
		mode = fi.Mode().Perm()
		st := fi.Sys().(*syscall.Stat_t)
		uid, gid = int(st.Uid), int(st.Gid)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".airlock-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Chown(uid, gid)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return n, err
}

// errIncomplete is a client stream that ended before the message saying
// it was whole: whatever it carried is dropped.
var errIncomplete = connect.NewError(connect.CodeInvalidArgument, errors.New("the stream ended before its last message: nothing was changed"))

// received is what a client stream of the agent offers its reader.
type received interface {
	Receive() bool
	Err() error
}

// streamReader reads the data of a client stream's messages up to the
// one that says last, and ends (io.EOF) only when the stream ends right
// after it; a stream that breaks off or ends early is an error, so that
// nothing it carried is kept.
type streamReader struct {
	s    received
	msg  func() (data []byte, last bool)
	buf  []byte
	last bool
}

func (r *streamReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if !r.s.Receive() {
			if err := r.s.Err(); err != nil {
				return 0, err
			}
			if r.last {
				return 0, io.EOF
			}
			return 0, errIncomplete
		}
		if r.last {
			return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("a message after the last"))
		}
		r.buf, r.last = r.msg()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// WriteFile replaces a file whole (see writeFile) with the data of the
// stream's messages, 0644 unless a mode is given, making missing parents
// when asked; the first message names the file.
func (s *Calls) WriteFile(_ context.Context, stream *connect.ClientStream[agentpb.WriteFileRequest]) (*connect.Response[agentpb.WriteFileResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, errIncomplete
	}
	first := stream.Msg()
	u, p, err := s.path(first.GetUser(), first.GetPath())
	if err != nil {
		return nil, err
	}
	mode := os.FileMode(first.GetMode()).Perm()
	if mode == 0 {
		mode = 0o644
	}
	r := &streamReader{s: stream, buf: first.GetData(), last: first.GetLast(), msg: func() ([]byte, bool) {
		return stream.Msg().GetData(), stream.Msg().GetLast()
	}}
	n, err := writeFile(p, r, mode, u, first.GetMakeParents())
	if err != nil {
		return nil, ConnectError(err)
	}
	return connect.NewResponse(&agentpb.WriteFileResponse{Size: n, Path: p}), nil
}

// EditFile replaces the one occurrence of a text in a file (of at most
// maxEditBytes); none or several is a failed precondition.
func (s *Calls) EditFile(_ context.Context, req *connect.Request[agentpb.EditFileRequest]) (*connect.Response[agentpb.EditFileResponse], error) {
	u, p, err := s.path(req.Msg.GetUser(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	old := req.Msg.GetOld()
	if old == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the text to replace is empty"))
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, ConnectError(err)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxEditBytes+1))
	f.Close()
	if err != nil {
		return nil, ConnectError(err)
	}
	if len(b) > maxEditBytes {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s is larger than %d bytes: write it whole instead", p, maxEditBytes))
	}
	switch n := bytes.Count(b, []byte(old)); n {
	case 1:
	case 0:
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the text to replace does not occur in %s", p))
	default:
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the text to replace occurs %d times in %s: give more context so it is unique", n, p))
	}
	out := strings.Replace(string(b), old, req.Msg.GetNew(), 1)
	if _, err := writeFile(p, strings.NewReader(out), 0o644, u, false); err != nil {
		return nil, ConnectError(err)
	}
	return connect.NewResponse(&agentpb.EditFileResponse{Size: int64(len(out))}), nil
}
