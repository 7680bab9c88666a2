package e2e

import (
	"context"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
)

// TestClusterUp: the harness itself — the apiserver serves agent-sandbox's
// four kinds and airlock's own, every node's daemon answers, and each is
// registered (airlock-node) as the AirlockNode of its name and endpoint,
// Ready.
func TestClusterUp(t *testing.T) {
	ctx := context.Background()
	want := map[string]bool{
		"sandboxes.agents.x-k8s.io": false, "sandboxtemplates.extensions.agents.x-k8s.io": false,
		"sandboxclaims.extensions.agents.x-k8s.io": false, "sandboxwarmpools.extensions.agents.x-k8s.io": false,
		"airlocknodes.airlock.dev": false,
	}
	crds := &apiextensionsv1.CustomResourceDefinitionList{}
	if err := env.c.List(ctx, crds); err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds.Items {
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				if _, ok := want[crd.Name]; ok {
					want[crd.Name] = true
				}
			}
		}
	}
	for name, ok := range want {
		if !ok {
			t.Errorf("CRD %s is not established", name)
		}
	}
	v, err := env.apiGet("/version")
	if err != nil || !strings.Contains(v, `"gitVersion": "v1.35.4"`) {
		t.Errorf("apiserver version: %v %s", err, v)
	}
	for _, n := range env.nodes {
		if err := n.admin.Health(ctx); err != nil {
			t.Errorf("%s: %v", n.name, err)
		}
		an := &v1alpha1.AirlockNode{}
		if err := env.c.Get(ctx, client.ObjectKey{Name: n.name}, an); err != nil {
			t.Errorf("%s: %v", n.name, err)
			continue
		}
		if an.Spec.Endpoint != n.endpoint() || !conditionIs(an.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue) {
			t.Errorf("AirlockNode %s: endpoint %q, conditions %+v", n.name, an.Spec.Endpoint, an.Status.Conditions)
		}
	}
}
