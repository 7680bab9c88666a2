package controller

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// ReasonGrantSecret is the Ready=False reason of a Sandbox or claim whose
// grants name a Secret key the controller may not use (missing, not
// labelled airlock.dev/grant=true, without that key, or a value a daemon
// cannot put in a header). It is tried again every grantRetry.
const ReasonGrantSecret = "GrantSecretUnavailable"

// maxSecretBytes is the daemon's limit on a secret's value (docs/api.md).
const maxSecretBytes = 16 << 10

// grantRetry is when a Sandbox or claim waiting for its grants' Secrets is
// tried again.
const grantRetry = 30 * time.Second

// TenantClients gives a daemon client of namespace ns's tenant on a node
// (nodes.Tracker.Tenant).
type TenantClients interface {
	Tenant(ctx context.Context, node, ns string) (*airlock.Client, error)
}

// GrantError says why a blueprint's grants cannot be served. Its message
// names Secrets and keys, never a value.
type GrantError struct{ Message string }

func (e *GrantError) Error() string { return e.Message }

// GrantSecrets copies the Kubernetes Secrets that grants name (labelled
// blueprint.LabelGrant "true") to the nodes, as daemon secrets of the
// namespace's tenant: Push before a create that uses them, and again (or
// removed) whenever a Secret changes (Reconcile, a watch on labelled
// Secrets). Values are held only while being sent; what is remembered of
// a copy is its value's SHA-256, to skip a push of an unchanged value.
type GrantSecrets struct {
	// Reader reads Secrets: the manager's cache, which holds only the
	// labelled ones.
	Reader  client.Reader
	Tenants TenantClients
	// Nodes lists the nodes (nodes.Tracker). When set, the first time
	// this process sees a Secret, the Ready nodes are asked which of its
	// keys they hold (the copies a controller before a restart pushed), so
	// that a value changed meanwhile reaches them too.
	Nodes interface{ Nodes() []nodes.Snapshot }
	Log   logr.Logger

	mu     sync.Mutex
	copies map[copyKey]*secretCopy
	seen   map[types.NamespacedName]bool // Secrets discovered
}

// copyKey is one daemon secret on one node.
type copyKey struct{ node, ns, daemon string }

// secretCopy is what a node holds of a Secret key; mu orders its pushes,
// so that a push of an older value never lands after a newer one.
type secretCopy struct {
	mu   sync.Mutex
	ref  blueprint.SecretRef
	cl   *airlock.Client // the tenant client it was pushed with
	sum  [32]byte        // SHA-256 of the value pushed
	held bool            // the node holds it
}

func (g *GrantSecrets) entry(k copyKey, ref blueprint.SecretRef) *secretCopy {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.copies == nil {
		g.copies = map[copyKey]*secretCopy{}
	}
	c := g.copies[k]
	if c == nil {
		c = &secretCopy{ref: ref}
		g.copies[k] = c
	}
	return c
}

// Push gives node the current value of every Secret key refs name, as
// tenant ns's daemon secrets. A key the controller may not use is a
// *GrantError.
func (g *GrantSecrets) Push(ctx context.Context, node, ns string, refs []blueprint.SecretRef) error {
	if len(refs) == 0 {
		return nil
	}
	if g == nil {
		return &GrantError{"grants of Kubernetes Secrets are not served by this controller"}
	}
	for _, ref := range refs {
		// the hosts this create's grants name (a copy on the node is
		// shared by the tenant's sandboxes there)
		if _, err := g.value(ctx, ns, ref, true); err != nil {
			return err
		}
		c := g.entry(copyKey{node, ns, ref.Daemon}, ref)
		c.mu.Lock()
		err := g.sync(ctx, node, ns, c, true)
		c.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// value reads ref's value in namespace ns from the cache; checkHosts
// refuses it when the Secret's AnnotationGrantHosts leaves out one of
// ref.Hosts.
func (g *GrantSecrets) value(ctx context.Context, ns string, ref blueprint.SecretRef, checkHosts bool) (string, error) {
	var sec corev1.Secret
	err := g.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &sec)
	if apierrors.IsNotFound(err) || err == nil && sec.Labels[blueprint.LabelGrant] != "true" {
		return "", &GrantError{fmt.Sprintf("Secret %s/%s: none labelled %s=true (a grant may name only Secrets so labelled)", ns, ref.Name, blueprint.LabelGrant)}
	}
	if err != nil {
		return "", err
	}
	if list, ok := sec.Annotations[blueprint.AnnotationGrantHosts]; ok && checkHosts {
		allowed := map[string]bool{}
		for _, h := range strings.Split(list, ",") {
			allowed[strings.TrimSpace(h)] = true
		}
		for _, h := range ref.Hosts {
			if !allowed[h] {
				return "", &GrantError{fmt.Sprintf("Secret %s/%s may be granted to %s only (%s), not to %q", ns, ref.Name, list, blueprint.AnnotationGrantHosts, h)}
			}
		}
	}
	v, ok := sec.Data[ref.Key]
	if !ok {
		return "", &GrantError{fmt.Sprintf("Secret %s/%s has no key %q", ns, ref.Name, ref.Key)}
	}
	// a value written from a file usually ends with a line break
	s := strings.TrimSuffix(strings.TrimSuffix(string(v), "\n"), "\r")
	switch {
	case s == "":
		return "", &GrantError{fmt.Sprintf("Secret %s/%s key %q is empty", ns, ref.Name, ref.Key)}
	case len(s) > maxSecretBytes:
		return "", &GrantError{fmt.Sprintf("Secret %s/%s key %q holds %d bytes: a daemon secret is at most %d", ns, ref.Name, ref.Key, len(s), maxSecretBytes)}
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "", &GrantError{fmt.Sprintf("Secret %s/%s key %q holds a control character: a grant's value goes into a request header", ns, ref.Name, ref.Key)}
	}
	return s, nil
}

// sync brings node's copy c to the Secret's value: pushed when it differs
// from what was pushed (or the tenant client changed: the daemon may have
// lost it), removed from the node when the Secret, its label or its key is
// gone. forCreate makes a missing Secret a *GrantError instead. c.mu is
// held.
func (g *GrantSecrets) sync(ctx context.Context, node, ns string, c *secretCopy, forCreate bool) error {
	v, err := g.value(ctx, ns, c.ref, false)
	var ge *GrantError
	if errors.As(err, &ge) && !forCreate {
		if !c.held {
			return nil
		}
		cl, err := g.Tenants.Tenant(ctx, node, ns)
		if err != nil {
			return err
		}
		if err := cl.RemoveSecret(ctx, c.ref.Daemon); err != nil && !isCode(err, api.CodeNotFound) {
			return fmt.Errorf("node %s: removing daemon secret %s of Secret %s/%s: %w", node, c.ref.Daemon, ns, c.ref.Name, err)
		}
		c.held, c.cl = false, nil
		g.Log.Info("removed a grant secret from a node", "node", node, "secret", ns+"/"+c.ref.Name, "key", c.ref.Key, "why", ge.Message)
		return nil
	}
	if err != nil {
		return err
	}
	cl, err := g.Tenants.Tenant(ctx, node, ns)
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(v))
	if c.held && c.cl == cl && c.sum == sum {
		return nil
	}
	_, err = cl.RotateSecret(ctx, c.ref.Daemon, v)
	if isCode(err, api.CodeNotFound) {
		_, err = cl.AddSecret(ctx, c.ref.Daemon, v)
		if isCode(err, api.CodeAlreadyExists) { // added meanwhile
			_, err = cl.RotateSecret(ctx, c.ref.Daemon, v)
		}
	}
	if err != nil {
		// the node may still hold an older value (held stays, so that
		// the Secret's removal removes it): pushed again next time.
		c.cl = nil
		return fmt.Errorf("node %s: pushing Secret %s/%s key %q: %w", node, ns, c.ref.Name, c.ref.Key, err)
	}
	c.held, c.cl, c.sum = true, cl, sum
	g.Log.V(1).Info("pushed a grant secret", "node", node, "secret", ns+"/"+c.ref.Name, "key", c.ref.Key, "daemonSecret", c.ref.Daemon)
	return nil
}

// Reconcile pushes a changed labelled Secret to every node holding a copy
// of one of its keys, and removes the copies of a Secret that is gone, lost
// its label or the key.
func (g *GrantSecrets) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := g.discover(ctx, req.NamespacedName); err != nil {
		return ctrl.Result{}, err
	}
	g.mu.Lock()
	var keys []copyKey
	var cs []*secretCopy
	for k, c := range g.copies {
		if k.ns == req.Namespace && c.ref.Name == req.Name {
			keys, cs = append(keys, k), append(cs, c)
		}
	}
	g.mu.Unlock()
	var errs []error
	for i, c := range cs {
		c.mu.Lock()
		if err := g.sync(ctx, keys[i].node, keys[i].ns, c, false); err != nil {
			errs = append(errs, err)
		}
		c.mu.Unlock()
	}
	return ctrl.Result{}, errors.Join(errs...)
}

// discover, the first time Secret key is seen here, records the copies of
// its keys the Ready nodes hold, to be pushed again by Reconcile.
func (g *GrantSecrets) discover(ctx context.Context, key types.NamespacedName) error {
	if g.Nodes == nil {
		return nil
	}
	g.mu.Lock()
	done := g.seen[key]
	g.mu.Unlock()
	if done {
		return nil
	}
	var sec corev1.Secret
	if err := g.Reader.Get(ctx, key, &sec); err != nil || sec.Labels[blueprint.LabelGrant] != "true" {
		return client.IgnoreNotFound(err) // nothing to push (a copy made before stays: see docs)
	}
	want := map[string]blueprint.SecretRef{}
	for k := range sec.Data {
		d := blueprint.DaemonSecretName(key.Name, k)
		want[d] = blueprint.SecretRef{Name: key.Name, Key: k, Daemon: d}
	}
	for _, n := range g.Nodes.Nodes() {
		if n.State != nodes.StateReady {
			continue
		}
		cl, err := g.Tenants.Tenant(ctx, n.Name, key.Namespace)
		if err != nil {
			return err
		}
		held, err := cl.Secrets(ctx)
		if err != nil {
			return fmt.Errorf("node %s: listing tenant %s's secrets: %w", n.Name, key.Namespace, err)
		}
		for _, s := range held {
			ref, ok := want[s.Name]
			if !ok {
				continue
			}
			c := g.entry(copyKey{n.Name, key.Namespace, s.Name}, ref)
			c.mu.Lock()
			if !c.held {
				c.held, c.cl = true, nil // pushed again: its value is not known here
			}
			c.mu.Unlock()
		}
	}
	g.mu.Lock()
	if g.seen == nil {
		g.seen = map[types.NamespacedName]bool{}
	}
	g.seen[key] = true
	g.mu.Unlock()
	return nil
}

// SecretCache is the manager's cache option for Secrets: only those
// labelled blueprint.LabelGrant "true" are listed, watched and kept, not
// every Secret of the cluster.
func SecretCache() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{blueprint.LabelGrant: "true"})},
	}
}

// SetupWithManager watches Secrets through the manager's cache, which
// must hold only the labelled ones (SecretCache: a Secret that loses its
// label leaves the cache, a delete here).
func (g *GrantSecrets) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("grantsecret").
		For(&corev1.Secret{}).
		Complete(g)
}
