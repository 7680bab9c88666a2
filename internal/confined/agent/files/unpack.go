package files

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/agentpb"
)

// Unpack makes the files and directories a stream names in a directory
// (made, with its missing parents, if missing), all or nothing: they are
// made in a hidden stage directory inside it, or inside its nearest
// parent that exists (root's, 0700: no process of the sandbox user reaches
// in while it fills), and moved into place only once the stream said end
// and ended; on any failure before that (a write error, a full disk, a stream
// that breaks off) the stage is removed and the directory is as it was.
// In place, a directory the target already has is merged into, a file
// replaces a file; a file where a directory is, or the other way round,
// fails before anything moves.
func (s *Calls) Unpack(_ context.Context, stream *connect.ClientStream[agentpb.UnpackRequest]) (*connect.Response[agentpb.UnpackResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, errIncomplete
	}
	begin := stream.Msg().GetBegin()
	if begin == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("an unpack stream starts with begin"))
	}
	u, dir, err := s.path(begin.GetUser(), begin.GetDir())
	if err != nil {
		return nil, err
	}
	// A missing dir is made with the rest: staged under the nearest
	// directory that exists.
	anchor, missing := dir, ""
	for {
		fi, err := os.Stat(anchor)
		if err == nil && fi.IsDir() {
			break
		}
		if err == nil {
			err = &fs.PathError{Op: "unpack", Path: anchor, Err: syscall.ENOTDIR}
		}
		if !errors.Is(err, fs.ErrNotExist) || anchor == "/" {
			return nil, ConnectError(err)
		}
		anchor, missing = filepath.Dir(anchor), filepath.Join(filepath.Base(anchor), missing)
	}
	stage, err := os.MkdirTemp(anchor, ".airlock-upload-")
	if err != nil {
		return nil, ConnectError(err)
	}
	defer os.RemoveAll(stage) // empty once placed
	p := unpacking{root: filepath.Join(stage, missing), u: u}
	if err := mkdirAll(p.root, u); err != nil {
		return nil, ConnectError(err)
	}
	if err := p.run(stream); err != nil {
		_ = p.closeFile()
		return nil, ConnectError(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(stage, &st); err != nil {
		return nil, ConnectError(err)
	}
	if err := place(stage, anchor, st.Dev, true); err != nil {
		return nil, ConnectError(err)
	}
	if err := place(stage, anchor, st.Dev, false); err != nil {
		return nil, ConnectError(err)
	}
	return connect.NewResponse(&agentpb.UnpackResponse{Entries: p.entries, Bytes: p.bytes}), nil
}

// unpacking is one Unpack stream filling its stage.
type unpacking struct {
	root           string // where entries go: the directory's place in the stage
	u              User
	cur            *os.File // the file the data messages go to
	entries, bytes int64
}

func (p *unpacking) closeFile() error {
	if p.cur == nil {
		return nil
	}
	err := p.cur.Close()
	p.cur = nil
	return err
}

// run reads the stream up to its end message, which must be its last.
func (p *unpacking) run(stream *connect.ClientStream[agentpb.UnpackRequest]) error {
	for stream.Receive() {
		switch m := stream.Msg().GetPart().(type) {
		case *agentpb.UnpackRequest_Entry:
			if err := p.closeFile(); err != nil {
				return err
			}
			if err := p.entry(m.Entry); err != nil {
				return err
			}
		case *agentpb.UnpackRequest_Data:
			if p.cur == nil {
				return connect.NewError(connect.CodeInvalidArgument, errors.New("data before a file entry"))
			}
			n, err := p.cur.Write(m.Data)
			p.bytes += int64(n)
			if err != nil {
				return err
			}
		case *agentpb.UnpackRequest_End:
			if err := p.closeFile(); err != nil {
				return err
			}
			if stream.Receive() {
				return connect.NewError(connect.CodeInvalidArgument, errors.New("a message after end"))
			}
			return stream.Err()
		default:
			return connect.NewError(connect.CodeInvalidArgument, errors.New("begin once, first"))
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	return errIncomplete
}

// entry makes one file (opened for the data that follows) or directory
// in the stage, and its missing parents.
func (p *unpacking) entry(e *agentpb.UnpackEntry) error {
	name := e.GetName()
	rel := strings.TrimPrefix(path.Clean("/"+name), "/")
	if rel == "" || strings.ContainsRune(rel, 0) || len(name) > 4096 {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("bad entry name %q", name))
	}
	target := filepath.Join(p.root, filepath.FromSlash(rel))
	if err := mkdirAll(filepath.Dir(target), p.u); err != nil {
		return err
	}
	p.entries++
	mode := os.FileMode(e.GetMode()).Perm()
	if e.GetDir() {
		err := os.Mkdir(target, mode|0o700)
		if errors.Is(err, fs.ErrExist) {
			if fi, serr := os.Lstat(target); serr == nil && fi.IsDir() {
				return nil
			}
		}
		if err != nil {
			return err
		}
		if err := os.Chmod(target, mode|0o700); err != nil {
			return err
		}
		return chownNew(target, p.u)
	}
	if mode == 0 {
		mode = 0o644
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	p.cur = f
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if p.u.UID != 0 {
		return f.Chown(int(p.u.UID), int(p.u.GID))
	}
	return nil
}

// place moves what stage holds into dst (see Unpack); dry only checks
// that it can, so that a conflict fails before anything moved: a file in
// place of a directory or the other way round, or a directory to merge
// into on another filesystem than the stage's (dev), which rename cannot
// reach.
func place(stage, dst string, dev uint64, dry bool) error {
	ents, err := os.ReadDir(stage)
	if err != nil {
		return err
	}
	for _, e := range ents {
		from, to := filepath.Join(stage, e.Name()), filepath.Join(dst, e.Name())
		fi, err := os.Lstat(to)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if !dry {
				err = os.Rename(from, to)
			} else {
				err = nil
			}
		case err != nil:
		case e.IsDir() && fi.IsDir():
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Dev != dev {
				err = &fs.PathError{Op: "upload: another filesystem is mounted here: upload into it", Path: to, Err: syscall.EXDEV}
				break
			}
			err = place(from, to, dev, dry)
		case !e.IsDir() && !fi.IsDir():
			if !dry {
				err = os.Rename(from, to)
			}
		case e.IsDir():
			err = &fs.PathError{Op: "upload: cannot put a directory in place of a file", Path: to, Err: syscall.ENOTDIR}
		default:
			err = &fs.PathError{Op: "upload: cannot put a file in place of a directory", Path: to, Err: syscall.EISDIR}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
