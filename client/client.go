// Package client is airlock's Go SDK: every call of the daemon's HTTP API
// (docs/api.md), over its unix socket or over TCP with TLS. Errors from
// the daemon are *api.Error values with a stable Code. File contents and
// archives stream, of any size (OpenFile, WriteFileFrom, Upload,
// Download); ReadFile and WriteFile hold a whole file in memory. It
// imports only api/ and the standard library.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// Client talks to one airlock daemon.
type Client struct {
	base string
	key  string
	hc   *http.Client
}

// Config says where the daemon is and who is calling.
type Config struct {
	// Address is a unix socket path (default api.DefaultSocket) or an
	// https:// URL.
	Address string
	// Key is an API key: a tenant's, or the admin key.
	Key string
	// TLS configures https:// addresses (nil: the system's roots).
	TLS *tls.Config
}

// New returns a client. It does not connect until the first call.
func New(c Config) (*Client, error) {
	addr := c.Address
	if addr == "" {
		addr = api.DefaultSocket
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64, TLSClientConfig: c.TLS}
	cl := &Client{key: c.Key, hc: &http.Client{Transport: tr}}
	switch {
	case strings.HasPrefix(addr, "https://"):
		u, err := url.Parse(addr)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", addr, err)
		}
		cl.base = strings.TrimSuffix(u.String(), "/")
	case strings.HasPrefix(addr, "http://"):
		return nil, errors.New("refusing plain http: use the unix socket or https://")
	default:
		sock := strings.TrimPrefix(addr, "unix://")
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
		cl.base = "http://airlock"
	}
	return cl, nil
}

func (c *Client) request(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 300 {
		defer res.Body.Close()
		var e api.Error
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Code == "" {
			return nil, &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("HTTP %d: %s", res.StatusCode, bytes.TrimSpace(b))}
		}
		return nil, &e
	}
	return res, nil
}

// call sends in as JSON (when not nil) and decodes the answer into out
// (when not nil).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	res, err := c.request(ctx, method, path, q, body, ct)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		return nil
	}
	return json.NewDecoder(res.Body).Decode(out)
}

func sb(id string, parts ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(parts, "")
}

// Health checks that the daemon answers.
func (c *Client) Health(ctx context.Context) error {
	return c.call(ctx, "GET", "/v1/health", nil, nil, nil)
}

// CreateSandbox makes a sandbox (tenant key); one naming an external id
// one of the tenant's sandboxes has answers that sandbox, making nothing.
func (c *Client) CreateSandbox(ctx context.Context, req *api.CreateSandbox) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", "/v1/sandboxes", nil, req, &out)
}

// CreateSandboxProgress makes a sandbox (tenant key) as CreateSandbox
// does, handing each report of its long work (its image's pull and
// unpack) to progress as it comes.
func (c *Client) CreateSandboxProgress(ctx context.Context, req *api.CreateSandbox, progress func(*api.Progress)) (*api.Sandbox, error) {
	return withProgress(ctx, c, "/v1/sandboxes", req, "the sandbox", progress, func(ev *api.CreateEvent) (*api.Progress, *api.Sandbox, *api.Error) {
		return ev.Progress, ev.Sandbox, ev.Error
	})
}

// withProgress posts body to path asking for its progress (?progress=true)
// and reads the stream: each report goes to progress as it comes, and the
// last event is the result (what) or the error. An answer that is not a
// stream is the result itself.
func withProgress[E, T any](ctx context.Context, c *Client, path string, body any, what string, progress func(*api.Progress), parts func(*E) (*api.Progress, *T, *api.Error)) (*T, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	res, err := c.request(ctx, "POST", path, url.Values{"progress": {"true"}}, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if !strings.HasPrefix(res.Header.Get("Content-Type"), "application/x-ndjson") {
		var out T
		return &out, json.NewDecoder(res.Body).Decode(&out)
	}
	dec := json.NewDecoder(res.Body)
	for {
		var ev E
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("the progress stream ended without %s: %w", what, err)
		}
		p, out, e := parts(&ev)
		switch {
		case e != nil:
			return nil, e
		case out != nil:
			return out, nil
		case p != nil && progress != nil:
			progress(p)
		}
	}
}

// SetPool defines (or redefines) the caller's pool name: req.Size
// sandboxes made ahead, which a create naming the pool, or matching its
// spec, takes.
func (c *Client) SetPool(ctx context.Context, name string, req *api.SetPool) (*api.Pool, error) {
	var out api.Pool
	return &out, c.call(ctx, "PUT", "/v1/pools/"+url.PathEscape(name), nil, req, &out)
}

// Pools lists the caller's pools.
func (c *Client) Pools(ctx context.Context) ([]*api.Pool, error) {
	var out []*api.Pool
	return out, c.call(ctx, "GET", "/v1/pools", nil, nil, &out)
}

// Pool describes one of the caller's pools.
func (c *Client) Pool(ctx context.Context, name string) (*api.Pool, error) {
	var out api.Pool
	return &out, c.call(ctx, "GET", "/v1/pools/"+url.PathEscape(name), nil, nil, &out)
}

// DeletePool removes a pool; it returns when its ready sandboxes are gone.
func (c *Client) DeletePool(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/v1/pools/"+url.PathEscape(name), nil, nil, nil)
}

// Sandboxes lists the caller's live sandboxes.
func (c *Client) Sandboxes(ctx context.Context) ([]*api.Sandbox, error) {
	var out []*api.Sandbox
	return out, c.call(ctx, "GET", "/v1/sandboxes", nil, nil, &out)
}

// ListSandboxes lists the sandboxes f selects: the caller's of external
// id f.ExternalID (an ended one still on record too), or with f.All
// (admin key) every tenant's.
func (c *Client) ListSandboxes(ctx context.Context, f api.ListSandboxes) ([]*api.Sandbox, error) {
	q := url.Values{}
	if f.ExternalID != "" {
		q.Set("external_id", f.ExternalID)
	}
	if f.All {
		q.Set("all", "true")
	}
	var out []*api.Sandbox
	return out, c.call(ctx, "GET", "/v1/sandboxes", q, nil, &out)
}

// Sandbox describes one sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "GET", sb(id), nil, nil, &out)
}

// Destroy ends a sandbox; it returns when the sandbox is gone.
func (c *Client) Destroy(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", sb(id), nil, nil, nil)
}

// Pause freezes a sandbox.
func (c *Client) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", sb(id, "/pause"), nil, nil, &out)
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", sb(id, "/resume"), nil, nil, &out)
}

// Extend sets a sandbox's expiry to ttl (a Go duration) from now.
func (c *Client) Extend(ctx context.Context, id, ttl string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", sb(id, "/extend"), nil, &api.Extend{TTL: ttl}, &out)
}

// Stream reads the events of a command.
type Stream struct {
	body  io.ReadCloser
	sc    *bufio.Scanner
	ended bool // the end event was read
}

func newStream(body io.ReadCloser) *Stream {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	return &Stream{body: body, sc: sc}
}

// Next returns the next event; io.EOF after the end event. A stream that
// stops before its end event returns io.ErrUnexpectedEOF.
func (s *Stream) Next() (*api.ExecEvent, error) {
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
	var ev api.ExecEvent
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return nil, fmt.Errorf("bad event from the daemon: %w", err)
	}
	if ev.End != nil {
		s.ended = true
	}
	return &ev, nil
}

// Close ends the stream (a foreground command whose stream is closed
// before it ends is killed). After the end event it first reads what is
// left of the response (its close, at once), a little and briefly at
// most, so that the connection is kept for the next call: closed unread,
// every exec would cost a new connection to the daemon.
func (s *Stream) Close() error {
	if s.ended {
		t := time.AfterFunc(time.Second, func() { s.body.Close() })
		_, _ = io.Copy(io.Discard, io.LimitReader(s.body, 64<<10))
		t.Stop()
	}
	return s.body.Close()
}

// ExecStream starts a command and returns its event stream; the first
// event carries its pid.
func (c *Client) ExecStream(ctx context.Context, id string, req *api.Exec) (*Stream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	res, err := c.request(ctx, "POST", sb(id, "/exec"), nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	return newStream(res.Body), nil
}

// Exec runs a command to its end, copying its output to stdout and stderr
// (either may be nil), and returns how it ended.
func (c *Client) Exec(ctx context.Context, id string, req *api.Exec, stdout, stderr io.Writer) (*api.ExecEnd, error) {
	s, err := c.ExecStream(ctx, id, req)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return Drain(s, stdout, stderr)
}

// Drain copies a stream's output to stdout and stderr (terminal output
// goes to stdout) and returns its end.
func Drain(s *Stream, stdout, stderr io.Writer) (*api.ExecEnd, error) {
	for {
		ev, err := s.Next()
		if err == io.EOF {
			return nil, io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, err
		}
		if stdout != nil {
			if _, err := stdout.Write(ev.Stdout); err != nil {
				return nil, err
			}
			if _, err := stdout.Write(ev.PTY); err != nil {
				return nil, err
			}
		}
		if stderr != nil {
			if _, err := stderr.Write(ev.Stderr); err != nil {
				return nil, err
			}
		}
		if ev.End != nil {
			return ev.End, nil
		}
	}
}

// Processes lists a sandbox's running commands.
func (c *Client) Processes(ctx context.Context, id string) ([]api.Process, error) {
	var out []api.Process
	return out, c.call(ctx, "GET", sb(id, "/processes"), nil, nil, &out)
}

func proc(id string, pid uint32, what string) string {
	return sb(id, "/processes/", strconv.FormatUint(uint64(pid), 10), what)
}

// Attach streams a running command's events from now on; the first event
// carries its pid.
func (c *Client) Attach(ctx context.Context, id string, pid uint32) (*Stream, error) {
	res, err := c.request(ctx, "GET", proc(id, pid, "/stream"), nil, nil, "")
	if err != nil {
		return nil, err
	}
	return newStream(res.Body), nil
}

// Logs streams the output a background command printed since it started,
// as much as the daemon keeps (the newest 1 MiB): its pid first (with
// Dropped, the bytes no longer kept), the output, and its end if it
// ended. With follow, the stream goes on with new output to the end;
// without, it stops after what is kept (io.EOF from Next, no end event
// while the command runs).
func (c *Client) Logs(ctx context.Context, id string, pid uint32, follow bool) (*Stream, error) {
	var q url.Values
	if follow {
		q = url.Values{"follow": {"true"}}
	}
	res, err := c.request(ctx, "GET", proc(id, pid, "/logs"), q, nil, "")
	if err != nil {
		return nil, err
	}
	return newStream(res.Body), nil
}

// Input writes to a command's stdin or terminal; eof closes its stdin.
func (c *Client) Input(ctx context.Context, id string, pid uint32, data []byte, eof bool) error {
	return c.call(ctx, "POST", proc(id, pid, "/input"), nil, &api.Input{Data: data, EOF: eof}, nil)
}

// Signal sends "TERM" or "KILL" to a command's process group.
func (c *Client) Signal(ctx context.Context, id string, pid uint32, sig string) error {
	return c.call(ctx, "POST", proc(id, pid, "/signal"), nil, &api.Signal{Signal: sig}, nil)
}

// Resize changes a command's terminal size.
func (c *Client) Resize(ctx context.Context, id string, pid uint32, rows, cols uint16) error {
	return c.call(ctx, "POST", proc(id, pid, "/resize"), nil, &api.TTY{Rows: rows, Cols: cols}, nil)
}

func pathQuery(p, user string) url.Values {
	q := url.Values{"path": {p}}
	if user != "" {
		q.Set("user", user)
	}
	return q
}

// ReadFile reads a file of the sandbox whole into memory; OpenFile
// streams one of any size.
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	r, err := c.OpenFile(ctx, id, path, 0)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// OpenFile streams a file of the sandbox, of any size: read it as it
// arrives, then close it. max above 0 refuses a file larger than max
// bytes (too_large); one that grows past it while read ends in an error.
func (c *Client) OpenFile(ctx context.Context, id, path string, max int64) (io.ReadCloser, error) {
	q := pathQuery(path, "")
	if max > 0 {
		q.Set("max_bytes", strconv.FormatInt(max, 10))
	}
	res, err := c.request(ctx, "GET", sb(id, "/files"), q, nil, "")
	if err != nil {
		return nil, err
	}
	return res.Body, nil
}

// WriteFile replaces or creates a file of the sandbox (owned by the
// sandbox user), making missing parent directories.
func (c *Client) WriteFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error {
	return c.WriteFileFrom(ctx, id, path, bytes.NewReader(data), mode)
}

// WriteFileFrom is WriteFile of what r reads, streamed, of any size (the
// sandbox's disk bounds it). The file changes only once r ended: if
// reading r fails, or the sandbox's disk fills, it is as it was.
func (c *Client) WriteFileFrom(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) error {
	q := pathQuery(path, "")
	q.Set("mode", strconv.FormatUint(uint64(mode.Perm()), 8))
	q.Set("parents", "true")
	res, err := c.request(ctx, "PUT", sb(id, "/files"), q, r, "application/octet-stream")
	if err != nil {
		return err
	}
	return res.Body.Close()
}

// Remove deletes a file or directory tree of the sandbox.
func (c *Client) Remove(ctx context.Context, id, path string) error {
	return c.call(ctx, "DELETE", sb(id, "/files"), pathQuery(path, ""), nil, nil)
}

// Stat describes a file of the sandbox.
func (c *Client) Stat(ctx context.Context, id, path string) (*api.FileEntry, error) {
	var out api.FileEntry
	return &out, c.call(ctx, "GET", sb(id, "/stat"), pathQuery(path, ""), nil, &out)
}

// ListDir lists a directory, depth levels deep (1: its entries only).
func (c *Client) ListDir(ctx context.Context, id, path string, depth int) ([]api.FileEntry, error) {
	q := pathQuery(path, "")
	q.Set("depth", strconv.Itoa(depth))
	var out []api.FileEntry
	return out, c.call(ctx, "GET", sb(id, "/dir"), q, nil, &out)
}

// MakeDir creates a directory and its parents.
func (c *Client) MakeDir(ctx context.Context, id, path string) (*api.FileEntry, error) {
	var out api.FileEntry
	return &out, c.call(ctx, "POST", sb(id, "/mkdir"), nil, &api.MakeDir{Path: path}, &out)
}

// Move renames a file or directory.
func (c *Client) Move(ctx context.Context, id, from, to string) (*api.FileEntry, error) {
	var out api.FileEntry
	return &out, c.call(ctx, "POST", sb(id, "/move"), nil, &api.Move{From: from, To: to}, &out)
}

// Edit replaces one exact, unique occurrence of old by new in a file.
func (c *Client) Edit(ctx context.Context, id, path, old, new string) error {
	return c.call(ctx, "POST", sb(id, "/edit"), nil, &api.Edit{Path: path, Old: old, New: new}, nil)
}

// WatchStream reads directory change events.
type WatchStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Next returns the next event (the first has Op "start").
func (w *WatchStream) Next() (*api.WatchEvent, error) {
	if !w.sc.Scan() {
		if err := w.sc.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
	var ev api.WatchEvent
	return &ev, json.Unmarshal(w.sc.Bytes(), &ev)
}

// Close stops watching.
func (w *WatchStream) Close() error { return w.body.Close() }

// Watch streams changes under a directory of the sandbox.
func (c *Client) Watch(ctx context.Context, id, path string, recursive bool) (*WatchStream, error) {
	q := pathQuery(path, "")
	q.Set("recursive", strconv.FormatBool(recursive))
	res, err := c.request(ctx, "GET", sb(id, "/watch"), q, nil, "")
	if err != nil {
		return nil, err
	}
	return &WatchStream{body: res.Body, sc: bufio.NewScanner(res.Body)}, nil
}

// Upload unpacks a tar stream into the existing directory dir of the
// sandbox, all or nothing, and returns the entries it skipped (anything
// but files and directories). A directory dir already has is merged
// into, a file replaced; an archive that breaks off or fails midway
// leaves dir as it was.
func (c *Client) Upload(ctx context.Context, id, dir string, tarball io.Reader) ([]string, error) {
	res, err := c.request(ctx, "PUT", sb(id, "/archive"), pathQuery(dir, ""), tarball, "application/x-tar")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var out struct {
		Skipped []string `json:"skipped"`
	}
	return out.Skipped, json.NewDecoder(res.Body).Decode(&out)
}

// Download returns a tar stream of /workspace or a path under it, read
// from the host side, and the names it skipped (special files).
func (c *Client) Download(ctx context.Context, id, path string) (io.ReadCloser, []string, error) {
	res, err := c.request(ctx, "GET", sb(id, "/archive"), pathQuery(path, ""), nil, "")
	if err != nil {
		return nil, nil, err
	}
	var skipped []string
	if h := res.Header.Get("X-Airlock-Skipped"); h != "" {
		_ = json.Unmarshal([]byte(h), &skipped)
	}
	return res.Body, skipped, nil
}

// Diff returns the unified diff of the sandbox's /workspace since
// creation.
func (c *Client) Diff(ctx context.Context, id string) (string, error) {
	res, err := c.request(ctx, "GET", sb(id, "/diff"), nil, nil, "")
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return string(b), err
}

// Snapshot saves a sandbox's filesystem state as an image; create
// sandboxes from it with Image "snapshot:<id>".
func (c *Client) Snapshot(ctx context.Context, id, name string) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.call(ctx, "POST", sb(id, "/snapshot"), nil, &api.CreateSnapshot{Name: name}, &out)
}

// SnapshotWith saves a snapshot as req says: with Memory, a gVisor
// sandbox's memory too (a sandbox made from it is restored running).
func (c *Client) SnapshotWith(ctx context.Context, id string, req *api.CreateSnapshot) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.call(ctx, "POST", sb(id, "/snapshot"), nil, req, &out)
}

// SnapshotProgress saves a snapshot as Snapshot does, handing each report
// of its copy (bytes of file content) to progress as it comes. Cancelling
// ctx before the copy is whole stops it, and leaves no snapshot.
func (c *Client) SnapshotProgress(ctx context.Context, id, name string, progress func(*api.Progress)) (*api.Snapshot, error) {
	return withProgress(ctx, c, sb(id, "/snapshot"), &api.CreateSnapshot{Name: name}, "the snapshot", progress, func(ev *api.SnapshotEvent) (*api.Progress, *api.Snapshot, *api.Error) {
		return ev.Progress, ev.Snapshot, ev.Error
	})
}

// Snapshots lists the caller's snapshots.
func (c *Client) Snapshots(ctx context.Context) ([]*api.Snapshot, error) {
	var out []*api.Snapshot
	return out, c.call(ctx, "GET", "/v1/snapshots", nil, nil, &out)
}

// Fork makes count new sandboxes from one checkpoint of running sandbox
// id, each continuing from its memory and files (gVisor), or from its
// files only (the container wall: the answer's Memory is false). All are
// made, or none.
func (c *Client) Fork(ctx context.Context, id string, count int) (*api.Fork, error) {
	var out api.Fork
	return &out, c.call(ctx, "POST", sb(id, "/fork"), nil, &api.CreateFork{Count: count}, &out)
}

// DeleteSnapshot deletes a snapshot (refused while a sandbox runs from it).
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", "/v1/snapshots/"+url.PathEscape(id), nil, nil, nil)
}

// Audit returns the audit records the key may read (a tenant its own),
// filtered by sandbox and kind ("" for any; a family such as "exec" too).
func (c *Client) Audit(ctx context.Context, sandbox, kind string) ([]api.AuditRecord, error) {
	q := url.Values{}
	if sandbox != "" {
		q.Set("sandbox", sandbox)
	}
	if kind != "" {
		q.Set("kind", kind)
	}
	res, err := c.request(ctx, "GET", "/v1/audit", q, nil, "")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var out []api.AuditRecord
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var r api.AuditRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("bad audit record from the daemon: %w", err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// CreateTenant adds a tenant (admin key); the answer holds its key, shown
// this once.
func (c *Client) CreateTenant(ctx context.Context, req *api.CreateTenant) (*api.Tenant, error) {
	var out api.Tenant
	return &out, c.call(ctx, "POST", "/v1/tenants", nil, req, &out)
}

// Tenants lists tenants (admin key) or the caller's own.
func (c *Client) Tenants(ctx context.Context) ([]*api.Tenant, error) {
	var out []*api.Tenant
	return out, c.call(ctx, "GET", "/v1/tenants", nil, nil, &out)
}

// UpdateTenant changes a tenant's quotas or scan policy (admin key).
func (c *Client) UpdateTenant(ctx context.Context, name string, req *api.UpdateTenant) (*api.Tenant, error) {
	var out api.Tenant
	return &out, c.call(ctx, "PATCH", "/v1/tenants/"+url.PathEscape(name), nil, req, &out)
}

// TenantE2BKey gives a tenant a new E2B-shaped key (admin key), shown this
// once; its previous one stops working.
func (c *Client) TenantE2BKey(ctx context.Context, name string) (*api.E2BKey, error) {
	var out api.E2BKey
	return &out, c.call(ctx, "POST", "/v1/tenants/"+url.PathEscape(name)+"/e2b-key", nil, nil, &out)
}

// DeleteTenant destroys a tenant's sandboxes and removes it (admin key).
func (c *Client) DeleteTenant(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/v1/tenants/"+url.PathEscape(name), nil, nil, nil)
}

// SetMCPSpec keeps the tenant's default spec for the sandboxes of its MCP
// sessions (/mcp).
func (c *Client) SetMCPSpec(ctx context.Context, spec *api.CreateSandbox) error {
	return c.call(ctx, "PUT", "/v1/mcp/spec", nil, spec, nil)
}

// MCPSpec is the tenant's default MCP sandbox spec.
func (c *Client) MCPSpec(ctx context.Context) (*api.CreateSandbox, error) {
	var out api.CreateSandbox
	return &out, c.call(ctx, "GET", "/v1/mcp/spec", nil, nil, &out)
}

// AddSecret stores a secret for the key's tenant. Its value never comes
// back from the API.
func (c *Client) AddSecret(ctx context.Context, name, value string) (*api.Secret, error) {
	var out api.Secret
	return &out, c.call(ctx, "POST", "/v1/secrets", nil, &api.AddSecret{Name: name, Value: value}, &out)
}

// RotateSecret gives a secret a new value.
func (c *Client) RotateSecret(ctx context.Context, name, value string) (*api.Secret, error) {
	var out api.Secret
	return &out, c.call(ctx, "PUT", "/v1/secrets/"+url.PathEscape(name), nil, &api.RotateSecret{Value: value}, &out)
}

// Secrets lists the tenant's secrets (names and versions).
func (c *Client) Secrets(ctx context.Context) ([]*api.Secret, error) {
	var out []*api.Secret
	return out, c.call(ctx, "GET", "/v1/secrets", nil, nil, &out)
}

// RemoveSecret deletes a secret; grants naming it fail from their next
// request.
func (c *Client) RemoveSecret(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/v1/secrets/"+url.PathEscape(name), nil, nil, nil)
}

// KillAll destroys every sandbox of tenant; with the admin key and an
// empty tenant, every sandbox of every tenant. It returns when they are
// gone.
func (c *Client) KillAll(ctx context.Context, tenant string) ([]string, error) {
	var q url.Values
	if tenant == "" {
		q = url.Values{"all": {"true"}}
	}
	var out api.Killed
	return out.Destroyed, c.call(ctx, "POST", "/v1/kill-all", q, &api.KillAll{Tenant: tenant}, &out)
}

// MintPortToken makes a token that reaches port of sandbox id without
// the key, until it expires (ttl "": 1h; at most 168h): for a browser,
// its URL (a path alone when the client talks to the unix socket).
func (c *Client) MintPortToken(ctx context.Context, id string, port int, ttl string) (*api.PortToken, error) {
	var out api.PortToken
	return &out, c.call(ctx, "POST", sb(id, "/port-tokens"), nil, &api.MintPortToken{Port: port, TTL: ttl}, &out)
}

// PortURL is the address of path (with its leading slash) on port of
// sandbox id through the daemon's front
// (/v1/sandboxes/{id}/ports/{port}/...), for requests made with
// PortClient.
func (c *Client) PortURL(id string, port int, path string) string {
	return c.base + sb(id, "/ports/", strconv.Itoa(port), path)
}

// PortClient is an HTTP client that reaches the daemon the way c does
// and sends c's key: for requests to PortURL.
func (c *Client) PortClient() *http.Client {
	return &http.Client{Transport: keyed{key: c.key, next: c.hc.Transport}}
}

type keyed struct {
	key  string
	next http.RoundTripper
}

func (k keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.key != "" && r.Header.Get("Authorization") == "" {
		r.Header.Set("Authorization", "Bearer "+k.key)
	}
	return k.next.RoundTrip(r)
}

// DialPort opens one TCP connection to 127.0.0.1:port inside sandbox id,
// tunnelled through the daemon (GET /v1/sandboxes/{id}/tunnel/{port}).
// Closing it ends the connection inside. It passes on no half-close.
func (c *Client) DialPort(ctx context.Context, id string, port int) (io.ReadWriteCloser, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+sb(id, "/tunnel/", strconv.Itoa(port)), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "airlock-port")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		defer res.Body.Close()
		var e api.Error
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Code == "" {
			return nil, &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("HTTP %d: %s", res.StatusCode, bytes.TrimSpace(b))}
		}
		return nil, &e
	}
	rwc, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		res.Body.Close()
		return nil, errors.New("the daemon's answer to a tunnel is not a connection")
	}
	return rwc, nil
}
