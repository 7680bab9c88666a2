package nodes

import (
	"context"
	"crypto/rand"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-sandbox/airlock/api"
	airlock "github.com/airlock-sandbox/airlock/client"
)

// MasterKey is the key of the master Secret's data that holds the master.
const MasterKey = "master"

// Master returns the tenant key master, making its Secret (32 random bytes)
// if there is none.
func (t *Tracker) Master(ctx context.Context) ([]byte, error) {
	t.masterOnce.Lock()
	defer t.masterOnce.Unlock()
	if t.master != nil {
		return t.master, nil
	}
	ref := t.cfg.MasterSecret
	for range 3 {
		var sec corev1.Secret
		err := t.cfg.Reader.Get(ctx, ref, &sec)
		if err == nil {
			m := sec.Data[MasterKey]
			if len(m) < 16 {
				return nil, fmt.Errorf("secret %s: key %q holds %d bytes, want at least 16", ref, MasterKey, len(m))
			}
			t.master = m
			return m, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("secret %s: %w", ref, err)
		}
		m := make([]byte, 32)
		if _, err := rand.Read(m); err != nil {
			return nil, err
		}
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name},
			Data:       map[string][]byte{MasterKey: m},
		}
		err = t.cfg.Client.Create(ctx, &sec)
		if err == nil {
			t.log.Info("made the tenant key master", "secret", ref.String())
			t.master = m
			return m, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("making secret %s: %w", ref, err)
		}
	}
	return nil, fmt.Errorf("secret %s: made and gone", ref)
}

// Tenant returns a client of namespace ns's tenant on node, with the tenant
// key TenantKey(master, node, ns). On its first use on the node (and after
// the daemon's boot id changes) the tenant is made there, or its key set if
// it exists.
func (t *Tracker) Tenant(ctx context.Context, nodeName, ns string) (*airlock.Client, error) {
	t.mu.Lock()
	n := t.nodes[nodeName]
	if n == nil || n.admin == nil {
		t.mu.Unlock()
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "airlock node " + nodeName + " is not connected"}
	}
	admin, spec := n.admin, n.spec
	e := n.tenants[ns]
	if e == nil {
		e = &tenant{}
		n.tenants[ns] = e
	}
	t.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cl != nil {
		return e.cl, nil
	}
	master, err := t.Master(ctx)
	if err != nil {
		return nil, err
	}
	key := TenantKey(master, nodeName, ns)
	sum := KeySHA256(key)
	_, err = admin.CreateTenant(ctx, &api.CreateTenant{Name: ns, KeySHA256: sum})
	if isCode(err, api.CodeAlreadyExists) {
		_, err = admin.UpdateTenant(ctx, ns, &api.UpdateTenant{KeySHA256: sum})
	}
	if err != nil {
		return nil, fmt.Errorf("tenant %s on node %s: %w", ns, nodeName, err)
	}
	cl, err := newClient(&spec, key)
	if err != nil {
		return nil, err
	}
	e.cl = cl
	return cl, nil
}
