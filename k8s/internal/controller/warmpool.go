package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/airlock-sandbox/airlock/api"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// WarmPoolFinalizer is on every SandboxWarmPool the controller serves,
// until its daemon pools are removed from the nodes.
const WarmPoolFinalizer = "airlock.dev/warmpool"

// daemonPoolPrefix begins the name of every daemon pool a warm pool sets;
// the controller removes those in a tenant that no live warm pool of its
// namespace names.
const daemonPoolPrefix = "swp-"

// poolRetry is how soon a warm pool waiting on a node (its daemon pool on
// an Unreachable node still to be removed) is looked at again.
const poolRetry = 5 * time.Second

// WarmPoolReconciler serves SandboxWarmPools whose template is the
// controller's (its runtime class is one of Classes): it shares
// spec.replicas over the Ready nodes serving the class, one daemon pool a
// node (tenant = namespace, named by daemonPoolName), and keeps status
// (replicas: the shares' sum; readyReplicas: the nodes' ready entries;
// selector; observedGeneration). Replicas the nodes cannot hold (64 a
// pool a node, capacity) are left out of status.replicas and told in a
// Warning event, ReplicasCapped. A request with an empty name is the
// sweep of its namespace: daemon pools no live warm pool names are
// removed.
type WarmPoolReconciler struct {
	Client  client.Client
	Nodes   NodeView
	Classes Classes
	Events  recorder.EventRecorder
	Log     logr.Logger

	// Now is the clock (time.Now when nil).
	Now func() time.Time

	compiled templateCache

	mu sync.Mutex
	// lastStatus is when each pool's status was last written.
	lastStatus map[types.NamespacedName]time.Time
}

func (r *WarmPoolReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// readyEvery is how often a warm pool's readyReplicas alone is written.
const readyEvery = 2 * time.Second

// SetupWithManager registers the reconciler with workers workers.
func (r *WarmPoolReconciler) SetupWithManager(mgr ctrl.Manager, workers int) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("sandboxwarmpool").
		For(&extv1.SandboxWarmPool{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, deletingPredicate()))).
		Watches(&extv1.SandboxTemplate{}, handler.EnqueueRequestsFromMapFunc(r.poolsOfTemplate)).
		WatchesRawSource(source.Channel(r.Nodes.PoolEvents(), handler.EnqueueRequestsFromMapFunc(r.poolsOfTenant))).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
}

// deletingPredicate passes updates that set a deletion timestamp.
func deletingPredicate() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectNew.GetDeletionTimestamp() != nil
	}}
}

func (r *WarmPoolReconciler) poolsOfTemplate(ctx context.Context, o client.Object) []reconcile.Request {
	var pools extv1.SandboxWarmPoolList
	if err := r.Client.List(ctx, &pools, client.InNamespace(o.GetNamespace()), client.MatchingFields{extv1.TemplateRefField: o.GetName()}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(pools.Items)+1)
	for i := range pools.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pools.Items[i])})
	}
	// A template's new hash names new daemon pools: the old ones go in the
	// namespace's sweep.
	return append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace()}})
}

// poolsOfTenant maps a tracker pool event: its namespace's warm pools and
// sweep, or every namespace's for a node-level change (empty namespace).
func (r *WarmPoolReconciler) poolsOfTenant(ctx context.Context, o client.Object) []reconcile.Request {
	var opts []client.ListOption
	namespaces := map[string]bool{}
	if ns := o.GetNamespace(); ns != "" {
		opts = append(opts, client.InNamespace(ns))
		namespaces[ns] = true
	} else {
		for _, n := range r.Nodes.Nodes() {
			for k := range n.Pools {
				if strings.HasPrefix(k.Name, daemonPoolPrefix) {
					namespaces[k.Tenant] = true
				}
			}
		}
	}
	var pools extv1.SandboxWarmPoolList
	if err := r.Client.List(ctx, &pools, opts...); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range pools.Items {
		namespaces[pools.Items[i].Namespace] = true
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pools.Items[i])})
	}
	for ns := range namespaces {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns}})
	}
	return out
}

// Reconcile brings one warm pool's daemon pools and status to its spec, or
// (empty name) sweeps its namespace.
func (r *WarmPoolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if !r.Nodes.AllSynced() {
		// Just started: a node not reached yet is not a node gone; its
		// share must not move, nor its daemon pools be swept.
		return reconcile.Result{RequeueAfter: syncWait}, nil
	}
	if req.Name == "" {
		pending, err := r.sweep(ctx, req.Namespace)
		if err == nil && pending {
			return reconcile.Result{RequeueAfter: poolRetry}, nil
		}
		return reconcile.Result{}, err
	}
	var pool extv1.SandboxWarmPool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.mu.Lock()
			delete(r.lastStatus, req.NamespacedName)
			r.mu.Unlock()
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return r.finish(ctx, &pool)
	}
	tmpl, bp, err := r.blueprintOf(ctx, &pool)
	if tmpl == nil && !controllerutil.ContainsFinalizer(&pool, WarmPoolFinalizer) {
		// Not the controller's (another runtime class, or a template it
		// has never seen): untouched.
		return reconcile.Result{}, nil
	}
	if !controllerutil.ContainsFinalizer(&pool, WarmPoolFinalizer) {
		controllerutil.AddFinalizer(&pool, WarmPoolFinalizer)
		if err := r.Client.Update(ctx, &pool); err != nil {
			return reconcile.Result{}, err
		}
	}
	want := int32(1)
	if pool.Spec.Replicas != nil {
		want = *pool.Spec.Replicas
	}
	var (
		total, ready int
		setErr       error
	)
	if err != nil {
		// The template is gone, no longer the controller's or refused:
		// the pool holds nothing; the sweep removes its daemon pools.
		if pool.Status.Replicas != 0 || pool.Status.ObservedGeneration != pool.Generation {
			r.Events.Eventf(&pool, tmpl, corev1.EventTypeWarning, "TemplateUnusable", "Split", "%v", err)
		}
	} else {
		total, ready, setErr = r.apply(ctx, &pool, bp)
		if int(want) > total && setErr == nil && int32(total) != pool.Status.Replicas {
			r.Events.Eventf(&pool, nil, corev1.EventTypeWarning, "ReplicasCapped", "Split",
				"%d of %d replicas: the Ready airlock nodes serving runtime class %q hold no more (capacity, and at most %d a pool a node)",
				total, want, bp.RuntimeClass, maxDaemonPoolSize)
		}
	}
	if _, err := r.sweep(ctx, pool.Namespace); err != nil {
		setErr = errors.Join(setErr, err)
	}
	st := extv1.SandboxWarmPoolStatus{
		Replicas:           int32(total),
		ReadyReplicas:      int32(ready),
		Selector:           sandboxv1.SandboxWarmPoolLabel + "=" + pool.Name,
		ObservedGeneration: pool.Generation,
	}
	var res reconcile.Result
	if st != pool.Status {
		// A change of readyReplicas alone (each claim's bind, each
		// refill) is written at most every readyEvery, so that a burst of
		// claims does not bring a pool status write each.
		onlyReady := st.Replicas == pool.Status.Replicas && st.Selector == pool.Status.Selector && st.ObservedGeneration == pool.Status.ObservedGeneration
		r.mu.Lock()
		last := r.lastStatus[req.NamespacedName]
		r.mu.Unlock()
		if wait := readyEvery - r.now().Sub(last); onlyReady && wait > 0 {
			res.RequeueAfter = wait
		} else {
			pool.Status = st
			if err := r.Client.Status().Update(ctx, &pool); err != nil {
				return reconcile.Result{}, errors.Join(setErr, err)
			}
			r.mu.Lock()
			if r.lastStatus == nil {
				r.lastStatus = map[types.NamespacedName]time.Time{}
			}
			r.lastStatus[req.NamespacedName] = r.now()
			r.mu.Unlock()
		}
	}
	return res, setErr
}

// blueprintOf resolves the pool's template: nil when it is not the
// controller's (or unknown), with an error when it was the controller's
// and cannot be used now.
func (r *WarmPoolReconciler) blueprintOf(ctx context.Context, pool *extv1.SandboxWarmPool) (*extv1.SandboxTemplate, *blueprint.Blueprint, error) {
	var tmpl extv1.SandboxTemplate
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}, &tmpl); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, fmt.Errorf("SandboxTemplate %q not found", pool.Spec.TemplateRef.Name)
		}
		return nil, nil, err
	}
	if !r.Classes.Owns(blueprint.RuntimeClass(&tmpl.Spec.PodTemplate)) {
		return nil, nil, fmt.Errorf("SandboxTemplate %q is not served by airlock (runtime class %q)", tmpl.Name, blueprint.RuntimeClass(&tmpl.Spec.PodTemplate))
	}
	bp, err := r.compiled.get(&tmpl)
	if err != nil {
		return &tmpl, nil, err
	}
	if len(bp.Create.Grants) > 0 {
		return &tmpl, nil, fmt.Errorf("SandboxTemplate %q has grants (%s): a pooled sandbox cannot hold grants (a daemon pool refuses them), so this pool holds none and its claims are made cold", tmpl.Name, blueprint.AnnotationGrants)
	}
	return &tmpl, bp, nil
}

// apply sets the pool's share on every Ready node serving its class and
// removes it from those that get none (and from Ready nodes that may not
// hold it: cordoned, or not serving the class); it returns the shares' sum and
// the ready entries on those nodes.
func (r *WarmPoolReconciler) apply(ctx context.Context, pool *extv1.SandboxWarmPool, bp *blueprint.Blueprint) (total, ready int, err error) {
	want := 1
	if pool.Spec.Replicas != nil {
		want = int(*pool.Spec.Replicas)
	}
	name := daemonPoolName(pool.Name, bp.Hash)
	key := nodes.PoolKey{Tenant: pool.Namespace, Name: name}
	readyNodes := r.Nodes.ReadyNodes(bp.RuntimeClass)
	sn := make([]shareNode, 0, len(readyNodes))
	for _, n := range readyNodes {
		cur := n.Pools[key]
		sn = append(sn, shareNode{Name: n.Name, Current: cur.Size, Fit: fitOn(n.Free(), request(bp), cur.Ready+cur.Filling)})
	}
	shares, total := splitReplicas(want, sn)
	def := &api.SetPool{
		Isolation: bp.Create.Isolation,
		Image:     bp.Create.Image,
		Limits:    bp.Create.Limits,
		Network:   bp.Create.Network,
	}
	var errs []error
	for _, n := range readyNodes {
		cur, has := n.Pools[key]
		k := shares[n.Name]
		switch {
		case k > 0 && (!has || cur.Size != k):
			err := r.setPool(ctx, n.Name, pool.Namespace, name, def, k)
			if err != nil {
				errs = append(errs, fmt.Errorf("node %s: set pool %s: %w", n.Name, name, err))
			}
		case k == 0 && has:
			if err := r.deletePool(ctx, n.Name, pool.Namespace, name); err != nil {
				errs = append(errs, err)
			}
		}
		if has && k > 0 {
			ready += min(cur.Ready, k)
		}
	}
	// Ready nodes that may not hold it (cordoned, another class) keep none.
	for _, n := range r.Nodes.Nodes() {
		if _, has := n.Pools[key]; has && n.State == nodes.StateReady && !slices.ContainsFunc(readyNodes, func(s nodes.Snapshot) bool { return s.Name == n.Name }) {
			if err := r.deletePool(ctx, n.Name, pool.Namespace, name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		err = errors.Join(errs...)
		r.Events.Eventf(pool, nil, corev1.EventTypeWarning, "DaemonPoolFailed", "Split", "%v", err)
	}
	return total, ready, err
}

// poolTimeout bounds a daemon pool's PUT or DELETE (a DELETE answers when
// the pool's ready sandboxes are gone).
const poolTimeout = time.Minute

func (r *WarmPoolReconciler) setPool(ctx context.Context, node, ns, name string, def *api.SetPool, size int) error {
	ctx, cancel := context.WithTimeout(ctx, poolTimeout)
	defer cancel()
	c, err := r.Nodes.Tenant(ctx, node, ns)
	if err != nil {
		return err
	}
	d := *def
	d.Size = size
	_, err = c.SetPool(ctx, name, &d)
	return err
}

func (r *WarmPoolReconciler) deletePool(ctx context.Context, node, ns, name string) error {
	ctx, cancel := context.WithTimeout(ctx, poolTimeout)
	defer cancel()
	c, err := r.Nodes.Tenant(ctx, node, ns)
	if err == nil {
		err = c.DeletePool(ctx, name)
	}
	var ae *api.Error
	if err != nil && !(errors.As(err, &ae) && ae.Code == api.CodeNotFound) {
		return fmt.Errorf("node %s: delete pool %s: %w", node, name, err)
	}
	return nil
}

// sweep removes, on every reachable node, the daemon pools of tenant ns
// that no live warm pool of namespace ns names now (a deleted pool's, an
// old template's). pending says some are on nodes that cannot be reached
// now and are not Lost.
func (r *WarmPoolReconciler) sweep(ctx context.Context, ns string) (pending bool, err error) {
	var pools extv1.SandboxWarmPoolList
	if err := r.Client.List(ctx, &pools, client.InNamespace(ns)); err != nil {
		return false, err
	}
	live := map[string]bool{}
	for i := range pools.Items {
		p := &pools.Items[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if _, bp, err := r.blueprintOf(ctx, p); err == nil {
			live[daemonPoolName(p.Name, bp.Hash)] = true
		}
	}
	var errs []error
	for _, n := range r.Nodes.Nodes() {
		for k := range n.Pools {
			if k.Tenant != ns || !strings.HasPrefix(k.Name, daemonPoolPrefix) || live[k.Name] {
				continue
			}
			switch n.State {
			case nodes.StateReady:
				if err := r.deletePool(ctx, n.Name, ns, k.Name); err != nil {
					errs = append(errs, err)
				}
			case nodes.StateLost:
				// Given up; swept when it comes back.
			default:
				pending = true
			}
		}
	}
	return pending, errors.Join(errs...)
}

// finish removes a deleted warm pool's daemon pools (the sweep of its
// namespace, which no longer counts it) and then its finalizer; while one
// is on a node that is neither reachable nor Lost, it waits.
func (r *WarmPoolReconciler) finish(ctx context.Context, pool *extv1.SandboxWarmPool) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(pool, WarmPoolFinalizer) {
		return reconcile.Result{}, nil
	}
	pending, err := r.sweep(ctx, pool.Namespace)
	if err != nil {
		return reconcile.Result{}, err
	}
	if pending {
		return reconcile.Result{RequeueAfter: poolRetry}, nil
	}
	controllerutil.RemoveFinalizer(pool, WarmPoolFinalizer)
	return reconcile.Result{}, client.IgnoreNotFound(r.Client.Update(ctx, pool))
}
