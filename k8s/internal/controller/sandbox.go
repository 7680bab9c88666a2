// Package controller holds airlock's reconcilers of agent-sandbox's kinds:
// Sandbox (sandbox.go), SandboxWarmPool (warmpool.go), SandboxClaim
// (claim.go). They act only on objects whose pod template names one of the
// controller's runtime classes (--runtime-classes); anything else is left
// untouched: no finalizer, no status.
package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// FinalizerSandbox keeps a Sandbox until its daemon sandbox is ended.
const FinalizerSandbox = "airlock.dev/sandbox"

// Condition reasons airlock's Sandboxes carry besides upstream's.
const (
	ReasonUnsupported   = "Unsupported"
	ReasonUnschedulable = "Unschedulable"
	ReasonCreateFailed  = "CreateFailed"
	ReasonSandboxReady  = "SandboxReady"
	ReasonSandboxEnded  = "SandboxEnded"
)

// conflictRetry is when a reconcile whose write met a newer object (the
// cache behind) is tried again, if the newer object's event has not
// already brought it back.
const conflictRetry = 200 * time.Millisecond

// syncWait is when a reconcile waiting for the tracker's view (after a
// start, or a node not reached yet) is tried again.
const syncWait = 250 * time.Millisecond

// claimStatusWait is how long a claim's new Sandbox is left to its
// claim's bind for its first status (claimsFirstStatus).
const claimStatusWait = 3 * time.Second

// Classes is the set of runtime classes the controller owns.
type Classes map[string]bool

// Owns reports whether a pod template with runtimeClassName class is the
// controller's.
func (c Classes) Owns(class string) bool { return class != "" && c[class] }

// SandboxReconciler places airlock-owned Sandboxes on nodes and keeps their
// status: see docs/kubernetes.md.
type SandboxReconciler struct {
	Client  client.Client
	Nodes   *nodes.Tracker
	Classes Classes
	// Grants pushes the Secrets a blueprint's grants name (nil: a
	// Sandbox with grants is refused).
	Grants *GrantSecrets
	Log    logr.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// SetupWithManager adds the reconciler to mgr with workers workers; the
// tracker's SandboxEvents feed it too.
func (r *SandboxReconciler) SetupWithManager(mgr ctrl.Manager, workers int) error {
	owned := predicate.NewPredicateFuncs(func(o client.Object) bool {
		s, ok := o.(*sandboxv1.Sandbox)
		return ok && r.Classes.Owns(blueprint.RuntimeClass(&s.Spec.PodTemplate))
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("sandbox").
		For(&sandboxv1.Sandbox{}, builder.WithPredicates(owned)).
		WatchesRawSource(source.Channel(r.Nodes.SandboxEvents(), &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
}

func (r *SandboxReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// ExternalID is the external id of s's daemon sandbox: its claim's UID for
// a Sandbox a SandboxClaim made (its controller), its own UID otherwise.
func ExternalID(s *sandboxv1.Sandbox) string {
	if ref := metav1.GetControllerOf(s); ref != nil && ref.Kind == "SandboxClaim" &&
		ref.APIVersion == extv1.GroupVersion.String() {
		return string(ref.UID)
	}
	return string(s.UID)
}

// claimsFirstStatus says s is a Sandbox a claim made (placed, the
// claim its controller) whose status the claim has not written yet.
func claimsFirstStatus(s *sandboxv1.Sandbox) bool {
	ref := metav1.GetControllerOf(s)
	return ref != nil && ref.Kind == "SandboxClaim" && ref.APIVersion == extv1.GroupVersion.String() &&
		len(s.Status.Conditions) == 0 && s.Annotations[nodes.AnnotationNode] != "" && s.Annotations[nodes.AnnotationSandboxID] != ""
}

// MarkReady sets s's status as placed on node and Ready, as the Sandbox
// reconciler keeps it (a claim's bind writes it so, in its one status
// write).
func MarkReady(s *sandboxv1.Sandbox, node string) {
	s.Status.NodeName = node
	setCond(s, sandboxv1.SandboxConditionPodScheduled, true, sandboxv1.SandboxReasonPodScheduled, "placed on airlock node "+node)
	setCond(s, sandboxv1.SandboxConditionReady, true, ReasonSandboxReady, "the sandbox runs on airlock node "+node)
}

func setCond(s *sandboxv1.Sandbox, typ sandboxv1.ConditionType, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{
		Type: string(typ), Status: st, Reason: reason, Message: msg, ObservedGeneration: s.Generation,
	})
}

func isTrue(s *sandboxv1.Sandbox, typ sandboxv1.ConditionType) bool {
	return meta.IsStatusConditionTrue(s.Status.Conditions, string(typ))
}

// Reconcile brings one Sandbox to its state.
func (r *SandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var s sandboxv1.Sandbox
	if err := r.Client.Get(ctx, req.NamespacedName, &s); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.Classes.Owns(blueprint.RuntimeClass(&s.Spec.PodTemplate)) {
		return ctrl.Result{}, nil
	}
	if !r.Nodes.AllSynced() {
		// just started: a node not reached yet is not a node gone, and a
		// sandbox made before may not be in the view yet.
		return ctrl.Result{RequeueAfter: syncWait}, nil
	}
	if s.DeletionTimestamp != nil {
		return r.finalize(ctx, &s)
	}
	if !controllerutil.ContainsFinalizer(&s, FinalizerSandbox) {
		controllerutil.AddFinalizer(&s, FinalizerSandbox)
		if err := r.Client.Update(ctx, &s); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: conflictRetry}, nil // a stale cache
			}
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	if claimsFirstStatus(&s) {
		// A claim's bind writes this Sandbox's first status in its own
		// one write (MarkReady) right after making it; writing it here
		// too is a second write on the warm-claim path (the loser's a
		// conflict). Past claimStatusWait it is written here: the
		// controller that made it died before its status write.
		if age := r.now().Sub(s.CreationTimestamp.Time); age < claimStatusWait {
			return ctrl.Result{RequeueAfter: claimStatusWait - age}, nil
		}
	}
	before := s.Status.DeepCopy()
	res, err := r.reconcile(ctx, &s)
	if !equality.Semantic.DeepEqual(before, &s.Status) {
		if uerr := r.Client.Status().Update(ctx, &s); uerr != nil {
			if apierrors.IsConflict(uerr) {
				return ctrl.Result{RequeueAfter: conflictRetry}, nil
			}
			return ctrl.Result{}, client.IgnoreNotFound(uerr)
		}
	}
	return res, err
}

// reconcile works out s's state, changing s.Status (written by the caller).
func (r *SandboxReconciler) reconcile(ctx context.Context, s *sandboxv1.Sandbox) (ctrl.Result, error) {
	if isTrue(s, sandboxv1.SandboxConditionFinished) || markedExpired(s) {
		return ctrl.Result{}, nil // terminal
	}
	node := s.Annotations[nodes.AnnotationNode]
	id := s.Annotations[nodes.AnnotationSandboxID]
	if _, expired := blueprint.TTL(s.Spec.ShutdownTime, r.now()); expired {
		return r.expire(ctx, s, node, id)
	}
	var res ctrl.Result
	if s.Spec.ShutdownTime != nil {
		res.RequeueAfter = max(s.Spec.ShutdownTime.Sub(r.now()), time.Second)
	}
	if node == "" || id == "" {
		err := r.place(ctx, s)
		if c := meta.FindStatusCondition(s.Status.Conditions, string(sandboxv1.SandboxConditionReady)); c != nil && c.Reason == ReasonGrantSecret {
			res.RequeueAfter = grantRetry
		}
		return res, err
	}
	if snap, ok := r.Nodes.Node(node); ok && snap.State == nodes.StatePending {
		// not reached yet: no news of its sandboxes
		return ctrl.Result{RequeueAfter: syncWait}, nil
	}
	return res, r.keep(ctx, s, node, id)
}

// place chooses a node for s and makes its daemon sandbox there.
func (r *SandboxReconciler) place(ctx context.Context, s *sandboxv1.Sandbox) error {
	bp, err := blueprint.ForSandbox(s)
	var u *blueprint.Unsupported
	if errors.As(err, &u) {
		setCond(s, sandboxv1.SandboxConditionReady, false, ReasonUnsupported, u.Error())
		return nil
	}
	if err != nil {
		return err
	}
	ext := ExternalID(s)
	if node, d, ok := r.Nodes.Locate(ext); ok {
		// made before, its annotations lost (a failed write, a restart).
		return r.annotate(ctx, s, node, d.ID)
	}
	// A node may refuse for capacity the tracker has not heard of yet:
	// the next node is tried.
	var tried []string
	for {
		resv, err := r.Nodes.Place(nodes.Request{
			Key: ext, RuntimeClass: bp.RuntimeClass, CPUs: bp.CPUs(), MemoryBytes: bp.MemoryBytes(), Waiter: s, Exclude: tried,
		})
		var un *nodes.UnschedulableError
		if errors.As(err, &un) {
			unschedulable(s, un.Message)
			return nil
		}
		if err != nil {
			return err
		}
		sb, err := r.create(ctx, s, bp, resv.Node, ext)
		if err == nil {
			r.Log.V(1).Info("placed", "sandbox", client.ObjectKeyFromObject(s), "node", resv.Node, "id", sb.ID)
			// on a failed write the daemon sandbox stays: the retry finds
			// it (Locate, or the same node's idempotent create).
			return r.annotate(ctx, s, resv.Node, sb.ID)
		}
		resv.Release()
		var ge *GrantError
		if errors.As(err, &ge) {
			setCond(s, sandboxv1.SandboxConditionReady, false, ReasonGrantSecret, ge.Message)
			return nil
		}
		var ae *api.Error
		if !errors.As(err, &ae) {
			return err
		}
		switch ae.Code {
		case api.CodeQuotaExceeded:
			tried = append(tried, resv.Node)
			continue
		case api.CodeInvalidArgument, api.CodePermissionDenied, api.CodeFailedPrecondition, api.CodeNotFound, api.CodeSecretDetected:
			setCond(s, sandboxv1.SandboxConditionReady, false, ReasonCreateFailed, fmt.Sprintf("airlock node %s: %s", resv.Node, ae.Message))
			return nil
		}
		return err
	}
}

// create makes s's daemon sandbox on node.
func (r *SandboxReconciler) create(ctx context.Context, s *sandboxv1.Sandbox, bp *blueprint.Blueprint, node, ext string) (*api.Sandbox, error) {
	if err := r.Grants.Push(ctx, node, s.Namespace, bp.Secrets); err != nil {
		return nil, err
	}
	cl, err := r.Nodes.Tenant(ctx, node, s.Namespace)
	if err != nil {
		return nil, err
	}
	ttl, _ := blueprint.TTL(s.Spec.ShutdownTime, r.now())
	return cl.CreateSandbox(ctx, bp.Body(ext, map[string]string{
		nodes.MetaNamespace: s.Namespace, nodes.MetaName: s.Name, nodes.MetaUID: string(s.UID),
	}, ttl))
}

// annotate records s's node and daemon sandbox id, and marks it Ready.
func (r *SandboxReconciler) annotate(ctx context.Context, s *sandboxv1.Sandbox, node, id string) error {
	patch := client.MergeFrom(s.DeepCopy())
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[nodes.AnnotationNode] = node
	s.Annotations[nodes.AnnotationSandboxID] = id
	status := s.Status.DeepCopy()
	if err := r.Client.Patch(ctx, s, patch); err != nil {
		return err
	}
	s.Status = *status
	MarkReady(s, node)
	return nil
}

func unschedulable(s *sandboxv1.Sandbox, msg string) {
	setCond(s, sandboxv1.SandboxConditionPodScheduled, false, ReasonUnschedulable, msg)
	setCond(s, sandboxv1.SandboxConditionReady, false, ReasonUnschedulable, msg)
}

// keep follows a placed Sandbox's node and daemon sandbox.
func (r *SandboxReconciler) keep(ctx context.Context, s *sandboxv1.Sandbox, node, id string) error {
	snap, ok := r.Nodes.Node(node)
	if !ok || snap.State == nodes.StateLost {
		msg := "airlock node " + node + " was lost"
		if !ok {
			msg = "airlock node " + node + " is gone"
		}
		setCond(s, sandboxv1.SandboxConditionReady, false, nodes.ReasonNodeLost, msg)
		setCond(s, sandboxv1.SandboxConditionFinished, true, nodes.ReasonNodeLost, msg)
		return nil
	}
	switch snap.State {
	case nodes.StateReady:
	default:
		setCond(s, sandboxv1.SandboxConditionReady, false, nodes.ReasonNodeUnreachable, "airlock node "+node+": "+snap.Message)
		return nil
	}
	d, found := r.Nodes.DaemonSandbox(node, ExternalID(s))
	if !found || d.ID != id {
		// not in the node's view (made before the view, or the view is
		// resyncing): ask the node.
		cl, err := r.Nodes.Tenant(ctx, node, s.Namespace)
		if err != nil {
			return err
		}
		sb, err := cl.Sandbox(ctx, id)
		switch {
		case isCode(err, api.CodeNotFound):
			d = nodes.DaemonSandbox{ID: id, Ended: true, EndReason: "gone from the node"}
		case err != nil:
			return err
		default:
			d = nodes.DaemonSandbox{ID: sb.ID, Ended: sb.Ended != nil, EndReason: sb.EndReason}
		}
	}
	if d.Ended {
		msg := "the sandbox ended on airlock node " + node
		if d.EndReason != "" {
			msg += ": " + d.EndReason
		}
		setCond(s, sandboxv1.SandboxConditionReady, false, ReasonSandboxEnded, msg)
		setCond(s, sandboxv1.SandboxConditionFinished, true, ReasonSandboxEnded, msg)
		return nil
	}
	ready := meta.FindStatusCondition(s.Status.Conditions, string(sandboxv1.SandboxConditionReady))
	if ready != nil && ready.Status == metav1.ConditionTrue && ready.ObservedGeneration != s.Generation {
		// the spec changed since: a new shutdown time moves the daemon
		// sandbox's expiry (the rest of a placed blueprint stays).
		cl, err := r.Nodes.Tenant(ctx, node, s.Namespace)
		if err != nil {
			return err
		}
		ttl, _ := blueprint.TTL(s.Spec.ShutdownTime, r.now())
		if _, err := cl.Extend(ctx, id, ttl); err != nil {
			return err
		}
		MarkReady(s, node)
	}
	if !isTrue(s, sandboxv1.SandboxConditionReady) || s.Status.NodeName != node ||
		!isTrue(s, sandboxv1.SandboxConditionPodScheduled) {
		MarkReady(s, node)
	}
	return nil
}

// expire applies s's shutdown policy: Delete deletes it (the finalizer ends
// the daemon sandbox); Retain ends the daemon sandbox and keeps s, Ready=False
// SandboxExpired.
func (r *SandboxReconciler) expire(ctx context.Context, s *sandboxv1.Sandbox, node, id string) (ctrl.Result, error) {
	if s.Spec.ShutdownPolicy != nil && *s.Spec.ShutdownPolicy == sandboxv1.ShutdownPolicyDelete {
		return ctrl.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, s))
	}
	if node != "" && id != "" {
		if done, err := r.destroy(ctx, s, node, id); err != nil || !done {
			return ctrl.Result{RequeueAfter: 2 * time.Second}, err
		}
	}
	conds := s.Status.Conditions
	s.Status = sandboxv1.SandboxStatus{Conditions: conds}
	setCond(s, sandboxv1.SandboxConditionReady, false, sandboxv1.SandboxReasonExpired, "Sandbox has expired")
	meta.RemoveStatusCondition(&s.Status.Conditions, string(sandboxv1.SandboxConditionPodScheduled))
	return ctrl.Result{}, nil
}

func markedExpired(s *sandboxv1.Sandbox) bool {
	c := meta.FindStatusCondition(s.Status.Conditions, string(sandboxv1.SandboxConditionReady))
	return c != nil && c.Reason == sandboxv1.SandboxReasonExpired
}

// destroy ends s's daemon sandbox. done is false while its node is
// unreachable (not yet lost); a lost or removed node counts as done: fencing
// ends the sandbox when the node returns.
func (r *SandboxReconciler) destroy(ctx context.Context, s *sandboxv1.Sandbox, node, id string) (done bool, err error) {
	snap, ok := r.Nodes.Node(node)
	if !ok || snap.State == nodes.StateLost || nodes.GaveUp(s) {
		return true, nil
	}
	if snap.State != nodes.StateReady {
		return false, nil
	}
	cl, err := r.Nodes.Tenant(ctx, node, s.Namespace)
	if err != nil {
		return false, err
	}
	if err := cl.Destroy(ctx, id); err != nil && !isCode(err, api.CodeNotFound) {
		return false, err
	}
	return true, nil
}

// finalize ends a deleted Sandbox's daemon sandbox, then lets it go.
func (r *SandboxReconciler) finalize(ctx context.Context, s *sandboxv1.Sandbox) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(s, FinalizerSandbox) {
		return ctrl.Result{}, nil
	}
	node := s.Annotations[nodes.AnnotationNode]
	id := s.Annotations[nodes.AnnotationSandboxID]
	if node != "" && id != "" {
		done, err := r.destroy(ctx, s, node, id)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !done {
			// the node is unreachable: wait for it, or for its loss.
			return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
		}
	}
	// Unplaced, or placed but not annotated yet: a daemon sandbox made for
	// it is an orphan the node sweep ends.
	controllerutil.RemoveFinalizer(s, FinalizerSandbox)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Update(ctx, s))
}

func isCode(err error, code api.Code) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == code
}
