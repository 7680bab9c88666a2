package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// poolDaemon is the part of an airlock daemon's API the reconcilers call:
// creates (with pools, pool_only and external ids), PUT and DELETE of
// pools. It serves on a unix socket.
type poolDaemon struct {
	sock string

	mu      sync.Mutex
	next    int
	pools   map[string]*fakePool // by tenant + "/" + name
	byExt   map[string]*api.Sandbox
	creates []api.CreateSandbox // every create call's body
	made    []*api.Sandbox      // every sandbox made (not answered again)
	poolOps []string            // "PUT tenant/name size" or "DELETE tenant/name"
	secrets map[string]string   // by tenant + "/" + name (grants_test.go)
}

type fakePool struct {
	def   api.SetPool
	ready int
}

func newPoolDaemon(t testing.TB) *poolDaemon {
	dir, err := os.MkdirTemp("", "k2d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &poolDaemon{sock: filepath.Join(dir, "d.sock"), pools: map[string]*fakePool{}, byExt: map[string]*api.Sandbox{}}
	l, err := net.Listen("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: d}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return d
}

func fakeAPIError(w http.ResponseWriter, status int, code api.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(&api.Error{Code: code, Message: msg})
}

func (d *poolDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get("Authorization") // the fake tracker's key is "Bearer <tenant>"
	tenant = tenant[len("Bearer "):]
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case strings.HasPrefix(r.URL.Path, "/v1/secrets"):
		d.serveSecret(w, r, tenant)
	case r.Method == "POST" && r.URL.Path == "/v1/sandboxes":
		var c api.CreateSandbox
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			fakeAPIError(w, 400, api.CodeInvalidArgument, err.Error())
			return
		}
		for _, g := range c.Grants {
			if _, ok := d.secrets[tenant+"/"+g.Secret]; !ok {
				fakeAPIError(w, 404, api.CodeNotFound, "secret "+g.Secret+" not found")
				return
			}
		}
		d.creates = append(d.creates, c)
		if sb := d.byExt[tenant+"/"+c.ExternalID]; c.ExternalID != "" && sb != nil {
			json.NewEncoder(w).Encode(sb)
			return
		}
		sb := &api.Sandbox{Tenant: tenant, ExternalID: c.ExternalID, Metadata: c.Metadata, State: "running"}
		if c.Pool != "" {
			p := d.pools[tenant+"/"+c.Pool]
			switch {
			case p == nil:
				fakeAPIError(w, 404, api.CodeNotFound, "no pool "+c.Pool)
				return
			case p.ready == 0 && c.PoolOnly:
				fakeAPIError(w, 409, api.CodeFailedPrecondition, "pool "+c.Pool+" had no sandbox ready")
				return
			case p.ready > 0:
				p.ready--
				sb.Pool = c.Pool
			}
		}
		d.next++
		sb.ID = fmt.Sprintf("sb%d", d.next)
		if c.ExternalID != "" {
			d.byExt[tenant+"/"+c.ExternalID] = sb
		}
		d.made = append(d.made, sb)
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(sb)
	case r.Method == "PUT" && len(r.URL.Path) > len("/v1/pools/"):
		name := r.URL.Path[len("/v1/pools/"):]
		var sp api.SetPool
		if err := json.NewDecoder(r.Body).Decode(&sp); err != nil {
			fakeAPIError(w, 400, api.CodeInvalidArgument, err.Error())
			return
		}
		if sp.Size < 1 || sp.Size > 64 {
			fakeAPIError(w, 400, api.CodeInvalidArgument, "size out of range")
			return
		}
		d.poolOps = append(d.poolOps, fmt.Sprintf("PUT %s/%s %d", tenant, name, sp.Size))
		d.pools[tenant+"/"+name] = &fakePool{def: sp}
		json.NewEncoder(w).Encode(&api.Pool{Name: name, Size: sp.Size})
	case r.Method == "DELETE" && len(r.URL.Path) > len("/v1/pools/"):
		name := r.URL.Path[len("/v1/pools/"):]
		if d.pools[tenant+"/"+name] == nil {
			fakeAPIError(w, 404, api.CodeNotFound, "no pool "+name)
			return
		}
		d.poolOps = append(d.poolOps, fmt.Sprintf("DELETE %s/%s", tenant, name))
		delete(d.pools, tenant+"/"+name)
		w.WriteHeader(204)
	default:
		fakeAPIError(w, 404, api.CodeNotFound, r.Method+" "+r.URL.Path)
	}
}

// fakeNodeView is a NodeView over fake daemons: the tests set each node's
// snapshot (state, capacity, pools) as the tracker would have it.
type fakeNodeView struct {
	mu      sync.Mutex
	snaps   []nodes.Snapshot
	daemons map[string]*poolDaemon
	placed  []string
	// poolEv and claimEv are the tracker's feeds; syncPools sends a
	// node-level pool event.
	poolEv, claimEv chan event.GenericEvent
	// unsynced: the view is not complete yet (a controller just started).
	unsynced bool
}

func newFakeNodeView(t testing.TB, names ...string) *fakeNodeView {
	f := &fakeNodeView{daemons: map[string]*poolDaemon{}, poolEv: make(chan event.GenericEvent, 100), claimEv: make(chan event.GenericEvent, 100)}
	for _, n := range names {
		f.daemons[n] = newPoolDaemon(t)
		f.snaps = append(f.snaps, nodes.Snapshot{
			Name: n, State: nodes.StateReady, RuntimeClasses: []string{"airlock"},
			Capacity: api.Resources{CPUs: 2, MemoryBytes: 4 << 30},
			Pools:    map[nodes.PoolKey]api.NodePool{},
		})
	}
	return f
}

// setPool sets what node's snapshot shows of a daemon pool (and the ready
// entries its fake daemon holds).
func (f *fakeNodeView) setPool(node, tenant, name string, size, ready int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.snaps {
		if f.snaps[i].Name == node {
			f.snaps[i].Pools[nodes.PoolKey{Tenant: tenant, Name: name}] = api.NodePool{Tenant: tenant, Name: name, Size: size, Ready: ready}
		}
	}
	d := f.daemons[node]
	d.mu.Lock()
	if d.pools[tenant+"/"+name] == nil {
		d.pools[tenant+"/"+name] = &fakePool{def: api.SetPool{Size: size}}
	}
	d.pools[tenant+"/"+name].ready = ready
	d.mu.Unlock()
}

// syncPools makes each node's snapshot show its daemon's pools (as the
// tracker's pool events would), every entry ready, and sends a node-level
// pool event.
func (f *fakeNodeView) syncPools() {
	defer func() {
		select {
		case f.poolEv <- event.GenericEvent{Object: &corev1.Namespace{}}:
		default:
		}
	}()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.snaps {
		d := f.daemons[f.snaps[i].Name]
		d.mu.Lock()
		f.snaps[i].Pools = map[nodes.PoolKey]api.NodePool{}
		for k, p := range d.pools {
			tenant, name, _ := strings.Cut(k, "/")
			p.ready = p.def.Size
			f.snaps[i].Pools[nodes.PoolKey{Tenant: tenant, Name: name}] = api.NodePool{Tenant: tenant, Name: name, Size: p.def.Size, Ready: p.def.Size}
		}
		d.mu.Unlock()
	}
}

func (f *fakeNodeView) setState(node string, s nodes.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.snaps {
		if f.snaps[i].Name == node {
			f.snaps[i].State = s
		}
	}
}

func (f *fakeNodeView) Nodes() []nodes.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]nodes.Snapshot, len(f.snaps))
	for i, s := range f.snaps {
		s.Pools = make(map[nodes.PoolKey]api.NodePool, len(s.Pools))
		for k, v := range f.snaps[i].Pools {
			s.Pools[k] = v
		}
		out[i] = s
	}
	return out
}

func (f *fakeNodeView) ReadyNodes(class string) []nodes.Snapshot {
	var out []nodes.Snapshot
	for _, s := range f.Nodes() {
		if s.State == nodes.StateReady && !s.Unschedulable && s.Serves(class) {
			out = append(out, s)
		}
	}
	return out
}

// DaemonSandbox answers from the fake daemons, as a synced tracker would.
func (f *fakeNodeView) DaemonSandbox(node, externalID string) (nodes.DaemonSandbox, bool) {
	d := f.daemons[node]
	if d == nil {
		return nodes.DaemonSandbox{}, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, sb := range d.made {
		if sb.ExternalID == externalID {
			return nodes.DaemonSandbox{ID: sb.ID, Tenant: sb.Tenant}, true
		}
	}
	return nodes.DaemonSandbox{}, false
}

func (f *fakeNodeView) Tenant(_ context.Context, node, namespace string) (*airlock.Client, error) {
	d := f.daemons[node]
	if d == nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "no node " + node}
	}
	return airlock.New(airlock.Config{Address: d.sock, Key: namespace})
}

// Place chooses the first Ready node (the fakes have room).
func (f *fakeNodeView) Place(req nodes.Request) (string, func(), error) {
	ready := f.ReadyNodes(req.RuntimeClass)
	if len(ready) == 0 {
		return "", nil, &nodes.UnschedulableError{Message: fmt.Sprintf("0/%d airlock nodes are available", len(f.snaps))}
	}
	f.mu.Lock()
	f.placed = append(f.placed, ready[0].Name)
	f.mu.Unlock()
	return ready[0].Name, func() {}, nil
}

func (f *fakeNodeView) PoolEvents() <-chan event.GenericEvent  { return f.poolEv }
func (f *fakeNodeView) ClaimEvents() <-chan event.GenericEvent { return f.claimEv }

func (f *fakeNodeView) AllSynced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.unsynced
}

// writeCounter counts a client's writes by kind ("create Sandbox", "status
// SandboxClaim", ...).
type writeCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (w *writeCounter) add(verb string, obj client.Object) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kind := fmt.Sprintf("%T", obj)
	kind = kind[len("*v1beta1."):]
	w.n[verb+" "+kind]++
}

func (w *writeCounter) total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := 0
	for _, v := range w.n {
		t += v
	}
	return t
}

func (w *writeCounter) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n = map[string]int{}
}

func controllerScheme(t testing.TB) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, sandboxv1.AddToScheme, extv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// newClient is a fake apiserver holding objs, its writeCounter counted.
func countingClient(t *testing.T, objs ...client.Object) (client.Client, *writeCounter) {
	w := &writeCounter{n: map[string]int{}}
	c := fake.NewClientBuilder().WithScheme(controllerScheme(t)).
		WithStatusSubresource(&sandboxv1.Sandbox{}, &extv1.SandboxClaim{}, &extv1.SandboxWarmPool{}).
		WithIndex(&extv1.SandboxClaim{}, extv1.WarmPoolRefField, func(o client.Object) []string {
			return []string{o.(*extv1.SandboxClaim).Spec.WarmPoolRef.Name}
		}).
		WithIndex(&extv1.SandboxWarmPool{}, extv1.TemplateRefField, func(o client.Object) []string {
			return []string{o.(*extv1.SandboxWarmPool).Spec.TemplateRef.Name}
		}).
		WithObjects(objs...).Build()
	return countWrites(c, w), w
}

// countWrites is c with its writes counted in w.
func countWrites(c client.Client, w *writeCounter) client.Client {
	return &counting{Client: c, w: w}
}

type counting struct {
	client.Client
	w *writeCounter
}

func (c *counting) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.w.add("create", obj)
	return c.Client.Create(ctx, obj, opts...)
}

func (c *counting) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.w.add("update", obj)
	return c.Client.Update(ctx, obj, opts...)
}

func (c *counting) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	c.w.add("patch", obj)
	return c.Client.Patch(ctx, obj, p, opts...)
}

func (c *counting) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.w.add("delete", obj)
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *counting) Status() client.SubResourceWriter {
	return &countingStatus{SubResourceWriter: c.Client.Status(), w: c.w}
}

type countingStatus struct {
	client.SubResourceWriter
	w *writeCounter
}

func (s *countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.w.add("status", obj)
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *countingStatus) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
	s.w.add("status", obj)
	return s.SubResourceWriter.Patch(ctx, obj, p, opts...)
}

const tns = "team-a"

func airlockClass() *string { s := "airlock"; return &s }

// template is a SandboxTemplate of class airlock with env FOO=template and
// limits 0.5 CPU / 512 MiB.
func airlockTemplate(name string, policy extv1.EnvVarsInjectionPolicy) *extv1.SandboxTemplate {
	return &extv1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: tns, Name: name, UID: types.UID("tmpl-" + name), ResourceVersion: "1"},
		Spec: extv1.SandboxTemplateSpec{
			SandboxBlueprint: sandboxv1.SandboxBlueprint{PodTemplate: sandboxv1.PodTemplate{Spec: corev1.PodSpec{
				RuntimeClassName: airlockClass(),
				Containers: []corev1.Container{{
					Name: "main", Image: "host",
					Env: []corev1.EnvVar{{Name: "FOO", Value: "template"}},
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("512Mi"),
					}},
				}},
			}}},
			EnvVarsInjectionPolicy: policy,
		},
	}
}

func testWarmPool(name, tmpl string, replicas int32) *extv1.SandboxWarmPool {
	return &extv1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: tns, Name: name, UID: types.UID("pool-" + name), Generation: 1},
		Spec:       extv1.SandboxWarmPoolSpec{Replicas: &replicas, TemplateRef: extv1.SandboxTemplateRef{Name: tmpl}},
	}
}

func claimOf(name, pool string, env ...extv1.EnvVar) *extv1.SandboxClaim {
	return &extv1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: tns, Name: name, UID: types.UID("claim-uid-" + name), Generation: 1},
		Spec:       extv1.SandboxClaimSpec{WarmPoolRef: extv1.SandboxWarmPoolRef{Name: pool}, Env: env},
	}
}
