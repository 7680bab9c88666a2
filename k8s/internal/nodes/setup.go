package nodes

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
)

// SetupWithManager adds the tracker to mgr: a controller following
// AirlockNodes, and the tracker's own loop (Start) for event feeds, node
// loss, sweeps and status writes.
func (t *Tracker) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(t); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("airlocknode").
		// status writes (the tracker's own) change no generation
		For(&v1alpha1.AirlockNode{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(t)
}

// NeedLeaderElection: only the leader talks to the nodes.
func (t *Tracker) NeedLeaderElection() bool { return true }

// Start runs the tracker until ctx ends (a manager Runnable).
func (t *Tracker) Start(ctx context.Context) error {
	t.ctxMu.Lock()
	t.ctx = ctx
	t.ctxMu.Unlock()
	for _, f := range []*feed{t.sandboxes, t.claims, t.pools} {
		go f.run(ctx)
	}
	if _, err := t.Master(ctx); err != nil {
		t.log.Error(err, "tenant key master (tried again at first use)")
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	sweep := time.NewTicker(t.cfg.SweepInterval)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.statusKick:
			t.writeStatuses(ctx)
		case <-tick.C:
			t.checkLost()
			t.expireReservations()
			t.writeStatuses(ctx)
		case <-sweep.C:
			go t.sweepAll(ctx)
		}
	}
}
