package gateway

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var master = []byte("0123456789abcdef0123456789abcdef")

// wantKey is the tenant key by the formula in K8S.md, written out here
// rather than calling the code under test.
func wantKey(node, ns string) string {
	m := hmac.New(sha256.New, master)
	m.Write([]byte(node + "/" + ns))
	return "airlock_" + hex.EncodeToString(m.Sum(nil))
}

// fakeKube answers TokenReviews from tokens (token → user name) and
// SubjectAccessReviews from grants (user + " " + verb + " " + ns + " " +
// subresource + " " + name), counting both and keeping the last SAR.
type fakeKube struct {
	mu          sync.Mutex
	tokens      map[string]string
	grants      map[string]bool
	tokenCalls  int
	accessCalls int
	lastSAR     *authzv1.SubjectAccessReview
}

func (k *fakeKube) client() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.tokenCalls++
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if u, ok := k.tokens[tr.Spec.Token]; ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: u, Groups: []string{"system:authenticated"}}}
		}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.accessCalls++
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		k.lastSAR = sar
		ra := sar.Spec.ResourceAttributes
		if ra.Group == "agents.x-k8s.io" && ra.Resource == "sandboxes" {
			sar.Status.Allowed = k.grants[strings.Join([]string{sar.Spec.User, ra.Verb, ra.Namespace, ra.Subresource, ra.Name}, " ")]
		}
		return true, sar, nil
	})
	return c
}

func (k *fakeKube) calls() (int, int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.tokenCalls, k.accessCalls
}

type fakeDir struct {
	sandboxes map[string]Sandbox // "ns/name"
	nodes     map[string]Node
}

func (d *fakeDir) Sandbox(ns, name string) (Sandbox, bool) {
	s, ok := d.sandboxes[ns+"/"+name]
	return s, ok
}
func (d *fakeDir) Node(name string) (Node, bool) { n, ok := d.nodes[name]; return n, ok }
func (d *fakeDir) Nodes() []Node {
	var out []Node
	for _, n := range d.nodes {
		out = append(out, n)
	}
	return out
}

// fakeDaemon is a node's airlock serve on a unix socket: it knows its
// sandboxes (id → tenant key that owns it, external id), records every
// request's path and headers, and answers exec as a stream whose second
// line waits for release.
type fakeDaemon struct {
	t         testing.TB
	name      string
	sock      string
	sandboxes map[string][2]string // id → {key, external_id}
	audit     map[string][]string  // tenant key → NDJSON lines
	release   chan struct{}
	mu        sync.Mutex
	seen      []*http.Request
}

func startDaemon(t testing.TB, name string) *fakeDaemon {
	d := &fakeDaemon{t: t, name: name, sock: filepath.Join(t.TempDir(), "d.sock"),
		sandboxes: map[string][2]string{}, audit: map[string][]string{}, release: make(chan struct{})}
	ln, err := net.Listen("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(d.serve)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return d
}

func (d *fakeDaemon) node() Node { return Node{Name: d.name, Endpoint: "unix://" + d.sock} }

func (d *fakeDaemon) requests() []*http.Request {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*http.Request(nil), d.seen...)
}

func (d *fakeDaemon) serve(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.seen = append(d.seen, r.Clone(context.Background()))
	d.mu.Unlock()
	key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if r.URL.Path == "/v1/audit" {
		lines, ok := d.audit[key]
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		for _, l := range lines {
			io.WriteString(w, l+"\n")
		}
		return
	}
	rest, _ := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/")
	id, sub, _ := strings.Cut(rest, "/")
	sb, ok := d.sandboxes[id]
	if !ok || sb[0] != key {
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"code":"not_found","message":"no sandbox"}`)
		return
	}
	switch {
	case sub == "" && r.Method == http.MethodGet:
		json.NewEncoder(w).Encode(map[string]string{"id": id, "external_id": sb[1]})
	case sub == "exec":
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"start"}`+"\n")
		w.(http.Flusher).Flush()
		<-d.release
		io.WriteString(w, `{"type":"end","exit_code":0}`+"\n")
	case strings.HasPrefix(sub, "tunnel/"):
		if r.Header.Get("Upgrade") != "airlock-port" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			d.t.Error(err)
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: airlock-port\r\n\r\n")
		line, _ := brw.ReadString('\n')
		io.WriteString(conn, "echo "+line)
	default:
		io.WriteString(w, `{"path":`+fmt.Sprintf("%q", r.URL.EscapedPath())+`}`)
	}
}

type world struct {
	kube   *fakeKube
	dir    *fakeDir
	nodeA  *fakeDaemon
	nodeB  *fakeDaemon
	srv    *httptest.Server
	clock  time.Time
	clockM sync.Mutex
}

func (w *world) now() time.Time {
	w.clockM.Lock()
	defer w.clockM.Unlock()
	return w.clock
}

func (w *world) advance(d time.Duration) {
	w.clockM.Lock()
	defer w.clockM.Unlock()
	w.clock = w.clock.Add(d)
}

// newWorld: user alice may exec and read files of a/box, and read a's
// audit; bob may do nothing. a/box lives on node-a as daemon sandbox
// sb-1; b/box (another namespace, same name) on node-b as sb-2.
func newWorld(t testing.TB) *world {
	w := &world{clock: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	w.kube = &fakeKube{
		tokens: map[string]string{"tok-alice": "alice", "tok-bob": "bob"},
		grants: map[string]bool{
			"alice create a exec box":    true,
			"alice get a files box":      true,
			"alice get a tunnel box":     true,
			"alice get a ports box":      true,
			"alice get a  box":           true,
			"alice get a audit ":         true,
			"alice create b exec box":    true,
			"alice create a exec stolen": true,
			"alice create a exec nope":   true,
		},
	}
	w.nodeA, w.nodeB = startDaemon(t, "node-a"), startDaemon(t, "node-b")
	w.nodeA.sandboxes["sb-1"] = [2]string{wantKey("node-a", "a"), "uid-box-a"}
	w.nodeA.sandboxes["sb-3"] = [2]string{wantKey("node-a", "a"), "uid-other"}
	w.nodeB.sandboxes["sb-2"] = [2]string{wantKey("node-b", "b"), "uid-box-b"}
	w.dir = &fakeDir{
		sandboxes: map[string]Sandbox{
			"a/box": {UID: "uid-box-a", Node: "node-a", ID: "sb-1"},
			"b/box": {UID: "uid-box-b", Node: "node-b", ID: "sb-2"},
			// Someone who may edit Sandboxes in a pointed this one at
			// another sandbox of the namespace.
			"a/stolen": {UID: "uid-stolen", Node: "node-a", ID: "sb-3"},
		},
		nodes: map[string]Node{"node-a": w.nodeA.node(), "node-b": w.nodeB.node()},
	}
	gw := New(Config{
		Kube:      w.kube.client(),
		Directory: w.dir,
		Master:    func(context.Context) ([]byte, error) { return master, nil },
		Now:       w.now,
	})
	w.srv = httptest.NewServer(gw)
	t.Cleanup(w.srv.Close)
	return w
}

func (w *world) do(t *testing.T, method, path, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, w.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

func wantError(t *testing.T, res *http.Response, status int, code api.Code) {
	t.Helper()
	var e api.Error
	if err := json.NewDecoder(res.Body).Decode(&e); err != nil || res.StatusCode != status || e.Code != code {
		t.Fatalf("got HTTP %d %+v (%v), want %d %s", res.StatusCode, e, err, status, code)
	}
}

func TestExecStreamsThroughAsTheTenant(t *testing.T) {
	w := newWorld(t)
	defer close(w.nodeA.release)
	res := w.do(t, "POST", "/v1/namespaces/a/sandboxes/box/exec", "tok-alice")
	if res.StatusCode != 200 {
		t.Fatalf("HTTP %d", res.StatusCode)
	}
	// The first line arrives while the daemon still holds the second:
	// the gateway flushed it rather than buffering.
	br := bufio.NewReader(res.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != `{"type":"start"}`+"\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	w.nodeA.release <- struct{}{}
	if line, _ = br.ReadString('\n'); !strings.Contains(line, `"end"`) {
		t.Fatalf("second line %q", line)
	}
	var exec *http.Request
	for _, r := range w.nodeA.requests() {
		for _, vs := range r.Header {
			for _, v := range vs {
				if strings.Contains(v, "tok-alice") {
					t.Fatalf("the caller's token reached the node in %v", r.Header)
				}
			}
		}
		if r.Header.Get("Authorization") != "Bearer "+wantKey("node-a", "a") {
			t.Fatalf("node got Authorization %q", r.Header.Get("Authorization"))
		}
		if r.URL.Path == "/v1/sandboxes/sb-1/exec" {
			exec = r
		}
	}
	if exec == nil || exec.Method != "POST" {
		t.Fatalf("no exec reached the node: %v", w.nodeA.requests())
	}
	sar := w.kube.lastSAR.Spec
	if ra := sar.ResourceAttributes; sar.User != "alice" || ra.Verb != "create" || ra.Namespace != "a" ||
		ra.Group != "agents.x-k8s.io" || ra.Resource != "sandboxes" || ra.Subresource != "exec" || ra.Name != "box" {
		t.Fatalf("access review asked %+v %+v", sar, sar.ResourceAttributes)
	}
}

func TestRefusals(t *testing.T) {
	w := newWorld(t)
	close(w.nodeA.release)
	for _, c := range []struct {
		name, method, path, token string
		status                    int
		code                      api.Code
	}{
		{"no token", "POST", "/v1/namespaces/a/sandboxes/box/exec", "", 401, api.CodeUnauthenticated},
		{"unknown token", "POST", "/v1/namespaces/a/sandboxes/box/exec", "tok-eve", 401, api.CodeUnauthenticated},
		{"no RBAC", "POST", "/v1/namespaces/a/sandboxes/box/exec", "tok-bob", 403, api.CodePermissionDenied},
		{"granted get, not create", "PUT", "/v1/namespaces/a/sandboxes/box/files", "tok-alice", 403, api.CodePermissionDenied},
		{"unknown sandbox", "POST", "/v1/namespaces/a/sandboxes/nope/exec", "tok-alice", 404, api.CodeNotFound},
		{"no grant for it", "POST", "/v1/namespaces/a/sandboxes/other/exec", "tok-alice", 403, api.CodePermissionDenied},
		{"annotations pointing at another sandbox", "POST", "/v1/namespaces/a/sandboxes/stolen/exec", "tok-alice", 404, api.CodeNotFound},
		{"not forwarded: fork", "POST", "/v1/namespaces/a/sandboxes/box/fork", "tok-alice", 404, api.CodeNotFound},
		{"not forwarded: pause", "POST", "/v1/namespaces/a/sandboxes/box/pause", "tok-alice", 404, api.CodeNotFound},
		{"delete the sandbox itself", "DELETE", "/v1/namespaces/a/sandboxes/box", "tok-alice", 400, api.CodeInvalidArgument},
		{"dot segment", "GET", "/v1/namespaces/a/sandboxes/box/files/%2e%2e/%2e%2e/sb-3/exec", "tok-alice", 400, api.CodeInvalidArgument},
		{"dot segments inside one", "GET", "/v1/namespaces/a/sandboxes/box/ports/80/..%2F..%2F..%2Fsb-3%2Fexec", "tok-alice", 400, api.CodeInvalidArgument},
		{"encoded subresource", "POST", "/v1/namespaces/a/sandboxes/box/%65xec", "tok-alice", 400, api.CodeInvalidArgument},
		{"bad namespace", "POST", "/v1/namespaces/A_/sandboxes/box/exec", "tok-alice", 404, api.CodeNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, w.do(t, c.method, c.path, c.token), c.status, c.code)
		})
	}
	for _, r := range w.nodeA.requests() {
		if r.URL.Path != "/v1/sandboxes/sb-3" || r.Method != "GET" {
			t.Errorf("a refused call reached the node: %s %s", r.Method, r.URL.Path)
		}
	}
	if len(w.nodeB.requests()) != 0 {
		t.Errorf("a refused call reached node-b")
	}
}

// A Sandbox of the same name in another namespace is not found through
// this one, and a grant there reaches only that namespace's tenant.
func TestNamespacesAreTenants(t *testing.T) {
	w := newWorld(t)
	close(w.nodeA.release)
	delete(w.dir.sandboxes, "a/box")
	wantError(t, w.do(t, "POST", "/v1/namespaces/a/sandboxes/box/exec", "tok-alice"), 404, api.CodeNotFound)
	if res := w.do(t, "POST", "/v1/namespaces/b/sandboxes/box/exec", "tok-alice"); res.StatusCode != 200 {
		t.Fatalf("b/box: HTTP %d", res.StatusCode)
	}
	for _, r := range w.nodeB.requests() {
		if r.Header.Get("Authorization") != "Bearer "+wantKey("node-b", "b") {
			t.Fatalf("node-b got %q", r.Header.Get("Authorization"))
		}
	}
}

func TestReviewsAreReusedForTheirTTL(t *testing.T) {
	w := newWorld(t)
	for range 3 {
		if res := w.do(t, "GET", "/v1/namespaces/a/sandboxes/box/files?path=/x", "tok-alice"); res.StatusCode != 200 {
			t.Fatalf("HTTP %d", res.StatusCode)
		}
	}
	if tr, sar := w.kube.calls(); tr != 1 || sar != 1 {
		t.Fatalf("3 calls in the TTL made %d token and %d access reviews, want 1 and 1", tr, sar)
	}
	w.advance(10 * time.Second)
	w.do(t, "GET", "/v1/namespaces/a/sandboxes/box/files?path=/x", "tok-alice")
	if tr, sar := w.kube.calls(); tr != 2 || sar != 2 {
		t.Fatalf("after the TTL: %d token and %d access reviews, want 2 and 2", tr, sar)
	}
	// A refusal is remembered too, and a grant is per question.
	w.do(t, "GET", "/v1/namespaces/a/sandboxes/box/stat", "tok-alice")
	w.do(t, "GET", "/v1/namespaces/a/sandboxes/box/stat", "tok-alice")
	if tr, sar := w.kube.calls(); tr != 2 || sar != 3 {
		t.Fatalf("another subresource: %d token and %d access reviews, want 2 and 3", tr, sar)
	}
}

func TestPathAndQueryReachTheNodeAsSent(t *testing.T) {
	w := newWorld(t)
	res := w.do(t, "GET", "/v1/namespaces/a/sandboxes/box/files?path=/a%20b", "tok-alice")
	var got struct{ Path string }
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil || got.Path != "/v1/sandboxes/sb-1/files" {
		t.Fatalf("node saw %+v, %v", got, err)
	}
	var files *http.Request
	for _, r := range w.nodeA.requests() {
		if r.URL.Path == "/v1/sandboxes/sb-1/files" {
			files = r
		}
	}
	if files == nil || files.URL.Query().Get("path") != "/a b" {
		t.Fatalf("query lost: %v", files)
	}
}

func TestTunnelUpgradeIsRelayed(t *testing.T) {
	w := newWorld(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(w.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/namespaces/a/sandboxes/box/tunnel/8080 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer tok-alice\r\nConnection: Upgrade\r\nUpgrade: airlock-port\r\n\r\n")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("%v %v", res, err)
	}
	io.WriteString(conn, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo hello\n" {
		t.Fatalf("through the tunnel: %q %v", line, err)
	}
}

func TestAuditMergesTheNamespacesNodes(t *testing.T) {
	w := newWorld(t)
	rec := func(seq int, at string) string {
		return fmt.Sprintf(`{"seq":%d,"time":"2026-12-02T10:00:%sZ","kind":"exec.start","future_field":1}`, seq, at)
	}
	w.nodeA.audit[wantKey("node-a", "a")] = []string{rec(1, "01"), rec(2, "03"), rec(3, "05")}
	w.nodeB.audit[wantKey("node-b", "a")] = []string{rec(7, "02"), rec(8, "04")}
	w.nodeB.audit[wantKey("node-b", "b")] = []string{rec(9, "00")} // another tenant's
	gone := startDaemon(t, "node-gone")
	gone.sock = filepath.Join(t.TempDir(), "nothing.sock")
	w.dir.nodes["node-gone"] = gone.node()
	// node-c never had the tenant: its key is unknown there (401), no records.
	w.dir.nodes["node-c"] = startDaemon(t, "node-c").node()

	res := w.do(t, "GET", "/v1/namespaces/a/audit", "tok-alice")
	if res.StatusCode != 200 {
		t.Fatalf("HTTP %d", res.StatusCode)
	}
	var got []string
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var r struct {
			Seq         int
			Node        string
			FutureField int `json:"future_field"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.FutureField != 1 {
			t.Fatalf("record %s: %v", sc.Bytes(), err)
		}
		got = append(got, fmt.Sprintf("%s:%d", r.Node, r.Seq))
	}
	if want := "node-a:1 node-b:7 node-a:2 node-b:8 node-a:3"; strings.Join(got, " ") != want {
		t.Fatalf("merged %v, want %s", got, want)
	}
	if u := res.Header.Get("X-Airlock-Audit-Unreachable"); u != "node-gone" {
		t.Fatalf("unreachable %q", u)
	}
	wantError(t, w.do(t, "GET", "/v1/namespaces/b/audit", "tok-alice"), 403, api.CodePermissionDenied)
}

func TestTTLCacheIsBounded(t *testing.T) {
	c := newTTLCache[int](3)
	t0 := time.Unix(0, 0)
	for i := range 10 {
		c.put(fmt.Sprint(i), i, t0, time.Minute)
		if len(c.m) > 3 {
			t.Fatalf("%d entries", len(c.m))
		}
	}
	if v, ok := c.get("9", t0); !ok || v != 9 {
		t.Fatal("the newest entry is gone")
	}
	if _, ok := c.get("9", t0.Add(time.Minute)); ok {
		t.Fatal("an expired entry answered")
	}
}

func TestNodeFromReadsTheAirlockNode(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "airlock.dev/v1alpha1", "kind": "AirlockNode",
		"metadata": map[string]any{"name": "n1"},
		"spec":     map[string]any{"endpoint": "https://10.0.0.1:8443", "caBundle": "LS0tLS1CRUdJTg=="},
	}}
	n, ok := nodeFrom(u)
	if !ok || n.Name != "n1" || n.Endpoint != "https://10.0.0.1:8443" || string(n.CABundle) != "-----BEGIN" {
		t.Fatalf("%+v %v", n, ok)
	}
	unstructured.RemoveNestedField(u.Object, "spec", "endpoint")
	if _, ok := nodeFrom(u); ok {
		t.Fatal("a node without an endpoint was used")
	}
}

// BenchmarkGatewayGet is one small call through the gateway with its
// reviews cached, beside the same call straight to the (fake) daemon: the
// gateway's own cost per call.
func BenchmarkGatewayGet(b *testing.B) {
	w := newWorld(b)
	gw := w.srv.Client()
	direct := &http.Client{Transport: mustConn(b, w.nodeA.node()).rt}
	key := wantKey("node-a", "a")
	get := func(c *http.Client, url, auth string) {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", auth)
		res, err := c.Do(req)
		if err != nil || res.StatusCode != 200 {
			b.Fatalf("%v %v", res, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	b.Run("gateway", func(b *testing.B) {
		for b.Loop() {
			get(gw, w.srv.URL+"/v1/namespaces/a/sandboxes/box/files?path=/x", "Bearer tok-alice")
		}
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			get(direct, "http://airlock/v1/sandboxes/sb-1/files?path=/x", "Bearer "+key)
		}
	})
}

func mustConn(b *testing.B, n Node) *nodeConn {
	nc, err := dialNode(n)
	if err != nil {
		b.Fatal(err)
	}
	return nc
}
