package config

import (
	"encoding/json"
	"slices"
	"testing"
	"testing/fstest"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
)

// typed decodes every manifest object strictly into its Go type, so a
// misspelt or misplaced field fails here and not in a cluster.
func typed(t *testing.T) []runtime.Object {
	t.Helper()
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var out []runtime.Object
	for _, u := range objs {
		b, err := json.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		o, _, err := dec.Decode(b, nil, nil)
		if err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
		out = append(out, o)
	}
	return out
}

func TestManifestsDecodeStrictly(t *testing.T) {
	objs := typed(t)
	if len(objs) < 10 {
		t.Fatalf("only %d objects", len(objs))
	}
	if ns, ok := objs[0].(*corev1.Namespace); !ok || ns.Name != "airlock-system" {
		t.Fatalf("the first object is %T, want Namespace airlock-system (applied first)", objs[0])
	}
}

func TestCRDsAreAirlocksOwn(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) != 1 || crds[0].GetKind() != "CustomResourceDefinition" || crds[0].GetName() != "airlocknodes.airlock.dev" {
		t.Fatalf("CRDs: %v", crds)
	}
	objs, _ := Objects()
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			t.Errorf("Objects holds CRD %s", o.GetName())
		}
	}
}

func TestDecodeRefusesBrokenDocuments(t *testing.T) {
	for name, text := range map[string]string{
		"no kind":  "apiVersion: v1\nmetadata:\n  name: x\n",
		"no name":  "apiVersion: v1\nkind: ConfigMap\n",
		"bad yaml": "apiVersion: [\n",
	} {
		if _, err := decodeAll(fstest.MapFS{"a.yaml": {Data: []byte(text)}}, "*.yaml"); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	got, err := decodeAll(fstest.MapFS{
		"b.yaml": {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: second\n")},
		"a.yaml": {Data: []byte("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: first\n---\n")},
	}, "*.yaml")
	if err != nil || len(got) != 2 || got[0].GetName() != "first" || got[1].GetName() != "second" {
		t.Fatalf("%v %v", got, err)
	}
}

// rbac is the manifests' grants, for asking what a service account may do.
type rbac struct {
	clusterRoles map[string]*rbacv1.ClusterRole
	roles        map[string]*rbacv1.Role // namespace/name
	crbs         []*rbacv1.ClusterRoleBinding
	rbs          []*rbacv1.RoleBinding
}

func grants(t *testing.T, objs []runtime.Object) *rbac {
	r := &rbac{clusterRoles: map[string]*rbacv1.ClusterRole{}, roles: map[string]*rbacv1.Role{}}
	for _, o := range objs {
		switch o := o.(type) {
		case *rbacv1.ClusterRole:
			r.clusterRoles[o.Name] = o
		case *rbacv1.Role:
			r.roles[o.Namespace+"/"+o.Name] = o
		case *rbacv1.ClusterRoleBinding:
			r.crbs = append(r.crbs, o)
		case *rbacv1.RoleBinding:
			r.rbs = append(r.rbs, o)
		}
	}
	for _, b := range r.crbs {
		if r.clusterRoles[b.RoleRef.Name] == nil || b.RoleRef.Kind != "ClusterRole" {
			t.Errorf("ClusterRoleBinding %s refers to a missing %s %s", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
	}
	for _, b := range r.rbs {
		if (b.RoleRef.Kind == "Role" && r.roles[b.Namespace+"/"+b.RoleRef.Name] == nil) ||
			(b.RoleRef.Kind == "ClusterRole" && r.clusterRoles[b.RoleRef.Name] == nil) {
			t.Errorf("RoleBinding %s/%s refers to a missing %s %s", b.Namespace, b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
	}
	return r
}

func ruleAllows(rules []rbacv1.PolicyRule, group, resource, verb, name string) bool {
	for _, p := range rules {
		if slices.Contains(p.APIGroups, group) && slices.Contains(p.Resources, resource) &&
			slices.Contains(p.Verbs, verb) && (len(p.ResourceNames) == 0 || slices.Contains(p.ResourceNames, name)) {
			return true
		}
	}
	return false
}

// allows says whether service account airlock-system/sa may verb the
// resource in namespace ns ("" for cluster-scoped), named name.
func (r *rbac) allows(sa, ns, group, resource, verb, name string) bool {
	bound := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Namespace == "airlock-system" && s.Name == sa
		})
	}
	for _, b := range r.crbs {
		if bound(b.Subjects) && ruleAllows(r.clusterRoles[b.RoleRef.Name].Rules, group, resource, verb, name) {
			return true
		}
	}
	for _, b := range r.rbs {
		if ns == "" || b.Namespace != ns || !bound(b.Subjects) {
			continue
		}
		var rules []rbacv1.PolicyRule
		if b.RoleRef.Kind == "Role" {
			rules = r.roles[b.Namespace+"/"+b.RoleRef.Name].Rules
		} else {
			rules = r.clusterRoles[b.RoleRef.Name].Rules
		}
		if ruleAllows(rules, group, resource, verb, name) {
			return true
		}
	}
	return false
}

// What each component calls (the gateway: internal/gateway; airlock-node:
// cmd/airlock-node; the controller: docs/kubernetes.md), and what none of
// them may do.
func TestRBACGrantsWhatEachPartCallsAndNoMore(t *testing.T) {
	r := grants(t, typed(t))
	type call struct{ sa, ns, group, resource, verb, name string }
	for _, c := range []call{
		{"airlock-gateway", "", "authentication.k8s.io", "tokenreviews", "create", ""},
		{"airlock-gateway", "", "authorization.k8s.io", "subjectaccessreviews", "create", ""},
		{"airlock-gateway", "a", "agents.x-k8s.io", "sandboxes", "list", ""},
		{"airlock-gateway", "a", "agents.x-k8s.io", "sandboxes", "watch", ""},
		{"airlock-gateway", "", "airlock.dev", "airlocknodes", "watch", ""},
		{"airlock-gateway", "airlock-system", "", "secrets", "get", "airlock-master"},
		{"airlock-node", "", "airlock.dev", "airlocknodes", "create", ""},
		{"airlock-node", "", "airlock.dev", "airlocknodes", "update", ""},
		{"airlock-node", "airlock-system", "", "secrets", "create", "airlock-node-n1"},
		{"airlock-node", "airlock-system", "", "secrets", "update", "airlock-node-n1"},
		{"airlock-controller", "a", "agents.x-k8s.io", "sandboxes", "create", ""},
		{"airlock-controller", "a", "agents.x-k8s.io", "sandboxes/status", "update", ""},
		{"airlock-controller", "a", "agents.x-k8s.io", "sandboxes/finalizers", "update", ""},
		{"airlock-controller", "a", "extensions.agents.x-k8s.io", "sandboxclaims/status", "update", ""},
		{"airlock-controller", "a", "extensions.agents.x-k8s.io", "sandboxwarmpools/scale", "update", ""},
		{"airlock-controller", "a", "extensions.agents.x-k8s.io", "sandboxtemplates", "watch", ""},
		{"airlock-controller", "", "airlock.dev", "airlocknodes/status", "update", ""},
		{"airlock-controller", "", "", "namespaces", "watch", ""},
		{"airlock-controller", "airlock-system", "", "secrets", "create", "airlock-master"},
		{"airlock-controller", "airlock-system", "", "secrets", "get", "airlock-node-n1"},
		{"airlock-controller", "a", "", "secrets", "list", ""}, // grants' Secrets, by label
		{"airlock-controller", "a", "", "secrets", "watch", ""},
	} {
		if !r.allows(c.sa, c.ns, c.group, c.resource, c.verb, c.name) {
			t.Errorf("%s may not %s %s %s/%s %s", c.sa, c.verb, c.ns, c.group, c.resource, c.name)
		}
	}
	for _, c := range []call{
		{"airlock-gateway", "airlock-system", "", "secrets", "get", "airlock-node-n1"}, // an admin key
		{"airlock-gateway", "a", "", "secrets", "get", "x"},
		{"airlock-gateway", "a", "agents.x-k8s.io", "sandboxes", "update", ""},
		{"airlock-node", "airlock-system", "", "secrets", "get", "airlock-master"},
		{"airlock-node", "airlock-system", "", "secrets", "list", ""},
		{"airlock-node", "", "airlock.dev", "airlocknodes", "delete", ""},
		{"airlock-controller", "a", "", "secrets", "get", "x"}, // only airlock-system's
		{"airlock-controller", "a", "", "secrets", "update", "x"},
		{"airlock-controller", "a", "", "secrets", "create", ""},
		{"airlock-controller", "", "", "pods", "create", ""},
	} {
		if r.allows(c.sa, c.ns, c.group, c.resource, c.verb, c.name) {
			t.Errorf("%s may %s %s %s/%s %s", c.sa, c.verb, c.ns, c.group, c.resource, c.name)
		}
	}
}

func TestWorkloadsUseTheirOwnAccounts(t *testing.T) {
	objs := typed(t)
	accounts := map[string]bool{}
	for _, o := range objs {
		if sa, ok := o.(*corev1.ServiceAccount); ok {
			accounts[sa.Name] = true
		}
	}
	seen := 0
	for _, o := range objs {
		var spec *corev1.PodSpec
		switch o := o.(type) {
		case *appsv1.Deployment:
			spec = &o.Spec.Template.Spec
		case *appsv1.DaemonSet:
			spec = &o.Spec.Template.Spec
			if !spec.HostPID || !spec.HostNetwork || !*spec.Containers[0].SecurityContext.Privileged {
				t.Errorf("DaemonSet %s: airlock serve needs hostPID, hostNetwork and privileged", o.Name)
			}
		default:
			continue
		}
		seen++
		if !accounts[spec.ServiceAccountName] {
			t.Errorf("%s uses service account %q, which the manifests do not make", o.GetObjectKind().GroupVersionKind().Kind, spec.ServiceAccountName)
		}
	}
	if seen != 3 {
		t.Fatalf("%d workloads, want controller, gateway, node", seen)
	}
}
