// Package daemontest is a fake airlock daemon for the k8s module's tests:
// the node API of docs/api.md (node, node events, sandboxes with external
// ids and capacity, tenants by key hash) on a unix socket, in memory.
package daemontest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// Daemon is a fake airlock daemon.
type Daemon struct {
	Name     string
	AdminKey string
	Socket   string

	t   testing.TB
	srv *http.Server

	mu        sync.Mutex
	bootID    string
	capacity  api.Resources
	sandboxes map[string]*api.Sandbox  // by id
	tenants   map[string]string        // name → key sha256
	secrets   map[string]*storedSecret // by tenant + "/" + name
	rev       uint64
	subs      map[chan api.NodeEvent]bool
	nextID    int
	// Creates counts POST /v1/sandboxes that made a sandbox.
	Creates int
}

// Start runs a daemon on a socket in a temporary directory; it stops at
// the test's end.
func Start(t testing.TB, name string, capacity api.Resources) *Daemon {
	dir, err := os.MkdirTemp("", "airlock-fake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &Daemon{
		Name: name, AdminKey: "admin-" + name, Socket: filepath.Join(dir, "api.sock"), t: t,
		capacity: capacity, sandboxes: map[string]*api.Sandbox{}, tenants: map[string]string{},
		subs: map[chan api.NodeEvent]bool{}, bootID: "boot-1",
	}
	d.Up()
	t.Cleanup(d.Down)
	return d
}

// Endpoint is the daemon's AirlockNode endpoint.
func (d *Daemon) Endpoint() string { return "unix://" + d.Socket }

// Up (re)starts the daemon's listener, keeping its state.
func (d *Daemon) Up() {
	os.Remove(d.Socket)
	l, err := net.Listen("unix", d.Socket)
	if err != nil {
		d.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	mux.HandleFunc("GET /v1/node", d.admin(d.node))
	mux.HandleFunc("GET /v1/node/events", d.admin(d.events))
	mux.HandleFunc("GET /v1/sandboxes", d.list)
	mux.HandleFunc("POST /v1/sandboxes", d.create)
	mux.HandleFunc("GET /v1/sandboxes/{id}", d.get)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", d.destroy)
	mux.HandleFunc("POST /v1/sandboxes/{id}/extend", d.extend)
	mux.HandleFunc("POST /v1/tenants", d.admin(d.createTenant))
	mux.HandleFunc("PATCH /v1/tenants/{name}", d.admin(d.updateTenant))
	d.handleSecrets(mux)
	d.mu.Lock()
	d.srv = &http.Server{Handler: mux}
	srv := d.srv
	d.mu.Unlock()
	go srv.Serve(l)
}

// Down stops the daemon as a kill would: its listener and every stream.
func (d *Daemon) Down() {
	d.mu.Lock()
	srv := d.srv
	d.srv = nil
	d.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// Sandboxes returns copies of the daemon's live sandboxes.
func (d *Daemon) Sandboxes() []api.Sandbox {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []api.Sandbox
	for _, s := range d.sandboxes {
		if s.Ended == nil {
			out = append(out, *s)
		}
	}
	return out
}

// TenantKeySHA256 is the key hash a tenant was given ("" if none).
func (d *Daemon) TenantKeySHA256(name string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tenants[name]
}

// Add puts a live sandbox on the daemon as if made outside the test's
// reach (no event).
func (d *Daemon) Add(sb api.Sandbox) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cp := sb
	d.sandboxes[sb.ID] = &cp
}

// End ends a sandbox as its TTL would, with an event.
func (d *Daemon) End(id, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.endLocked(id, reason)
}

func (d *Daemon) endLocked(id, reason string) {
	s := d.sandboxes[id]
	if s == nil || s.Ended != nil {
		return
	}
	now := time.Now()
	s.Ended, s.EndReason, s.State = &now, reason, "ended"
	cp := *s
	d.publishLocked(api.NodeEvent{Type: "sandbox.ended", Sandbox: &cp})
	d.publishLocked(api.NodeEvent{Type: "capacity", Node: d.nodeLocked()})
}

func (d *Daemon) publishLocked(ev api.NodeEvent) {
	d.rev++
	ev.Rev = d.rev
	for ch := range d.subs {
		select {
		case ch <- ev:
		default: // a stuck reader loses the stream
			close(ch)
			delete(d.subs, ch)
		}
	}
}

func (d *Daemon) nodeLocked() *api.Node {
	n := &api.Node{Name: d.Name, Version: "test", BootID: d.bootID, Capacity: d.capacity, Isolations: []string{"container"}, Rev: d.rev}
	for _, s := range d.sandboxes {
		if s.Ended == nil {
			n.Allocated.CPUs += s.Limits.CPUs
			n.Allocated.MemoryBytes += s.Limits.MemoryBytes
			n.Allocated.Sandboxes++
		}
	}
	return n
}

type caller struct {
	admin  bool
	tenant string
}

func (d *Daemon) who(r *http.Request) (caller, bool) {
	key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if key == d.AdminKey {
		return caller{admin: true}, true
	}
	sum := sha256.Sum256([]byte(key))
	h := hex.EncodeToString(sum[:])
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, k := range d.tenants {
		if k == h {
			return caller{tenant: name}, true
		}
	}
	return caller{}, false
}

func fail(w http.ResponseWriter, status int, code api.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.Error{Code: code, Message: msg})
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (d *Daemon) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := d.who(r)
		if !ok {
			fail(w, 401, api.CodeUnauthenticated, "unknown key")
			return
		}
		if !c.admin {
			fail(w, 403, api.CodePermissionDenied, "admin only")
			return
		}
		h(w, r)
	}
}

func (d *Daemon) node(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	defer d.mu.Unlock()
	reply(w, 200, d.nodeLocked())
}

func (d *Daemon) events(w http.ResponseWriter, r *http.Request) {
	ch := make(chan api.NodeEvent, 1024)
	d.mu.Lock()
	hello := api.NodeEvent{Type: "hello", Node: d.nodeLocked(), Rev: d.rev}
	d.subs[ch] = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		if d.subs[ch] {
			delete(d.subs, ch)
		}
		d.mu.Unlock()
	}()
	hb := time.Second
	if v, err := time.ParseDuration(r.URL.Query().Get("heartbeat")); err == nil && v > 0 {
		hb = v
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	fl := w.(http.Flusher)
	enc.Encode(hello)
	fl.Flush()
	tick := time.NewTicker(hb)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-ch:
			if !ok {
				return
			}
			enc.Encode(ev)
			fl.Flush()
		case <-tick.C:
			d.mu.Lock()
			d.rev++
			ev := api.NodeEvent{Type: "heartbeat", Rev: d.rev}
			d.mu.Unlock()
			enc.Encode(ev)
			fl.Flush()
		}
	}
}

func (d *Daemon) list(w http.ResponseWriter, r *http.Request) {
	c, ok := d.who(r)
	if !ok {
		fail(w, 401, api.CodeUnauthenticated, "unknown key")
		return
	}
	all := r.URL.Query().Get("all") == "true"
	if all && !c.admin {
		fail(w, 403, api.CodePermissionDenied, "admin only")
		return
	}
	ext := r.URL.Query().Get("external_id")
	d.mu.Lock()
	defer d.mu.Unlock()
	out := []*api.Sandbox{}
	for _, s := range d.sandboxes {
		if s.Ended != nil || (!all && s.Tenant != c.tenant) || (ext != "" && s.ExternalID != ext) {
			continue
		}
		cp := *s
		out = append(out, &cp)
	}
	reply(w, 200, out)
}

func (d *Daemon) create(w http.ResponseWriter, r *http.Request) {
	c, ok := d.who(r)
	if !ok || c.admin {
		fail(w, 401, api.CodeUnauthenticated, "a tenant key is needed")
		return
	}
	var req api.CreateSandbox
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fail(w, 400, api.CodeInvalidArgument, err.Error())
		return
	}
	if req.Image != "host" && !strings.Contains(req.Image, ":") {
		fail(w, 400, api.CodeInvalidArgument, "image "+req.Image+" is not allowed")
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if req.ExternalID != "" {
		for _, s := range d.sandboxes {
			if s.Tenant == c.tenant && s.ExternalID == req.ExternalID && s.Ended == nil {
				reply(w, 200, s)
				return
			}
		}
	}
	if name := d.missingGrantSecretLocked(c.tenant, req.Grants); name != "" {
		fail(w, 404, api.CodeNotFound, "secret "+name+" not found")
		return
	}
	n := d.nodeLocked()
	switch {
	case n.Allocated.CPUs+req.Limits.CPUs > d.capacity.CPUs+1e-9:
		fail(w, 429, api.CodeQuotaExceeded, "node capacity: cpus")
		return
	case n.Allocated.MemoryBytes+req.Limits.MemoryBytes > d.capacity.MemoryBytes:
		fail(w, 429, api.CodeQuotaExceeded, "node capacity: memory")
		return
	}
	d.nextID++
	s := &api.Sandbox{
		ID: fmt.Sprintf("%s-sb%d", d.Name, d.nextID), Tenant: c.tenant, State: "running", Isolation: req.Isolation,
		Image: req.Image, Created: time.Now(), Limits: req.Limits, Network: req.Network, Metadata: req.Metadata,
		ExternalID: req.ExternalID,
	}
	if ttl, err := time.ParseDuration(req.TTL); err == nil {
		s.Expires = s.Created.Add(ttl)
	}
	d.sandboxes[s.ID] = s
	d.Creates++
	cp := *s
	// as airlock serve: the create counts from its admission, reported
	// before its sandbox.created.
	d.publishLocked(api.NodeEvent{Type: "capacity", Node: d.nodeLocked()})
	d.publishLocked(api.NodeEvent{Type: "sandbox.created", Sandbox: &cp})
	reply(w, 201, s)
}

func (d *Daemon) lookup(w http.ResponseWriter, r *http.Request) (*api.Sandbox, bool) {
	c, ok := d.who(r)
	if !ok {
		fail(w, 401, api.CodeUnauthenticated, "unknown key")
		return nil, false
	}
	d.mu.Lock()
	s := d.sandboxes[r.PathValue("id")]
	d.mu.Unlock()
	if s == nil || (!c.admin && s.Tenant != c.tenant) {
		fail(w, 404, api.CodeNotFound, "no such sandbox")
		return nil, false
	}
	return s, true
}

func (d *Daemon) get(w http.ResponseWriter, r *http.Request) {
	if s, ok := d.lookup(w, r); ok {
		d.mu.Lock()
		cp := *s
		d.mu.Unlock()
		reply(w, 200, &cp)
	}
}

func (d *Daemon) extend(w http.ResponseWriter, r *http.Request) {
	s, ok := d.lookup(w, r)
	if !ok {
		return
	}
	var req api.Extend
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fail(w, 400, api.CodeInvalidArgument, err.Error())
		return
	}
	ttl, err := time.ParseDuration(req.TTL)
	if err != nil {
		fail(w, 400, api.CodeInvalidArgument, "ttl: "+req.TTL)
		return
	}
	d.mu.Lock()
	s.Expires = time.Now().Add(ttl)
	cp := *s
	d.mu.Unlock()
	reply(w, 200, &cp)
}

func (d *Daemon) destroy(w http.ResponseWriter, r *http.Request) {
	if s, ok := d.lookup(w, r); ok {
		d.mu.Lock()
		gone := s.Ended != nil
		d.endLocked(s.ID, "destroyed")
		d.mu.Unlock()
		if gone {
			fail(w, 404, api.CodeNotFound, "no such sandbox")
			return
		}
		w.WriteHeader(204)
	}
}

func (d *Daemon) createTenant(w http.ResponseWriter, r *http.Request) {
	var req api.CreateTenant
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name == "" || len(req.KeySHA256) != 64 {
		fail(w, 400, api.CodeInvalidArgument, "name and key_sha256 are needed")
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.tenants[req.Name]; ok {
		fail(w, 409, api.CodeAlreadyExists, "tenant exists")
		return
	}
	d.tenants[req.Name] = req.KeySHA256
	reply(w, 201, api.Tenant{Name: req.Name})
}

func (d *Daemon) updateTenant(w http.ResponseWriter, r *http.Request) {
	var req api.UpdateTenant
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fail(w, 400, api.CodeInvalidArgument, err.Error())
		return
	}
	name := r.PathValue("name")
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.tenants[name]; !ok {
		fail(w, 404, api.CodeNotFound, "no such tenant")
		return
	}
	if req.KeySHA256 != "" {
		d.tenants[name] = req.KeySHA256
	}
	reply(w, 200, api.Tenant{Name: name})
}

// SetTenant gives a tenant a key hash directly (a tenant made before).
func (d *Daemon) SetTenant(name, keySHA256 string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tenants[name] = keySHA256
}

// Restart changes the boot id, as a daemon restarted with its state.
func (d *Daemon) Restart(bootID string) {
	d.Down()
	d.mu.Lock()
	d.bootID = bootID
	d.mu.Unlock()
	d.Up()
}
