package nodes

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
)

const (
	kindSandbox = "Sandbox"
	kindClaim   = "SandboxClaim"
	kindOther   = ""
)

type affectedObj struct {
	kind      string
	namespace string
	name      string
}

// affectedBy names the objects a daemon sandbox's change concerns, from
// its metadata: the Sandbox it was made for, or the claim it was bound for
// and that claim's Sandbox (of the claim's name).
func affectedBy(sb *api.Sandbox) []affectedObj {
	ns := sb.Metadata[MetaNamespace]
	if ns == "" {
		return nil
	}
	var out []affectedObj
	if name := sb.Metadata[MetaName]; name != "" {
		out = append(out, affectedObj{kindSandbox, ns, name})
	}
	if claim := sb.Metadata[MetaClaim]; claim != "" {
		out = append(out, affectedObj{kindSandbox, ns, claim}, affectedObj{kindClaim, ns, claim})
	}
	return out
}

func (t *Tracker) send(a affectedObj) {
	meta := metav1.ObjectMeta{Namespace: a.namespace, Name: a.name}
	switch a.kind {
	case kindSandbox:
		t.sandboxes.send(&sandboxv1.Sandbox{ObjectMeta: meta})
	case kindClaim:
		t.claims.send(&extv1.SandboxClaim{ObjectMeta: meta})
	}
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *sandboxv1.Sandbox:
		return kindSandbox
	case *extv1.SandboxClaim:
		return kindClaim
	}
	return kindOther
}

// poolsChanged is the PoolEvents object for namespace ns ("" for all).
func poolsChanged(ns string) client.Object {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: ns}}
}

// wakeLocked sends every waiter again (capacity freed or a node became
// schedulable); t.mu held.
func (t *Tracker) wakeLocked() {
	for k, obj := range t.waiters {
		delete(t.waiters, k)
		switch k.kind {
		case kindSandbox:
			t.sandboxes.send(obj)
		case kindClaim:
			t.claims.send(obj)
		default:
			t.pools.send(obj)
		}
	}
}

// nodeChanged sends every Sandbox placed on node name, and a node-level
// pool change.
func (t *Tracker) nodeChanged(name string) {
	t.pools.send(poolsChanged(""))
	ctx := t.runContext()
	if ctx == nil {
		return
	}
	var list sandboxv1.SandboxList
	if err := t.cfg.Client.List(ctx, &list); err != nil {
		t.log.Error(err, "listing sandboxes for a node change", "node", name)
		return
	}
	for i := range list.Items {
		s := &list.Items[i]
		if s.Annotations[AnnotationNode] == name {
			t.sandboxes.send(&sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name}})
		}
	}
}

func (t *Tracker) runContext() context.Context {
	t.ctxMu.Lock()
	defer t.ctxMu.Unlock()
	return t.ctx
}

func (t *Tracker) kickStatus() {
	select {
	case t.statusKick <- struct{}{}:
	default:
	}
}
