package nodes

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"
)

// LabelClaimUID is the label on a claim's Sandbox naming the claim's UID.
const LabelClaimUID = extv1.SandboxIDLabel

// sweep ends node name's sandboxes (list) that the cluster gave up on: one
// whose Sandbox is NodeLost or placed on another node, and one whose
// external id is no live Sandbox's or claim's UID in this sweep and the
// last (in this one alone when strict: the node returns from Lost).
// Sandboxes without an external id are never touched.
func (t *Tracker) sweep(ctx context.Context, name string, cl *airlock.Client, list []*api.Sandbox, strict bool) error {
	var sbs sandboxv1.SandboxList
	if err := t.cfg.Client.List(ctx, &sbs); err != nil {
		return fmt.Errorf("listing Sandboxes: %w", err)
	}
	var claims extv1.SandboxClaimList
	if err := t.cfg.Client.List(ctx, &claims); err != nil {
		return fmt.Errorf("listing SandboxClaims: %w", err)
	}
	byUID := map[types.UID]*sandboxv1.Sandbox{}
	byName := map[types.NamespacedName]*sandboxv1.Sandbox{}
	for i := range sbs.Items {
		s := &sbs.Items[i]
		byUID[s.UID] = s
		byName[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	claimUID := map[types.UID]*extv1.SandboxClaim{}
	for i := range claims.Items {
		claimUID[claims.Items[i].UID] = &claims.Items[i]
	}
	t.mu.Lock()
	n := t.nodes[name]
	if n == nil {
		t.mu.Unlock()
		return nil
	}
	last := n.candidates
	t.mu.Unlock()

	next := map[string]bool{}
	var firstErr error
	for _, d := range list {
		ext := d.ExternalID
		if ext == "" || d.Ended != nil {
			continue
		}
		why := ""
		// an object of another namespace than the sandbox's tenant is
		// not its own
		s := byUID[types.UID(ext)]
		if s != nil && s.Namespace != d.Tenant {
			s = nil
		}
		if c := claimUID[types.UID(ext)]; s == nil && c != nil && c.Namespace == d.Tenant {
			s = byName[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}]
			if s != nil && s.Labels[LabelClaimUID] != string(c.UID) {
				s = nil
			}
			if s == nil {
				continue // the claim is being bound
			}
		}
		switch {
		case s != nil && GaveUp(s):
			why = "its Sandbox's node was lost"
		case s != nil && s.Annotations[AnnotationNode] != "" && s.Annotations[AnnotationNode] != name:
			why = "its Sandbox is placed on " + s.Annotations[AnnotationNode]
		case s != nil:
		case strict || last[ext]:
			why = "no Sandbox or SandboxClaim has its external id"
		default:
			next[ext] = true
		}
		if why == "" {
			continue
		}
		t.log.Info("ending a sandbox the cluster gave up on", "node", name, "sandbox", d.ID, "tenant", d.Tenant, "external_id", ext, "why", why)
		if err := cl.Destroy(ctx, d.ID); err != nil && !isCode(err, api.CodeNotFound) && firstErr == nil {
			firstErr = fmt.Errorf("destroying %s: %w", d.ID, err)
		}
	}
	t.mu.Lock()
	if n := t.nodes[name]; n != nil {
		n.candidates = next
	}
	t.mu.Unlock()
	return firstErr
}

// GaveUp reports whether the cluster gave s up with its node: Finished
// with reason NodeLost.
func GaveUp(s *sandboxv1.Sandbox) bool {
	c := meta.FindStatusCondition(s.Status.Conditions, string(sandboxv1.SandboxConditionFinished))
	return c != nil && c.Status == "True" && c.Reason == ReasonNodeLost
}

// sweepAll sweeps every Ready node.
func (t *Tracker) sweepAll(ctx context.Context) {
	type target struct {
		name string
		cl   *airlock.Client
	}
	var ts []target
	t.mu.Lock()
	for _, n := range t.nodes {
		if n.state == StateReady && n.admin != nil {
			ts = append(ts, target{n.name, n.admin})
		}
	}
	t.mu.Unlock()
	for _, tg := range ts {
		list, err := tg.cl.ListSandboxes(ctx, api.ListSandboxes{All: true})
		if err == nil {
			err = t.sweep(ctx, tg.name, tg.cl, list, false)
		}
		if err != nil && ctx.Err() == nil {
			t.log.Error(err, "orphan sweep", "node", tg.name)
		}
	}
}
