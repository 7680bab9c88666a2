package files

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Caps on what one call may make the agent do.
const (
	maxListEntries = 100_000
	maxListDepth   = 64
	maxEditBytes   = 16 << 20
	readChunk      = 256 << 10
)

// Filesystem is E2B envd's filesystem.Filesystem service: stat, list,
// make, move, remove and watch, as the caller's user.
type Filesystem struct {
	users    Users
	mu       sync.Mutex
	watchers map[string]*watcher
}

// NewFilesystem makes the service for users.
func NewFilesystem(users Users) *Filesystem {
	return &Filesystem{users: users, watchers: map[string]*watcher{}}
}

func entryInfo(p string) (*filesystem.EntryInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	e := &filesystem.EntryInfo{
		Name:         filepath.Base(p),
		Path:         p,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = strconv.Itoa(int(st.Uid)), strconv.Itoa(int(st.Gid))
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if t, err := os.Readlink(p); err == nil {
			e.SymlinkTarget = &t
		}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		} else {
			e.Type = filesystem.FileType_FILE_TYPE_FILE
		}
	case fi.IsDir():
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
	default:
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	}
	return e, nil
}

// path is the caller's user (from h) and p resolved for that user.
func (s *Filesystem) path(h http.Header, p string) (User, string, error) {
	u, err := s.users.FromHeader(h)
	if err != nil {
		return User{}, "", err
	}
	p, err = Resolve(u, p)
	return u, p, err
}

func (s *Filesystem) Stat(_ context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	_, p, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := entryInfo(p)
	if err != nil {
		return nil, ConnectError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (s *Filesystem) MakeDir(_ context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	u, p, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(p); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s already exists", p))
	}
	if err := mkdirAll(p, u); err != nil {
		return nil, ConnectError(err)
	}
	e, err := entryInfo(p)
	if err != nil {
		return nil, ConnectError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

// mkdirAll makes p and its missing parents, owned by u.
func mkdirAll(p string, u User) error {
	if fi, err := os.Stat(p); err == nil {
		if !fi.IsDir() {
			return &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
		}
		return nil
	}
	if parent := filepath.Dir(p); parent != p {
		if err := mkdirAll(parent, u); err != nil {
			return err
		}
	}
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return chownNew(p, u)
}

func (s *Filesystem) Move(_ context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	u, src, err := s.path(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := Resolve(u, req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if err := mkdirAll(filepath.Dir(dst), u); err != nil {
		return nil, ConnectError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, ConnectError(err)
	}
	e, err := entryInfo(dst)
	if err != nil {
		return nil, ConnectError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (s *Filesystem) Remove(_ context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	_, p, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if _, err := os.Lstat(p); err != nil {
		return nil, ConnectError(err)
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, ConnectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

func (s *Filesystem) ListDir(_ context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	_, root, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth %d exceeds %d", depth, maxListDepth))
	}
	if fi, err := os.Stat(root); err != nil {
		return nil, ConnectError(err)
	} else if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", root))
	}
	out := &filesystem.ListDirResponse{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, d := range ents {
			if len(out.Entries) >= maxListEntries {
				return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d entries: list a smaller tree or less deep", maxListEntries))
			}
			p := filepath.Join(dir, d.Name())
			e, err := entryInfo(p)
			if err != nil {
				continue // gone meanwhile
			}
			out.Entries = append(out.Entries, e)
			// Symlinks are listed, not followed.
			if d.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil && !errors.Is(err, fs.ErrPermission) {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return nil, ConnectError(err)
	}
	return connect.NewResponse(out), nil
}

// watcher is one inotify watch on a directory (and, recursively, on what
// is under it).
type watcher struct {
	fd        int
	recursive bool
	mu        sync.Mutex
	dirs      map[int32]string
	events    []*filesystem.FilesystemEvent // polled watchers only
	overflow  bool
	done      chan struct{}
	closeOnce sync.Once
}

const maxPolledEvents = 10_000

func newWatcher(root string, recursive bool) (*watcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, ConnectError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", root))
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, ConnectError(err)
	}
	w := &watcher{fd: fd, recursive: recursive, dirs: map[int32]string{}, done: make(chan struct{})}
	if err := w.add(root); err != nil {
		unix.Close(fd)
		return nil, ConnectError(err)
	}
	return w, nil
}

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW

func (w *watcher) add(dir string) error {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.dirs[int32(wd)] = dir
	w.mu.Unlock()
	if !w.recursive {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if e.IsDir() {
			_ = w.add(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// run reads events until close, handing each to emit.
func (w *watcher) run(emit func(*filesystem.FilesystemEvent)) {
	buf := make([]byte, 64<<10)
	pfd := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	for {
		select {
		case <-w.done:
			return
		default:
		}
		if n, err := unix.Poll(pfd, 200); err != nil || n == 0 {
			continue
		}
		n, err := unix.Read(w.fd, buf)
		if err != nil || n <= 0 {
			continue
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			w.mu.Lock()
			dir := w.dirs[ev.Wd]
			w.mu.Unlock()
			name := filepath.Join(dir, string(bytes.TrimRight(nameBytes, "\x00")))
			var t filesystem.EventType
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				w.overflow = true
				continue
			case ev.Mask&unix.IN_CREATE != 0, ev.Mask&unix.IN_MOVED_TO != 0:
				t = filesystem.EventType_EVENT_TYPE_CREATE
				if ev.Mask&unix.IN_ISDIR != 0 && w.recursive {
					_ = w.add(name)
				}
			case ev.Mask&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) != 0:
				t = filesystem.EventType_EVENT_TYPE_WRITE
			case ev.Mask&unix.IN_DELETE != 0:
				t = filesystem.EventType_EVENT_TYPE_REMOVE
			case ev.Mask&unix.IN_MOVED_FROM != 0:
				t = filesystem.EventType_EVENT_TYPE_RENAME
			case ev.Mask&unix.IN_ATTRIB != 0:
				t = filesystem.EventType_EVENT_TYPE_CHMOD
			default:
				continue
			}
			emit(&filesystem.FilesystemEvent{Name: name, Type: t})
		}
	}
}

func (w *watcher) close() {
	w.closeOnce.Do(func() {
		close(w.done)
		go func() { time.Sleep(300 * time.Millisecond); unix.Close(w.fd) }()
	})
}

func (s *Filesystem) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	_, p, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := newWatcher(p, req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	defer w.close()
	events := make(chan *filesystem.FilesystemEvent, 256)
	go w.run(func(e *filesystem.FilesystemEvent) {
		select {
		case events <- e:
		case <-w.done:
		}
	})
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{Path: p}}}); err != nil {
		return err
	}
	keep := time.NewTicker(30 * time.Second)
	defer keep.Stop()
	for {
		select {
		case e := <-events:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
				return err
			}
		case <-keep.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func (s *Filesystem) CreateWatcher(_ context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	_, p, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	n := len(s.watchers)
	s.mu.Unlock()
	if n >= 64 {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("64 watchers exist: remove one first"))
	}
	w, err := newWatcher(p, req.Msg.GetRecursive())
	if err != nil {
		return nil, err
	}
	go w.run(func(e *filesystem.FilesystemEvent) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.events) < maxPolledEvents {
			w.events = append(w.events, e)
		} else {
			w.overflow = true
		}
	})
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	s.mu.Lock()
	s.watchers[id] = w
	s.mu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *Filesystem) watcher(id string) (*watcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such watcher"))
	}
	return w, nil
}

func (s *Filesystem) GetWatcherEvents(_ context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	w, err := s.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, overflow := w.events, w.overflow
	w.events, w.overflow = nil, false
	w.mu.Unlock()
	if overflow {
		return nil, connect.NewError(connect.CodeDataLoss, errors.New("events were lost (too many between polls): re-list the directory"))
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (s *Filesystem) RemoveWatcher(_ context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	w, err := s.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.watchers, req.Msg.GetWatcherId())
	s.mu.Unlock()
	w.close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
