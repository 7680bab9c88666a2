package e2e

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/k8s/config"
)

// TestManifestsApply: every object of k8s/config (the CRD, namespace,
// RBAC, RuntimeClass, Deployments, DaemonSet) is one this apiserver
// accepts: a server-side apply of each, dry run, validates it against the
// server's schemas (the CRDs' too) and its admission, and persists nothing.
func TestManifestsApply(t *testing.T) {
	crds, err := config.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := config.Objects()
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) == 0 || len(objs) == 0 {
		t.Fatalf("%d CRDs and %d objects in k8s/config", len(crds), len(objs))
	}
	for _, o := range append(crds, objs...) {
		if err := env.c.Patch(context.Background(), o, client.Apply, client.DryRunAll, client.FieldOwner("airlock-e2e"), client.ForceOwnership); err != nil {
			t.Errorf("%s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}
