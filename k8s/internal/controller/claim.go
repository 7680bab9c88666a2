package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/airlock-sandbox/airlock/api"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// FaultEnv names the test-only fault hook: "exit-after-bind" makes the
// controller exit with status 3 right after a daemon bind, before the
// Sandbox is created (the replay test's crash).
const FaultEnv = "AIRLOCK_K8S_FAULT"

// ClaimReconciler serves SandboxClaims whose warm pool's template is the
// controller's (research §3.5): a claim binds a ready entry of its pool's
// daemon pool on the node with the most of them (POST /v1/sandboxes
// {pool, pool_only, external_id: the claim's UID, env, metadata, ttl}),
// the next node on failed_precondition, a cold create from the template
// when none has one; then it creates Sandbox/<claim> (owner: the claim;
// labels launch-type and claim-uid; annotations node and sandbox-id; the
// Sandbox finalizer), writes its status and the claim's: three writes, and
// no other on that path. A replay (the controller died between the bind
// and the Sandbox) finds the daemon sandbox by the claim's UID and binds
// it again, the same one. A claim's expiry follows its lifecycle; a gone
// claim's Sandbox is deleted by this reconciler (no garbage collector is
// relied on).
type ClaimReconciler struct {
	Client client.Client
	// Reader reads uncached (the manager's API reader); nil: the cache
	// alone.
	Reader  client.Reader
	Scheme  *runtime.Scheme
	Nodes   NodeView
	Classes Classes
	// Grants pushes the Secrets a template's grants name before a cold
	// create (nil: a claim with grants is refused).
	Grants *GrantSecrets
	Log    logr.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Fault is the fault hook's value (FaultEnv); Exit ends the process
	// for it (os.Exit when nil).
	Fault string
	Exit  func(int)

	mu sync.Mutex
	// inflight counts binds under way per node and daemon pool, so that
	// concurrent claims spread over the nodes' ready entries.
	inflight map[poolOnNode]int
	// written is the last status each claim was given here: a pass that
	// reads the claim from a cache that has not caught up with it (the
	// Sandbox's events come first) writes it no second time.
	written  map[types.NamespacedName]writtenStatus
	compiled templateCache
}

type writtenStatus struct {
	uid    types.UID
	status extv1.SandboxClaimStatus
}

type poolOnNode struct {
	node string
	pool nodes.PoolKey
}

// SetupWithManager registers the reconciler with workers workers.
func (r *ClaimReconciler) SetupWithManager(mgr ctrl.Manager, workers int) error {
	if r.Fault == "" {
		r.Fault = os.Getenv(FaultEnv)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("sandboxclaim").
		For(&extv1.SandboxClaim{}).
		Watches(&sandboxv1.Sandbox{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &extv1.SandboxClaim{}, handler.OnlyControllerOwner())).
		// A pool's or template's spec (not a pool's status, which each
		// bind and refill changes) can make an unbound claim bindable.
		Watches(&extv1.SandboxWarmPool{}, handler.EnqueueRequestsFromMapFunc(r.claimsOfPool), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&extv1.SandboxTemplate{}, handler.EnqueueRequestsFromMapFunc(r.claimsOfTemplate), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.Nodes.ClaimEvents(), &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
}

// claimsOfPool maps a warm pool to its claims that are not bound yet.
func (r *ClaimReconciler) claimsOfPool(ctx context.Context, o client.Object) []reconcile.Request {
	var claims extv1.SandboxClaimList
	if err := r.Client.List(ctx, &claims, client.InNamespace(o.GetNamespace()), client.MatchingFields{extv1.WarmPoolRefField: o.GetName()}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range claims.Items {
		if claims.Items[i].Status.SandboxStatus.Name == "" {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&claims.Items[i])})
		}
	}
	return out
}

func (r *ClaimReconciler) claimsOfTemplate(ctx context.Context, o client.Object) []reconcile.Request {
	var pools extv1.SandboxWarmPoolList
	if err := r.Client.List(ctx, &pools, client.InNamespace(o.GetNamespace()), client.MatchingFields{extv1.TemplateRefField: o.GetName()}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range pools.Items {
		out = append(out, r.claimsOfPool(ctx, &pools.Items[i])...)
	}
	return out
}

func (r *ClaimReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile binds, refreshes, expires or cleans up one claim.
func (r *ClaimReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var claim extv1.SandboxClaim
	if err := r.Client.Get(ctx, req.NamespacedName, &claim); err != nil {
		if apierrors.IsNotFound(err) {
			r.mu.Lock()
			delete(r.written, req.NamespacedName)
			r.mu.Unlock()
			return reconcile.Result{}, r.deleteSandboxOfGoneClaim(ctx, req.NamespacedName, "")
		}
		return reconcile.Result{}, err
	}
	if !claim.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.deleteSandboxOfGoneClaim(ctx, req.NamespacedName, claim.UID)
	}
	if !r.Nodes.AllSynced() {
		// Just started: a bind made before the restart, its Sandbox never
		// written, is found by its external id only once its node is in
		// the view; binding now would make a second sandbox.
		return reconcile.Result{RequeueAfter: syncWait}, nil
	}

	var sb sandboxv1.Sandbox
	err := r.Client.Get(ctx, req.NamespacedName, &sb)
	if apierrors.IsNotFound(err) && claim.Status.SandboxStatus.Name != "" && r.Reader != nil {
		// Bound, and its Sandbox not in the cache: the cache may be behind
		// the claim's (their events come apart). Not the hot path.
		err = r.Reader.Get(ctx, req.NamespacedName, &sb)
	}
	switch {
	case err == nil && !r.Classes.Owns(blueprint.RuntimeClass(&sb.Spec.PodTemplate)):
		return reconcile.Result{}, nil // not the controller's
	case err == nil && metav1.IsControlledBy(&sb, &claim):
		return r.bound(ctx, &claim, &sb)
	case err == nil:
		return r.nameTaken(ctx, &claim, &sb)
	case !apierrors.IsNotFound(err):
		return reconcile.Result{}, err
	}
	if _, expired := claimExpiry(&claim, r.now()); expired && claim.Status.SandboxStatus.Name != "" {
		// Its Sandbox, gone now, was bound: its expiry goes on (a
		// DeleteForeground claim is deleted once its Sandbox is gone)
		// whatever became of its pool and template.
		return r.expire(ctx, &claim, nil)
	}

	pool, tmpl, err := r.resolve(ctx, &claim)
	if err != nil || tmpl == nil {
		// Not the controller's, or its pool or template not (yet) in the
		// cache: untouched; their watches bring it back.
		return reconcile.Result{}, err
	}
	if _, expired := claimExpiry(&claim, r.now()); expired {
		return r.expire(ctx, &claim, nil)
	}
	spec, err := claimSpec(tmpl, &claim)
	if err != nil {
		return reconcile.Result{}, r.setClaimStatus(ctx, &claim, "", notReady(&claim, claimReason(err), err.Error()))
	}
	bp, err := r.compiled.get(tmpl)
	if err != nil {
		return reconcile.Result{}, r.setClaimStatus(ctx, &claim, "", notReady(&claim, ReasonUnsupported, err.Error()))
	}
	withClaim, err := blueprint.ForPodTemplate(&spec.PodTemplate)
	if err != nil {
		return reconcile.Result{}, r.setClaimStatus(ctx, &claim, "", notReady(&claim, ReasonUnsupported, err.Error()))
	}
	ttl, expired := blueprint.TTL(claimShutdown(&claim), r.now())
	if expired {
		return r.expire(ctx, &claim, nil)
	}
	create := withClaim.Body(string(claim.UID), map[string]string{
		nodes.MetaNamespace: claim.Namespace, nodes.MetaClaim: claim.Name, nodes.MetaUID: string(claim.UID),
	}, ttl)

	b, err := r.bind(ctx, &claim, pool, bp, create)
	if err != nil {
		var ue *nodes.UnschedulableError
		if errors.As(err, &ue) {
			return reconcile.Result{}, r.setClaimStatus(ctx, &claim, "", notReady(&claim, ReasonUnschedulable, ue.Message))
		}
		var ge *GrantError
		if errors.As(err, &ge) {
			return reconcile.Result{RequeueAfter: grantRetry}, r.setClaimStatus(ctx, &claim, "", notReady(&claim, ReasonGrantSecret, ge.Message))
		}
		return reconcile.Result{}, err
	}
	if r.Fault == "exit-after-bind" {
		r.Log.Info("fault hook: exiting after a bind", "claim", req.NamespacedName, "node", b.node, "sandbox", b.sandbox.ID)
		if r.Exit != nil {
			r.Exit(3)
		} else {
			os.Exit(3)
		}
	}
	return r.createSandbox(ctx, &claim, tmpl, spec, b)
}

// resolve finds the claim's warm pool and template in the cache; tmpl is
// nil when either is missing or the template is not the controller's.
func (r *ClaimReconciler) resolve(ctx context.Context, claim *extv1.SandboxClaim) (*extv1.SandboxWarmPool, *extv1.SandboxTemplate, error) {
	var pool extv1.SandboxWarmPool
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: claim.Spec.WarmPoolRef.Name}, &pool); err != nil {
		return nil, nil, client.IgnoreNotFound(err)
	}
	var tmpl extv1.SandboxTemplate
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: pool.Spec.TemplateRef.Name}, &tmpl); err != nil {
		return nil, nil, client.IgnoreNotFound(err)
	}
	if !r.Classes.Owns(blueprint.RuntimeClass(&tmpl.Spec.PodTemplate)) {
		return nil, nil, nil
	}
	return &pool, &tmpl, nil
}

// binding is a daemon sandbox bound to a claim.
type binding struct {
	node    string
	sandbox *api.Sandbox
	warm    bool
}

// bind gets the claim its daemon sandbox: the one a node already holds
// for the claim's UID (a replay), else a ready entry of the pool's daemon
// pool, trying the nodes with the most first, else a cold create on the
// node Place chooses.
func (r *ClaimReconciler) bind(ctx context.Context, claim *extv1.SandboxClaim, pool *extv1.SandboxWarmPool, bp *blueprint.Blueprint, create *api.CreateSandbox) (*binding, error) {
	uid := string(claim.UID)
	for _, n := range r.Nodes.Nodes() {
		if d, ok := r.Nodes.DaemonSandbox(n.Name, uid); ok && !d.Ended {
			// A replay: the create with the same external id answers the
			// sandbox made before.
			return r.createOn(ctx, n.Name, claim.Namespace, create, coldTimeout)
		}
	}
	key := nodes.PoolKey{Tenant: claim.Namespace, Name: daemonPoolName(pool.Name, bp.Hash)}
	for _, node := range r.warmCandidates(bp.RuntimeClass, key) {
		warm := *create
		warm.Pool, warm.PoolOnly = key.Name, true
		pk := poolOnNode{node, key}
		r.mu.Lock()
		if r.inflight == nil {
			r.inflight = map[poolOnNode]int{}
		}
		r.inflight[pk]++
		r.mu.Unlock()
		b, err := r.createOn(ctx, node, claim.Namespace, &warm, warmTimeout)
		r.mu.Lock()
		if r.inflight[pk]--; r.inflight[pk] <= 0 {
			delete(r.inflight, pk)
		}
		r.mu.Unlock()
		if err == nil {
			return b, nil
		}
		var ae *api.Error
		if errors.As(err, &ae) && (ae.Code == api.CodeFailedPrecondition || ae.Code == api.CodeNotFound) {
			continue // no entry ready there (or no pool yet): the next node
		}
		// Not a refusal: the bind may have happened; retrying the same
		// node with the same external id cannot make a second sandbox.
		return nil, err
	}
	node, release, err := r.Nodes.Place(nodes.Request{
		Key:          uid,
		RuntimeClass: bp.RuntimeClass,
		CPUs:         bp.CPUs(),
		MemoryBytes:  bp.MemoryBytes(),
		Waiter:       claim,
	})
	if err != nil {
		return nil, err
	}
	// A pooled sandbox holds no grants (the warm pool of such a template
	// makes none): the grants' Secrets go to the node of the cold create.
	if err := r.Grants.Push(ctx, node, claim.Namespace, bp.Secrets); err != nil {
		release()
		return nil, err
	}
	b, err := r.createOn(ctx, node, claim.Namespace, create, coldTimeout)
	if err != nil {
		release()
		return nil, err
	}
	return b, nil
}

// warmCandidates are the Ready nodes serving class with ready entries of
// the daemon pool key not taken by binds under way, the most first, then
// the least allocated.
func (r *ClaimReconciler) warmCandidates(class string, key nodes.PoolKey) []string {
	type cand struct {
		name  string
		ready int
		alloc float64
	}
	var cs []cand
	r.mu.Lock()
	for _, n := range r.Nodes.ReadyNodes(class) {
		ready := n.Pools[key].Ready - r.inflight[poolOnNode{n.Name, key}]
		if ready <= 0 {
			continue
		}
		alloc := 0.0
		if n.Capacity.CPUs > 0 {
			alloc = (n.Allocated.CPUs + n.Assumed.CPUs) / n.Capacity.CPUs
		}
		cs = append(cs, cand{n.Name, ready, alloc})
	}
	r.mu.Unlock()
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].ready != cs[j].ready {
			return cs[i].ready > cs[j].ready
		}
		if cs[i].alloc != cs[j].alloc {
			return cs[i].alloc < cs[j].alloc
		}
		return cs[i].name < cs[j].name
	})
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.name
	}
	return out
}

// Timeouts of a daemon create: a warm bind answers from memory; a cold one
// may pull and unpack an image.
const (
	warmTimeout = 15 * time.Second
	coldTimeout = 5 * time.Minute
)

func (r *ClaimReconciler) createOn(ctx context.Context, node, ns string, create *api.CreateSandbox, timeout time.Duration) (*binding, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := r.Nodes.Tenant(ctx, node, ns)
	if err != nil {
		return nil, err
	}
	sb, err := c.CreateSandbox(ctx, create)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	return &binding{node: node, sandbox: sb, warm: sb.Pool != ""}, nil
}

// createSandbox makes Sandbox/<claim> for a bound daemon sandbox (write
// 1), its status (write 2) and the claim's (write 3).
func (r *ClaimReconciler) createSandbox(ctx context.Context, claim *extv1.SandboxClaim, tmpl *extv1.SandboxTemplate, spec *sandboxv1.SandboxBlueprint, b *binding) (reconcile.Result, error) {
	launch := sandboxv1.SandboxLaunchTypeCold
	if b.warm {
		launch = sandboxv1.SandboxLaunchTypeWarm
	}
	sb := &sandboxv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: claim.Namespace,
			Name:      claim.Name,
			Labels: map[string]string{
				sandboxv1.SandboxLaunchTypeLabel: launch,
				nodes.LabelClaimUID:              string(claim.UID),
			},
			Annotations: map[string]string{
				nodes.AnnotationNode:                   b.node,
				nodes.AnnotationSandboxID:              b.sandbox.ID,
				sandboxv1.SandboxTemplateRefAnnotation: tmpl.Name,
			},
			Finalizers: []string{FinalizerSandbox},
		},
		// The claim's shutdown time is its Sandbox's too, so that a later
		// one moves the daemon sandbox's expiry (the Sandbox reconciler
		// extends it); the claim's own expiry deletes the Sandbox.
		Spec: sandboxv1.SandboxSpec{SandboxBlueprint: *spec, Lifecycle: sandboxv1.Lifecycle{ShutdownTime: claimShutdown(claim)}},
	}
	if err := controllerutil.SetControllerReference(claim, sb, r.Scheme); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.Client.Create(ctx, sb); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Made by an earlier pass the cache has not shown yet, or
			// someone else's: the Sandbox watch brings the claim back.
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, err
	}
	if b.sandbox.Ended != nil {
		// Bound again to a sandbox that has ended since: the Sandbox
		// reconciler says so in its status.
		return reconcile.Result{}, nil
	}
	MarkReady(sb, b.node)
	if err := r.Client.Status().Update(ctx, sb); err != nil && !apierrors.IsConflict(err) {
		// (A conflict: the Sandbox reconciler saw the new Sandbox first
		// and wrote the same status.)
		return reconcile.Result{}, err
	}
	if err := r.setClaimStatus(ctx, claim, sb.Name, readyOf(claim, sb)); err != nil {
		return reconcile.Result{}, err
	}
	return r.claimResult(claim), nil
}

// bound keeps a bound claim's status, from its Sandbox's (a Sandbox whose
// status was never written, the controller having died between its
// create and its status, is given it by the Sandbox reconciler), and
// enforces the claim's lifecycle.
func (r *ClaimReconciler) bound(ctx context.Context, claim *extv1.SandboxClaim, sb *sandboxv1.Sandbox) (reconcile.Result, error) {
	if _, expired := claimExpiry(claim, r.now()); expired {
		return r.expire(ctx, claim, sb)
	}
	if want := claimShutdown(claim); sb.DeletionTimestamp.IsZero() && !want.Equal(sb.Spec.ShutdownTime) {
		// The claim's shutdown time moved (not on the bind's path).
		sb = sb.DeepCopy()
		sb.Spec.ShutdownTime = want
		if err := r.Client.Update(ctx, sb); err != nil {
			return reconcile.Result{}, err
		}
	}
	if len(sb.Status.Conditions) == 0 && sb.DeletionTimestamp.IsZero() {
		// Its status is not written yet (or not in the cache yet: the
		// bind's own write): nothing to tell the claim.
		return r.claimResult(claim), nil
	}
	ready := readyOf(claim, sb)
	if !sb.DeletionTimestamp.IsZero() {
		ready = notReady(claim, "SandboxDeleting", "the Sandbox is being deleted")
	}
	if err := r.setClaimStatus(ctx, claim, sb.Name, ready, finishedOf(sb)); err != nil {
		return reconcile.Result{}, err
	}
	return r.claimResult(claim), nil
}

// claimShutdown is a copy of the claim's shutdown time, or nil.
func claimShutdown(claim *extv1.SandboxClaim) *metav1.Time {
	if claim.Spec.Lifecycle == nil || claim.Spec.Lifecycle.ShutdownTime == nil {
		return nil
	}
	return claim.Spec.Lifecycle.ShutdownTime.DeepCopy()
}

// claimResult asks for the claim again when it expires.
func (r *ClaimReconciler) claimResult(claim *extv1.SandboxClaim) reconcile.Result {
	if at, _ := claimExpiry(claim, r.now()); !at.IsZero() {
		return reconcile.Result{RequeueAfter: max(at.Sub(r.now()), time.Millisecond)}
	}
	return reconcile.Result{}
}

// expire ends an expired claim by its shutdownPolicy: Delete and
// DeleteForeground delete the claim (DeleteForeground after its Sandbox is
// gone) and its Sandbox; Retain (the default) deletes the Sandbox and keeps
// the claim, Ready=False ClaimExpired.
func (r *ClaimReconciler) expire(ctx context.Context, claim *extv1.SandboxClaim, sb *sandboxv1.Sandbox) (reconcile.Result, error) {
	if sb != nil && sb.DeletionTimestamp.IsZero() {
		if err := r.Client.Delete(ctx, sb, client.Preconditions{UID: &sb.UID}); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, err
		}
	}
	switch claim.Spec.Lifecycle.ShutdownPolicy {
	case extv1.ShutdownPolicyDeleteForeground:
		if sb != nil {
			return reconcile.Result{}, nil // the Sandbox's deletion brings the claim back
		}
		fallthrough
	case extv1.ShutdownPolicyDelete:
		return reconcile.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, claim, client.Preconditions{UID: &claim.UID}))
	}
	return reconcile.Result{}, r.setClaimStatus(ctx, claim, "", notReady(claim, extv1.ClaimExpiredReason, "Claim expired. Sandbox cleanup initiated."), finishedOf(sb))
}

// nameTaken handles a Sandbox of the claim's name that is not the claim's:
// one an earlier claim of that name controls is deleted (its claim is
// gone); any other is left alone and the claim says so.
func (r *ClaimReconciler) nameTaken(ctx context.Context, claim *extv1.SandboxClaim, sb *sandboxv1.Sandbox) (reconcile.Result, error) {
	if ref := metav1.GetControllerOf(sb); ref != nil && ref.Kind == "SandboxClaim" && ref.Name == claim.Name {
		if sb.DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, sb, client.Preconditions{UID: &sb.UID}); client.IgnoreNotFound(err) != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{}, nil // its deletion brings the claim back
	}
	return reconcile.Result{}, r.setClaimStatus(ctx, claim, "", notReady(claim, ReasonSandboxNameTaken, fmt.Sprintf("Sandbox %q exists and is not this claim's", sb.Name)))
}

// deleteSandboxOfGoneClaim deletes Sandbox key when a SandboxClaim of its
// name controls it and that claim is gone (uid: the UID of the claim being
// deleted, or "" when it is gone from the cache).
func (r *ClaimReconciler) deleteSandboxOfGoneClaim(ctx context.Context, key types.NamespacedName, uid types.UID) error {
	var sb sandboxv1.Sandbox
	if err := r.Client.Get(ctx, key, &sb); err != nil {
		return client.IgnoreNotFound(err)
	}
	ref := metav1.GetControllerOf(&sb)
	if ref == nil || ref.Kind != "SandboxClaim" || ref.Name != key.Name || (uid != "" && ref.UID != uid) || !sb.DeletionTimestamp.IsZero() {
		return nil
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, &sb, client.Preconditions{UID: &sb.UID}))
}

// readyOf is the claim's Ready condition from its Sandbox's.
func readyOf(claim *extv1.SandboxClaim, sb *sandboxv1.Sandbox) metav1.Condition {
	if c := meta.FindStatusCondition(sb.Status.Conditions, string(sandboxv1.SandboxConditionReady)); c != nil {
		out := *c
		out.ObservedGeneration = claim.Generation
		return out
	}
	return notReady(claim, "SandboxNotReady", "the Sandbox is not ready")
}

// finishedOf is the Sandbox's Finished condition, if any (for the claim's
// ttlSecondsAfterFinished).
func finishedOf(sb *sandboxv1.Sandbox) *metav1.Condition {
	if sb == nil {
		return nil
	}
	return meta.FindStatusCondition(sb.Status.Conditions, string(sandboxv1.SandboxConditionFinished))
}

func notReady(claim *extv1.SandboxClaim, reason, msg string) metav1.Condition {
	return metav1.Condition{
		Type: string(sandboxv1.SandboxConditionReady), Status: metav1.ConditionFalse,
		Reason: reason, Message: msg, ObservedGeneration: claim.Generation,
	}
}

// setClaimStatus writes the claim's status (sandbox name, Ready, and
// Finished when given) if it changes, and keeps it in claim.
func (r *ClaimReconciler) setClaimStatus(ctx context.Context, claim *extv1.SandboxClaim, sandbox string, ready metav1.Condition, finished ...*metav1.Condition) error {
	st := claim.Status.DeepCopy()
	st.SandboxStatus.Name = sandbox
	meta.SetStatusCondition(&st.Conditions, ready)
	for _, f := range finished {
		if f != nil {
			meta.SetStatusCondition(&st.Conditions, *f)
		}
	}
	if equalClaimStatus(st, &claim.Status) {
		return nil
	}
	key := client.ObjectKeyFromObject(claim)
	r.mu.Lock()
	last, ok := r.written[key]
	r.mu.Unlock()
	if ok && last.uid == claim.UID && equalClaimStatus(st, &last.status) {
		return nil // written already; the cache is behind
	}
	c := claim.DeepCopy()
	c.Status = *st
	if err := r.Client.Status().Update(ctx, c); err != nil {
		return err
	}
	claim.Status = c.Status
	r.mu.Lock()
	if r.written == nil {
		r.written = map[types.NamespacedName]writtenStatus{}
	}
	r.written[key] = writtenStatus{claim.UID, *c.Status.DeepCopy()}
	r.mu.Unlock()
	return nil
}

// equalClaimStatus compares statuses ignoring conditions' transition times
// (SetStatusCondition keeps them when the status does not change).
func equalClaimStatus(a, b *extv1.SandboxClaimStatus) bool {
	if a.SandboxStatus.Name != b.SandboxStatus.Name || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for _, c := range a.Conditions {
		d := meta.FindStatusCondition(b.Conditions, c.Type)
		if d == nil || d.Status != c.Status || d.Reason != c.Reason || d.Message != c.Message || d.ObservedGeneration != c.ObservedGeneration {
			return false
		}
	}
	return true
}
