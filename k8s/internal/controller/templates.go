package controller

import (
	"context"
	"sync"

	"github.com/go-logr/logr"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// templateCache keeps each template's blueprint for its resourceVersion,
// so that a claim costs no mapping and hashing of its template.
type templateCache struct {
	mu sync.Mutex
	m  map[types.UID]compiled
}

type compiled struct {
	version string
	bp      *blueprint.Blueprint
	err     error
}

// get returns tmpl's blueprint (blueprint.ForTemplate).
func (c *templateCache) get(tmpl *extv1.SandboxTemplate) (*blueprint.Blueprint, error) {
	c.mu.Lock()
	e, ok := c.m[tmpl.UID]
	c.mu.Unlock()
	if ok && e.version == tmpl.ResourceVersion {
		return e.bp, e.err
	}
	bp, err := blueprint.ForTemplate(tmpl)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[types.UID]compiled{}
	}
	c.m[tmpl.UID] = compiled{tmpl.ResourceVersion, bp, err}
	c.mu.Unlock()
	return bp, err
}

// request is a blueprint's placement request of one sandbox.
func request(bp *blueprint.Blueprint) api.Resources {
	return api.Resources{CPUs: bp.CPUs(), MemoryBytes: bp.MemoryBytes(), Sandboxes: 1}
}

// indexRefs makes the field indexes the warm pool and claim reconcilers
// list by: claims by spec.warmPoolRef.name, warm pools by
// spec.sandboxTemplateRef.name.
func indexRefs(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &extv1.SandboxClaim{}, extv1.WarmPoolRefField, func(o client.Object) []string {
		return []string{o.(*extv1.SandboxClaim).Spec.WarmPoolRef.Name}
	}); err != nil {
		return err
	}
	return mgr.GetFieldIndexer().IndexField(ctx, &extv1.SandboxWarmPool{}, extv1.TemplateRefField, func(o client.Object) []string {
		return []string{o.(*extv1.SandboxWarmPool).Spec.TemplateRef.Name}
	})
}

// NodeView is what the warm pool and claim reconcilers use of the node
// tracker: *nodes.Tracker through Tracker, or a test's fake.
type NodeView interface {
	Nodes() []nodes.Snapshot
	ReadyNodes(class string) []nodes.Snapshot
	DaemonSandbox(node, externalID string) (nodes.DaemonSandbox, bool)
	Tenant(ctx context.Context, node, ns string) (*airlock.Client, error)
	// Place chooses a node and reserves the request there; release
	// gives the reservation up.
	Place(req nodes.Request) (node string, release func(), err error)
	PoolEvents() <-chan event.GenericEvent
	ClaimEvents() <-chan event.GenericEvent
	// AllSynced says every node has been reached once since the
	// controller started: until then a claim's earlier bind, or a pool's
	// sandboxes, may be on a node not in the view yet.
	AllSynced() bool
}

// Tracker is a *nodes.Tracker as a NodeView.
type Tracker struct{ *nodes.Tracker }

// Place is nodes.Tracker.Place.
func (t Tracker) Place(req nodes.Request) (string, func(), error) {
	res, err := t.Tracker.Place(req)
	if err != nil {
		return "", nil, err
	}
	return res.Node, res.Release, nil
}

// PoolsAndClaims configures the warm pool and claim reconcilers.
type PoolsAndClaims struct {
	Nodes *nodes.Tracker
	// Classes are the runtime classes the controller serves.
	Classes Classes
	// Grants pushes grants' Secrets before a claim's cold create.
	Grants *GrantSecrets
	// PoolWorkers and ClaimWorkers are each reconciler's workers.
	PoolWorkers, ClaimWorkers int
	Log                       logr.Logger
}

// SetupPoolsAndClaims adds the SandboxWarmPool and SandboxClaim
// reconcilers to mgr.
func SetupPoolsAndClaims(ctx context.Context, mgr ctrl.Manager, c PoolsAndClaims) error {
	if err := indexRefs(ctx, mgr); err != nil {
		return err
	}
	view := Tracker{c.Nodes}
	wp := &WarmPoolReconciler{
		Client: mgr.GetClient(), Nodes: view, Classes: c.Classes,
		Events: mgr.GetEventRecorder("airlock-warmpool"), Log: c.Log.WithName("warmpool"),
	}
	if err := wp.SetupWithManager(mgr, c.PoolWorkers); err != nil {
		return err
	}
	cl := &ClaimReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Nodes: view, Classes: c.Classes,
		Grants: c.Grants, Log: c.Log.WithName("claim"),
	}
	return cl.SetupWithManager(mgr, c.ClaimWorkers)
}
