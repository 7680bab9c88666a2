package envd

import (
	"context"
	"errors"
	"path"
	"regexp"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// files is envd's filesystem.Filesystem over the sandbox service.
type files struct{ h *Handler }

// entryInfo is envd's form of a file's entry. Owners are told by name as
// envd tells them: root, or the sandbox's user.
func entryInfo(e *api.FileEntry) *filesystem.EntryInfo {
	out := &filesystem.EntryInfo{
		Name: e.Name, Path: e.Path, Size: e.Size, Mode: modeBits(e.Mode), Permissions: e.Mode,
		Owner: ownerName(e.Owner), Group: ownerName(e.Group), ModifiedTime: timestamppb.New(e.Modified),
	}
	switch e.Type {
	case "dir":
		out.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
	case "symlink":
		out.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		out.SymlinkTarget = &e.Target
	default:
		out.Type = filesystem.FileType_FILE_TYPE_FILE
	}
	return out
}

// ownerName is a numeric owner (as the sandbox reports it) by name, as
// envd tells it: root, the sandbox's user (uid and gid 1000, the spec's
// "user"), any other id as it is.
func ownerName(id string) string {
	switch id {
	case "0":
		return "root"
	case "1000":
		return "user"
	}
	return id
}

// modeBits reads the permission bits of a mode string such as
// "-rwxr-xr--" (its last nine characters).
func modeBits(s string) uint32 {
	if len(s) < 9 {
		return 0
	}
	var m uint32
	for i, c := range s[len(s)-9:] {
		if c != '-' {
			m |= 1 << (8 - i)
		}
	}
	return m
}

func (f *files) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	t, user, err := callOf(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	e, err := f.h.svc.Stat(ctx, t.Principal, t.ID, req.Msg.GetPath(), user)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryInfo(e)}), nil
}

func (f *files) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	t, user, err := callOf(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	e, err := f.h.svc.MakeDir(ctx, t.Principal, t.ID, &api.MakeDir{Path: req.Msg.GetPath(), User: user})
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entryInfo(e)}), nil
}

func (f *files) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	t, user, err := callOf(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	e, err := f.h.svc.Move(ctx, t.Principal, t.ID, &api.Move{From: req.Msg.GetSource(), To: req.Msg.GetDestination(), User: user})
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryInfo(e)}), nil
}

// ListDir lists a directory, depth levels deep (0: 1, envd's default).
func (f *files) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	t, user, err := callOf(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	depth := int(min(req.Msg.GetDepth(), 1<<16))
	if depth == 0 {
		depth = 1
	}
	ents, err := f.h.svc.ListDir(ctx, t.Principal, t.ID, req.Msg.GetPath(), user, depth)
	if err != nil {
		return nil, connectErr(err)
	}
	out := &filesystem.ListDirResponse{Entries: make([]*filesystem.EntryInfo, 0, len(ents))}
	for i := range ents {
		out.Entries = append(out.Entries, entryInfo(&ents[i]))
	}
	return connect.NewResponse(out), nil
}

func (f *files) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	t, user, err := callOf(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	if err := f.h.svc.Remove(ctx, t.Principal, t.ID, req.Msg.GetPath(), user); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// errIncludeEntry refuses what airlock's watches do not tell (the SDKs
// ask it only of envd 0.6.3 and later).
var errIncludeEntry = connect.NewError(connect.CodeInvalidArgument, errors.New("include_entry is not supported: events name the file only"))

// WatchDir streams changes under a directory, each named relative to it
// as envd names them, until the caller goes away.
func (f *files) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	t, user, err := callOf(ctx, req.Header())
	if err != nil {
		return err
	}
	if req.Msg.GetIncludeEntry() {
		return errIncludeEntry
	}
	send, stop := keepAlive(ctx, keepaliveInterval(req.Header()), stream.Send,
		&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}})
	defer stop()
	var tr writes
	err = f.h.svc.WatchRelative(ctx, t.Principal, t.ID, req.Msg.GetPath(), user, req.Msg.GetRecursive(), func(ev *api.WatchEvent) error {
		if ev.Op == "start" {
			return send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}})
		}
		for _, e := range tr.events(ev) {
			if err := send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
				return err
			}
		}
		return nil
	})
	if ctx.Err() != nil {
		return nil // the caller left
	}
	return connectErr(err)
}

var eventTypes = map[string]filesystem.EventType{
	"create": filesystem.EventType_EVENT_TYPE_CREATE, "write": filesystem.EventType_EVENT_TYPE_WRITE,
	"remove": filesystem.EventType_EVENT_TYPE_REMOVE, "rename": filesystem.EventType_EVENT_TYPE_RENAME,
	"chmod": filesystem.EventType_EVENT_TYPE_CHMOD,
}

// stagedName is the name the sandbox's agent writes a file under before
// it renames it into place (internal/confined/agent/files writeFile), so
// a failed write changes nothing.
var stagedName = regexp.MustCompile(`^\.airlock-[0-9a-f]{12}$`)

// writes tells a watch's changes as envd does, which writes a file in
// place: a write through the agent (a staged file renamed over the
// file's name) is a create and a write of the file, its staged file
// unseen.
type writes struct {
	placed bool   // the last change was a staged file renamed away
	from   string // from this directory
}

func (w *writes) events(ev *api.WatchEvent) []*filesystem.FilesystemEvent {
	dir, base := path.Split(ev.Path)
	if stagedName.MatchString(base) {
		if ev.Op == "rename" {
			w.placed, w.from = true, dir
		}
		return nil
	}
	out := []*filesystem.FilesystemEvent{{Name: ev.Path, Type: eventTypes[ev.Op]}}
	if ev.Op == "create" && w.placed && w.from == dir {
		out = append(out, &filesystem.FilesystemEvent{Name: ev.Path, Type: filesystem.EventType_EVENT_TYPE_WRITE})
	}
	w.placed = false
	return out
}

// callOf is the sandbox a Connect call was routed to and the user it acts
// as.
func callOf(ctx context.Context, h interface{ Get(string) string }) (Target, string, error) {
	t, err := target(ctx)
	if err != nil {
		return Target{}, "", connectErr(err)
	}
	user, err := userOf(h)
	return t, user, err
}
