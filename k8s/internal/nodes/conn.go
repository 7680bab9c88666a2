package nodes

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"
	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
)

// Reconcile follows one AirlockNode: it starts the node's connection,
// restarts it when the way to reach the daemon changes, and forgets the
// node when it is deleted.
func (t *Tracker) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	runCtx := t.runContext()
	if runCtx == nil {
		return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
	}
	var an v1alpha1.AirlockNode
	err := t.cfg.Client.Get(ctx, req.NamespacedName, &an)
	if apierrors.IsNotFound(err) || (err == nil && an.DeletionTimestamp != nil) {
		t.mu.Lock()
		if n := t.nodes[req.Name]; n != nil {
			n.cancel()
			delete(t.nodes, req.Name)
			t.log.Info("airlock node removed", "node", req.Name)
		}
		t.mu.Unlock()
		// its Sandboxes are given up as on a lost node.
		t.nodeChanged(req.Name)
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[an.Name]
	if n != nil && sameConnection(&n.spec, &an.Spec) {
		uncordoned := n.spec.Unschedulable && !an.Spec.Unschedulable
		n.spec = *an.Spec.DeepCopy()
		if uncordoned {
			t.wakeLocked()
		}
		return ctrl.Result{}, nil
	}
	if n != nil {
		n.cancel()
	}
	fresh := newNode(an.Name, *an.Spec.DeepCopy())
	if n != nil {
		// the same node, reached another way: its state and counts stand
		// until the new connection reports.
		fresh.state, fresh.message, fresh.since, fresh.wasLost = n.state, n.message, n.since, n.wasLost
		fresh.bootID, fresh.capacity, fresh.allocated, fresh.pools = n.bootID, n.capacity, n.allocated, n.pools
		fresh.reservations = n.reservations
	}
	nctx, cancel := context.WithCancel(runCtx)
	fresh.cancel = cancel
	t.nodes[an.Name] = fresh
	go t.run(nctx, an.Name, *an.Spec.DeepCopy())
	return ctrl.Result{}, nil
}

func sameConnection(a, b *v1alpha1.AirlockNodeSpec) bool {
	return a.Endpoint == b.Endpoint && string(a.CABundle) == string(b.CABundle) && a.AdminKeySecretRef == b.AdminKeySecretRef &&
		reflect.DeepEqual(a.Classes(), b.Classes())
}

// run keeps one node's connection: sessions, with backoff between failed
// ones (at most a second: a returning node is fenced and Ready again
// within about a second of answering).
func (t *Tracker) run(ctx context.Context, name string, spec v1alpha1.AirlockNodeSpec) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		reached, err := t.session(ctx, name, spec)
		if ctx.Err() != nil {
			return
		}
		t.dropped(ctx, name, err)
		if reached {
			backoff = 100 * time.Millisecond
		} else {
			backoff = min(backoff*2, time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
}

// connect makes the node's admin client.
func (t *Tracker) connect(ctx context.Context, spec *v1alpha1.AirlockNodeSpec) (*airlock.Client, error) {
	ref := spec.AdminKeySecretRef
	if ref.Namespace != t.cfg.MasterSecret.Namespace {
		// the controller sends the key to the node's endpoint: it reads
		// none but the Secrets of its own namespace.
		return nil, fmt.Errorf("admin key secret %s/%s: not in namespace %s", ref.Namespace, ref.Name, t.cfg.MasterSecret.Namespace)
	}
	var sec corev1.Secret
	if err := t.cfg.Reader.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &sec); err != nil {
		return nil, fmt.Errorf("admin key secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	key := strings.TrimSpace(string(sec.Data[ref.Key]))
	if key == "" {
		return nil, fmt.Errorf("admin key secret %s/%s has no key %q", ref.Namespace, ref.Name, ref.Key)
	}
	return newClient(spec, key)
}

func newClient(spec *v1alpha1.AirlockNodeSpec, key string) (*airlock.Client, error) {
	cfg := airlock.Config{Address: spec.Endpoint, Key: key}
	if strings.HasPrefix(spec.Endpoint, "https://") && len(spec.CABundle) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(spec.CABundle) {
			return nil, errors.New("caBundle holds no PEM certificate")
		}
		cfg.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return airlock.New(cfg)
}

// session is one connection to the node's event stream: hello, resync,
// fencing, then events until the stream ends. reached says the daemon was
// reached.
func (t *Tracker) session(ctx context.Context, name string, spec v1alpha1.AirlockNodeSpec) (reached bool, err error) {
	cl, err := t.connect(ctx, &spec)
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cl.NodeEvents(sctx, t.cfg.Heartbeat)
	if err != nil {
		return false, err
	}
	defer stream.Close()
	// a stream silent for three heartbeats is dropped.
	watchdog := time.AfterFunc(3*t.cfg.Heartbeat+time.Second, cancel)
	defer watchdog.Stop()
	hello, err := stream.Next()
	if err != nil {
		return false, err
	}
	if hello.Type != "hello" || hello.Node == nil {
		return false, fmt.Errorf("event stream began with %q, not hello", hello.Type)
	}
	list, err := cl.ListSandboxes(sctx, api.ListSandboxes{All: true})
	if err != nil {
		return true, fmt.Errorf("listing sandboxes: %w", err)
	}
	t.mu.Lock()
	n := t.nodes[name]
	if n == nil || sctx.Err() != nil {
		t.mu.Unlock()
		return true, sctx.Err()
	}
	n.admin = cl
	if n.bootID != hello.Node.BootID {
		// a daemon with other state, maybe: tenants are made again.
		n.tenants = map[string]*tenant{}
	}
	n.bootID = hello.Node.BootID
	n.setNode(hello.Node)
	n.lastEvent = time.Now()
	n.byExternal = map[string]DaemonSandbox{}
	for _, sb := range list {
		if sb.ExternalID != "" {
			n.byExternal[sb.ExternalID] = DaemonSandbox{ID: sb.ID, Tenant: sb.Tenant, Ended: sb.Ended != nil, EndReason: sb.EndReason}
		}
	}
	n.synced = true
	strict := n.wasLost
	n.setState(StateFencing, "ending the sandboxes the cluster gave up on")
	t.mu.Unlock()
	t.kickStatus()

	if err := t.sweep(sctx, name, cl, list, strict); err != nil {
		return true, fmt.Errorf("fencing: %w", err)
	}
	t.mu.Lock()
	if n := t.nodes[name]; n != nil {
		n.wasLost = false
		n.setState(StateReady, "")
		t.wakeLocked()
	}
	t.mu.Unlock()
	t.kickStatus()
	t.log.Info("airlock node ready", "node", name, "boot_id", hello.Node.BootID, "sandboxes", len(list))
	t.nodeChanged(name)

	for {
		ev, err := stream.Next()
		if err != nil {
			if err == io.EOF {
				err = errors.New("event stream ended")
			}
			return true, err
		}
		watchdog.Reset(3*t.cfg.Heartbeat + time.Second)
		t.apply(name, ev)
	}
}

// apply takes one event of node name.
func (t *Tracker) apply(name string, ev *api.NodeEvent) {
	var affected []affectedObj
	poolNS := ""
	poolChanged := false
	t.mu.Lock()
	n := t.nodes[name]
	if n == nil {
		t.mu.Unlock()
		return
	}
	n.lastEvent = time.Now()
	n.statusDirty = true
	switch ev.Type {
	case "hello", "capacity":
		if ev.Node != nil {
			freed := ev.Node.Allocated.CPUs < n.allocated.CPUs || ev.Node.Allocated.MemoryBytes < n.allocated.MemoryBytes ||
				ev.Node.Capacity != n.capacity
			n.setNode(ev.Node)
			if freed {
				t.wakeLocked()
				poolChanged = true
			}
		}
	case "sandbox.created":
		// Allocated comes from capacity events alone: the daemon counts a
		// create from its admission, and reports that before this.
		if sb := ev.Sandbox; sb != nil {
			if sb.ExternalID != "" {
				n.byExternal[sb.ExternalID] = DaemonSandbox{ID: sb.ID, Tenant: sb.Tenant}
				if _, ok := n.reservations[sb.ExternalID]; ok {
					// the allocation reported holds it now; while both
					// counted it, others were refused: they try again.
					delete(n.reservations, sb.ExternalID)
					t.wakeLocked()
				}
			}
		}
	case "sandbox.ended":
		if sb := ev.Sandbox; sb != nil {
			if sb.ExternalID != "" {
				n.byExternal[sb.ExternalID] = DaemonSandbox{ID: sb.ID, Tenant: sb.Tenant, Ended: true, EndReason: sb.EndReason}
			}
			// the waiters are woken by the capacity event that follows
			affected = affectedBy(sb)
		}
	case "pool":
		if p := ev.Pool; p != nil {
			k := PoolKey{p.Tenant, p.Name}
			old, ok := n.pools[k]
			switch {
			case p.Size == 0 && p.Ready == 0 && p.Filling == 0:
				// the pool is gone
				delete(n.pools, k)
				poolNS, poolChanged = p.Tenant, ok
			case !ok || old != *p:
				n.pools[k] = *p
				poolNS, poolChanged = p.Tenant, true
			}
		}
	}
	t.mu.Unlock()
	for _, a := range affected {
		t.send(a)
	}
	if poolChanged {
		t.pools.send(poolsChanged(poolNS))
	}
}

// dropped handles a session's end: a daemon that does not answer its
// health check is Unreachable at once.
func (t *Tracker) dropped(ctx context.Context, name string, cause error) {
	t.mu.Lock()
	n := t.nodes[name]
	var cl *airlock.Client
	if n != nil {
		cl = n.admin
		n.synced = false
	}
	t.mu.Unlock()
	if n == nil {
		return
	}
	if cl != nil {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := cl.Health(hctx)
		cancel()
		if err == nil {
			t.mu.Lock()
			ready := n.state == StateReady
			t.mu.Unlock()
			if ready {
				// the stream dropped but the daemon answers: reconnect.
				return
			}
		}
	}
	t.mu.Lock()
	changed := false
	switch n.state {
	case StateLost:
	case StateUnreachable:
		n.message = "daemon unreachable: " + errString(cause)
	case StatePending:
		n.message = "not reached: " + errString(cause)
	default:
		changed = n.setState(StateUnreachable, "daemon unreachable: "+errString(cause))
	}
	t.mu.Unlock()
	if changed {
		t.log.Info("airlock node unreachable", "node", name, "cause", errString(cause))
		t.kickStatus()
		t.nodeChanged(name)
	}
}

// checkLost moves the nodes Unreachable for longer than the lost timeout to
// Lost.
func (t *Tracker) checkLost() {
	var lost []string
	now := time.Now()
	t.mu.Lock()
	for _, n := range t.nodes {
		if n.state == StateUnreachable && now.Sub(n.since) >= t.cfg.LostTimeout {
			n.setState(StateLost, fmt.Sprintf("unreachable for more than %s", t.cfg.LostTimeout))
			lost = append(lost, n.name)
		}
	}
	t.mu.Unlock()
	for _, name := range lost {
		t.log.Info("airlock node lost", "node", name)
		t.kickStatus()
		t.nodeChanged(name)
	}
}

func errString(err error) string {
	if err == nil {
		return "stream ended"
	}
	return err.Error()
}

// isConflict reports whether err is the daemon's already_exists.
func isCode(err error, code api.Code) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == code
}
