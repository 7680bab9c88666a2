package nodes

import (
	"context"
	"sort"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/api"
	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
)

// statusEvery is the least time between two status writes of a node that
// did not change readiness.
const statusEvery = 10 * time.Second

// writeStatuses writes the status of the nodes due.
func (t *Tracker) writeStatuses(ctx context.Context) {
	now := time.Now()
	type due struct {
		name string
		st   v1alpha1.AirlockNodeStatus
		cond metav1.Condition
	}
	var todo []due
	t.mu.Lock()
	for _, n := range t.nodes {
		if !n.statusNow && !(n.statusDirty && now.Sub(n.lastStatusWrite) >= statusEvery) {
			continue
		}
		n.statusNow, n.statusDirty, n.lastStatusWrite = false, false, now
		todo = append(todo, due{n.name, n.status(now), n.condition()})
	}
	t.mu.Unlock()
	for _, d := range todo {
		if err := t.patchStatus(ctx, d.name, d.st, d.cond); err != nil && ctx.Err() == nil {
			t.log.Error(err, "writing airlock node status", "node", d.name)
			t.mu.Lock()
			if n := t.nodes[d.name]; n != nil {
				n.statusDirty = true
			}
			t.mu.Unlock()
		}
	}
}

func (t *Tracker) patchStatus(ctx context.Context, name string, st v1alpha1.AirlockNodeStatus, cond metav1.Condition) error {
	var an v1alpha1.AirlockNode
	if err := t.cfg.Client.Get(ctx, types.NamespacedName{Name: name}, &an); err != nil {
		return client.IgnoreNotFound(err)
	}
	base := an.DeepCopy()
	st.Conditions = an.Status.Conditions
	an.Status = st
	meta.SetStatusCondition(&an.Status.Conditions, cond)
	return t.cfg.Client.Status().Patch(ctx, &an, client.MergeFrom(base))
}

func (n *node) condition() metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Message: n.message}
	switch n.state {
	case StateReady:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, v1alpha1.ReasonDaemonReady, "event stream up"
	case StateLost:
		c.Reason = v1alpha1.ReasonNodeLost
	case StateFencing:
		c.Reason = v1alpha1.ReasonFencing
	default:
		c.Reason = v1alpha1.ReasonDaemonUnreachable
	}
	return c
}

func (n *node) status(now time.Time) v1alpha1.AirlockNodeStatus {
	st := v1alpha1.AirlockNodeStatus{
		Capacity:  resources(n.capacity),
		Allocated: resources(n.allocated),
		Daemon:    v1alpha1.DaemonInfo{Version: n.version, BootID: n.bootID},
	}
	for _, p := range n.pools {
		st.Pools = append(st.Pools, v1alpha1.NodePool{Tenant: p.Tenant, Name: p.Name, Size: p.Size, Ready: p.Ready, Filling: p.Filling})
	}
	sort.Slice(st.Pools, func(i, j int) bool {
		a, b := st.Pools[i], st.Pools[j]
		return a.Tenant < b.Tenant || a.Tenant == b.Tenant && a.Name < b.Name
	})
	if n.auditHead != nil {
		st.AuditHead = &v1alpha1.AuditHead{Seq: int64(n.auditHead.Seq), Hash: n.auditHead.Hash, ObservedAt: metav1.NewTime(now)}
	}
	if !n.lastEvent.IsZero() {
		ts := metav1.NewTime(n.lastEvent)
		st.LastHeartbeatTime = &ts
	}
	return st
}

func resources(r api.Resources) v1alpha1.Resources {
	return v1alpha1.Resources{CPUs: strconv.FormatFloat(r.CPUs, 'f', -1, 64), MemoryBytes: r.MemoryBytes, Sandboxes: r.Sandboxes}
}
