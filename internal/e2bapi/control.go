package e2bapi

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Default timeouts of a create that names none: E2B's v2 API's, and the
// v1 schema's (the Python SDK always sends one).
const (
	defaultTimeout   = 300 * time.Second
	defaultTimeoutV1 = 15 * time.Second
	// pausedKept is how long a paused sandbox is kept at least: E2B keeps
	// a paused sandbox until it is resumed, airlock's TTL runs on while
	// it is frozen.
	pausedKept = 24 * time.Hour
	// maxJSON caps a control-plane request body.
	maxJSON = 1 << 20
	// maxPage caps a list's page.
	maxPage = 1000
)

type route struct {
	pattern string
	h       handler
}

func (f *Front) routes() []route {
	create := func(def time.Duration) handler {
		return func(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error { return f.create(w, r, p, def) }
	}
	return []route{
		{"POST /v2/sandboxes", create(defaultTimeout)},
		{"POST /sandboxes", create(defaultTimeoutV1)},
		{"GET /v2/sandboxes", f.list},
		{"GET /sandboxes", f.list},
		{"GET /sandboxes/{id}", f.get},
		{"DELETE /sandboxes/{id}", f.kill},
		{"POST /v2/sandboxes/{id}/connect", f.connect},
		{"POST /sandboxes/{id}/connect", f.connect},
		{"POST /sandboxes/{id}/resume", f.connect},
		{"POST /sandboxes/{id}/timeout", f.timeout},
		{"POST /sandboxes/{id}/pause", f.pause},
		{"POST /sandboxes/{id}/fork", f.fork},
		{"GET /sandboxes/{id}/metrics", f.metrics},
		{"POST /sandboxes/{id}/snapshots", f.snapshot},
		{"GET /snapshots", f.snapshots},
		{"DELETE /templates/{id}", f.deleteSnapshot},
	}
}

// Routes lists the control plane's route patterns (for the docs' table).
func (f *Front) Routes() []string {
	var out []string
	for _, rt := range f.routes() {
		out = append(out, rt.pattern)
	}
	return out
}

// decode reads a JSON object leniently (the SDKs send fields airlock has
// no use for); an empty body is an empty object.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSON)).Decode(v)
	var mbe *http.MaxBytesError
	switch {
	case err == nil, errors.Is(err, io.EOF):
		return nil
	case errors.As(err, &mbe):
		return err
	}
	return errdefs.Invalid("bad JSON: " + err.Error())
}

func (f *Front) create(w http.ResponseWriter, r *http.Request, p *tenant.Principal, def time.Duration) error {
	var in newSandbox
	if err := decode(w, r, &in); err != nil {
		return err
	}
	req, err := createOf(&in, f.cfg.Templates, f.cfg.AllowInternet, def)
	if err != nil {
		return err
	}
	sb, err := f.cfg.Sandboxes.Create(r.Context(), p, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, f.sandboxOf(sb))
	return nil
}

// sandboxOf is E2B's answer to a create or connect.
func (f *Front) sandboxOf(sb *api.Sandbox) *sandboxOut {
	return &sandboxOut{SandboxID: sb.ID, TemplateID: sb.Metadata[templateKey], ClientID: "airlock", EnvdVersion: EnvdVersion,
		EnvdAccessToken: f.cfg.Tokens.Envd(sb.ID), Domain: f.cfg.Domain}
}

// detailOf is E2B's description of a sandbox.
func (f *Front) detailOf(sb *api.Sandbox, full bool) *detailOut {
	d := &detailOut{SandboxID: sb.ID, TemplateID: sb.Metadata[templateKey], ClientID: "airlock", EnvdVersion: EnvdVersion,
		StartedAt: sb.Created, EndAt: sb.Expires, State: sb.State, CPUCount: cpuCount(sb.Limits.CPUs),
		MemoryMB: sb.Limits.MemoryBytes >> 20, DiskSizeMB: sb.Limits.DiskBytes >> 20, Metadata: map[string]string{}, VolumeMounts: []any{}}
	for k, v := range sb.Metadata {
		if !strings.HasPrefix(k, metaPrefix) {
			d.Metadata[k] = v
		}
	}
	if full {
		// airlock never gives a sandbox the whole internet: allowOut
		// lists what it may reach.
		internet := false
		d.AllowInternetAccess = &internet
		d.Network = &network{AllowOut: sb.Network.Allow, DenyOut: sb.Network.Deny}
		d.Lifecycle = &lifecycle{OnTimeout: "kill", AutoResume: sb.Metadata[autoResumeKey] == "true"}
		if sb.OnTTL == "pause" {
			d.Lifecycle.OnTimeout = "pause"
		}
		d.Domain = f.cfg.Domain
	}
	return d
}

// live is tenant p's sandbox id while it runs or is paused; an ended one
// is not found, as on E2B.
func (f *Front) live(r *http.Request, p *tenant.Principal, id string) (*api.Sandbox, error) {
	sb, err := f.cfg.Sandboxes.Get(r.Context(), p, id)
	if err != nil {
		return nil, err
	}
	if sb.State == api.StateEnded {
		return nil, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("no sandbox %q", id))
	}
	return sb, nil
}

func (f *Front) get(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	sb, err := f.live(r, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, f.detailOf(sb, true))
	return nil
}

func (f *Front) kill(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	if err := f.cfg.Sandboxes.Destroy(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect resumes a paused sandbox (201) or finds a running one (200);
// its timeout is then at least the one asked (default 300 s): a resumed
// sandbox's is set to it, a running one's only ever extended.
func (f *Front) connect(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	var in struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(w, r, &in); err != nil {
		return err
	}
	timeout := defaultTimeout
	if in.Timeout != nil {
		if *in.Timeout <= 0 || *in.Timeout > 1<<31 {
			return errdefs.Invalid(fmt.Sprintf("timeout %d: want seconds, at least 1", *in.Timeout))
		}
		timeout = time.Duration(*in.Timeout) * time.Second
	}
	id := r.PathValue("id")
	sb, err := f.live(r, p, id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if sb.State == api.StatePaused {
		if sb, err = f.cfg.Sandboxes.Resume(r.Context(), p, id); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	if status == http.StatusCreated || f.cfg.Now().Add(timeout).After(sb.Expires) {
		if sb, err = f.cfg.Sandboxes.Extend(r.Context(), p, id, &api.Extend{TTL: timeout.String()}); err != nil {
			return err
		}
	}
	writeJSON(w, status, f.sandboxOf(sb))
	return nil
}

func (f *Front) timeout(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	var in struct {
		Timeout int64 `json:"timeout"`
	}
	if err := decode(w, r, &in); err != nil {
		return err
	}
	if in.Timeout <= 0 || in.Timeout > 1<<31 {
		return errdefs.Invalid(fmt.Sprintf("timeout %d: want seconds, at least 1", in.Timeout))
	}
	ttl := time.Duration(in.Timeout) * time.Second
	if _, err := f.cfg.Sandboxes.Extend(r.Context(), p, r.PathValue("id"), &api.Extend{TTL: ttl.String()}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pause freezes a sandbox (an already paused one: 409, which the SDKs
// read as false) and keeps it at least pausedKept; its memory is always
// kept (memory: false is not honoured: docs/e2b.md).
func (f *Front) pause(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	id := r.PathValue("id")
	sb, err := f.cfg.Sandboxes.Pause(r.Context(), p, id)
	if err != nil {
		return err
	}
	if f.cfg.Now().Add(pausedKept).After(sb.Expires) {
		if _, err := f.cfg.Sandboxes.Extend(r.Context(), p, id, &api.Extend{TTL: pausedKept.String()}); err != nil {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// fork makes count copies of a running sandbox, each answered on its own
// (E2B's per-fork result); the timeout, when given, is each copy's.
func (f *Front) fork(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	var in struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decode(w, r, &in); err != nil {
		return err
	}
	count := 1
	if in.Count != nil {
		count = *in.Count
	}
	if in.Timeout != nil && (*in.Timeout <= 0 || *in.Timeout > 1<<31) {
		return errdefs.Invalid(fmt.Sprintf("timeout %d: want seconds, at least 1", *in.Timeout))
	}
	fk, err := f.cfg.Sandboxes.Fork(r.Context(), p, r.PathValue("id"), &api.CreateFork{Count: count})
	if err != nil {
		return err
	}
	type result struct {
		Sandbox *sandboxOut `json:"sandbox,omitempty"`
		Error   *errorOut   `json:"error,omitempty"`
	}
	out := make([]result, 0, len(fk.Sandboxes))
	for _, sb := range fk.Sandboxes {
		if in.Timeout != nil {
			ttl := time.Duration(*in.Timeout) * time.Second
			if _, err := f.cfg.Sandboxes.Extend(r.Context(), p, sb.ID, &api.Extend{TTL: ttl.String()}); err != nil {
				out = append(out, result{Error: &errorOut{Code: statusOf(err), Message: err.Error()}})
				continue
			}
		}
		out = append(out, result{Sandbox: f.sandboxOf(sb)})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (f *Front) metrics(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	sb, err := f.live(r, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	now := f.cfg.Now()
	m := metricOut{Timestamp: now.UTC(), TimestampUnix: now.Unix(), CPUCount: cpuCount(sb.Limits.CPUs),
		MemTotal: sb.Limits.MemoryBytes, DiskTotal: sb.Limits.DiskBytes}
	if u := sb.Usage; u != nil {
		m.MemUsed = u.MemoryBytes
		if life := now.Sub(sb.Created).Seconds(); life > 0 {
			m.CPUUsedPct = 100 * u.CPUSeconds / life / float64(m.CPUCount)
		}
	}
	writeJSON(w, http.StatusOK, []metricOut{m})
	return nil
}

func (f *Front) snapshot(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	var in struct {
		Name string `json:"name"`
	}
	if err := decode(w, r, &in); err != nil {
		return err
	}
	sn, err := f.cfg.Sandboxes.Snapshot(r.Context(), p, r.PathValue("id"), &api.CreateSnapshot{Name: in.Name})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotOf(sn))
	return nil
}

func snapshotOf(sn *api.Snapshot) snapshotOut {
	out := snapshotOut{SnapshotID: "snapshot:" + sn.ID, Names: []string{}}
	if sn.Name != "" {
		out.Names = append(out.Names, sn.Name)
	}
	return out
}

func (f *Front) snapshots(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	q := r.URL.Query()
	all, err := f.cfg.Sandboxes.Snapshots(r.Context(), p)
	if err != nil {
		return err
	}
	var keep []*api.Snapshot
	for _, sn := range all {
		if (q.Get("sandboxID") == "" || sn.Sandbox == q.Get("sandboxID")) && (q.Get("name") == "" || sn.Name == q.Get("name")) {
			keep = append(keep, sn)
		}
	}
	pos := func(sn *api.Snapshot) position { return position{sn.Created, sn.ID} }
	slices.SortFunc(keep, func(a, b *api.Snapshot) int { return ascending(pos(a), pos(b)) })
	page, next, err := pageOf(keep, q, pos, ascending)
	if err != nil {
		return err
	}
	out := make([]snapshotOut, 0, len(page))
	for _, sn := range page {
		out = append(out, snapshotOf(sn))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteSnapshot is DELETE /templates/{id}: airlock has no templates of
// a tenant's but its snapshots.
func (f *Front) deleteSnapshot(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	id := r.PathValue("id")
	sid, ok := strings.CutPrefix(id, "snapshot:")
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("no template %q: airlock deletes only snapshots (snapshot:<id>)", id))
	}
	if err := f.cfg.Sandboxes.DeleteSnapshot(r.Context(), p, sid); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// list is the caller's running and paused sandboxes, oldest first (order
// "desc": newest first), filtered by state, metadata (E2B's url-encoded
// k=v&k2=v2), template and startedAfter, a page of limit (default 100) at
// a time, the next page's token in X-Next-Token.
func (f *Front) list(w http.ResponseWriter, r *http.Request, p *tenant.Principal) error {
	q := r.URL.Query()
	states := map[string]bool{}
	for _, v := range q["state"] {
		for s := range strings.SplitSeq(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				states[s] = true
			}
		}
	}
	meta, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		return err
	}
	var after time.Time
	if s := q.Get("startedAfter"); s != "" {
		if after, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return errdefs.Invalid(fmt.Sprintf("startedAfter %q: want an RFC 3339 time", s))
		}
	}
	tpl := q.Get("template")
	var keep []*api.Sandbox
	for _, sb := range f.cfg.Sandboxes.List(r.Context(), p) {
		switch {
		case len(states) > 0 && !states[sb.State]:
		case tpl != "" && sb.Metadata[templateKey] != tpl:
		case !after.IsZero() && !sb.Created.After(after):
		case !matches(sb.Metadata, meta):
		default:
			keep = append(keep, sb)
		}
	}
	order := ascending
	switch q.Get("order") {
	case "", "asc":
	case "desc":
		order = descending
	default:
		return errdefs.Invalid(fmt.Sprintf("order %q: asc or desc", q.Get("order")))
	}
	pos := func(sb *api.Sandbox) position { return position{sb.Created, sb.ID} }
	slices.SortFunc(keep, func(a, b *api.Sandbox) int { return order(pos(a), pos(b)) })
	page, next, err := pageOf(keep, q, pos, order)
	if err != nil {
		return err
	}
	out := make([]*detailOut, 0, len(page))
	for _, sb := range page {
		out = append(out, f.detailOf(sb, false))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// metadataFilter parses E2B's metadata filter: a query string whose keys
// and values the SDK escaped once more.
func metadataFilter(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	v, err := url.ParseQuery(s)
	if err != nil {
		return nil, errdefs.Invalid("metadata: want k=v&k2=v2 (url-encoded)")
	}
	out := map[string]string{}
	for k, vs := range v {
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		val := vs[len(vs)-1]
		if uv, err := url.QueryUnescape(val); err == nil {
			val = uv
		}
		out[k] = val
	}
	return out, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v || strings.HasPrefix(k, metaPrefix) {
			return false
		}
	}
	return true
}

// position is where an item sorts: its time, then its id.
type position struct {
	at time.Time
	id string
}

func ascending(a, b position) int  { return cmp.Or(a.at.Compare(b.at), strings.Compare(a.id, b.id)) }
func descending(a, b position) int { return ascending(b, a) }

// pageOf is the page of items (sorted by order) after the query's
// nextToken, of its limit (default 100), and the token of the page after
// it ("": the last). A token is the position of a page's last item, so
// that items ending or starting between pages neither repeat nor shift
// the pages.
func pageOf[T any](items []T, q url.Values, pos func(T) position, order func(a, b position) int) ([]T, string, error) {
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPage {
			return nil, "", errdefs.Invalid(fmt.Sprintf("limit %q: from 1 to %d", s, maxPage))
		}
		limit = n
	}
	start := 0
	if tok := q.Get("nextToken"); tok != "" {
		after, err := parseToken(tok)
		if err != nil {
			return nil, "", err
		}
		start = len(items)
		for i, it := range items {
			if order(pos(it), after) > 0 {
				start = i
				break
			}
		}
	}
	end := min(start+limit, len(items))
	page := items[start:end]
	if end == len(items) {
		return page, "", nil
	}
	last := pos(items[end-1])
	return page, base64.RawURLEncoding.EncodeToString([]byte(last.at.UTC().Format(time.RFC3339Nano) + " " + last.id)), nil
}

func parseToken(tok string) (position, error) {
	bad := errdefs.Invalid("nextToken: not a token this API gave")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return position{}, bad
	}
	ts, id, ok := strings.Cut(string(b), " ")
	at, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		return position{}, bad
	}
	return position{at, id}, nil
}
