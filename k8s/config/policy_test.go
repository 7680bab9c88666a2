package config

import (
	"testing"

	"github.com/google/cel-go/cel"
	admissionv1 "k8s.io/api/admissionregistration/v1"
)

// nodePolicy is the node restriction policy of the manifests.
func nodePolicy(t *testing.T) *admissionv1.ValidatingAdmissionPolicy {
	t.Helper()
	for _, o := range typed(t) {
		if p, ok := o.(*admissionv1.ValidatingAdmissionPolicy); ok && p.Name == "airlock-node-restriction" {
			return p
		}
	}
	t.Fatal("no ValidatingAdmissionPolicy airlock-node-restriction")
	return nil
}

// admits evaluates the policy's CEL as the apiserver does (match
// conditions, then variables, then every validation) on a request of
// user with extra, writing object; it says whether the request passes.
func admits(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy, user string, extra map[string]any, op, resource, name string, object map[string]any) bool {
	t.Helper()
	env, err := cel.NewEnv(
		cel.Variable("request", cel.DynType),
		cel.Variable("object", cel.DynType),
		cel.Variable("oldObject", cel.DynType),
		cel.Variable("variables", cel.DynType),
	)
	if err != nil {
		t.Fatal(err)
	}
	eval := func(expr string, vars map[string]any) any {
		t.Helper()
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", expr, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.Eval(vars)
		if err != nil {
			// The policy's failurePolicy is Fail: an error refuses.
			return err
		}
		return out.Value()
	}
	userInfo := map[string]any{"username": user}
	if extra != nil {
		userInfo["extra"] = extra
	}
	vars := map[string]any{
		"request": map[string]any{
			"operation": op,
			"name":      name,
			"userInfo":  userInfo,
			"resource":  map[string]any{"resource": resource},
		},
		"object":    object,
		"oldObject": nil,
		"variables": map[string]any{},
	}
	for _, mc := range p.Spec.MatchConditions {
		if eval(mc.Expression, vars) != true {
			return true // not the policy's business
		}
	}
	variables := map[string]any{}
	for _, v := range p.Spec.Variables {
		variables[v.Name] = eval(v.Expression, vars)
	}
	vars["variables"] = variables
	for _, v := range p.Spec.Validations {
		if eval(v.Expression, vars) != true {
			return false
		}
	}
	return true
}

func airlockNode(name, refNamespace, refName string) map[string]any {
	return map[string]any{
		"apiVersion": "airlock.dev/v1alpha1",
		"kind":       "AirlockNode",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"endpoint": "https://10.0.0.1:7443",
			"adminKeySecretRef": map[string]any{
				"namespace": refNamespace, "name": refName, "key": "admin-key",
			},
		},
	}
}

// The sidecar on node n1 writes AirlockNode n1 and Secret airlock-node-n1
// and nothing else — and its AirlockNode may name no Secret but its own:
// the controller reads the Secret a node's adminKeySecretRef names and
// sends what it holds to that node's endpoint as the admin key, so a
// node pointing it at airlock-node-n2 (or the master) would be handed
// another node's admin key.
func TestNodeRestrictionHoldsANodeToItsOwnObjects(t *testing.T) {
	p := nodePolicy(t)
	const sa = "system:serviceaccount:airlock-system:airlock-node"
	n1 := map[string]any{"authentication.kubernetes.io/node-name": []any{"n1"}}
	secret := map[string]any{"apiVersion": "v1", "kind": "Secret"}
	for _, c := range []struct {
		what          string
		user          string
		extra         map[string]any
		op, res, name string
		object        map[string]any
		want          bool
	}{
		{"its own node", sa, n1, "CREATE", "airlocknodes", "n1", airlockNode("n1", "airlock-system", "airlock-node-n1"), true},
		{"its own node, updated", sa, n1, "UPDATE", "airlocknodes", "n1", airlockNode("n1", "airlock-system", "airlock-node-n1"), true},
		{"its own secret", sa, n1, "CREATE", "secrets", "airlock-node-n1", secret, true},
		{"another node", sa, n1, "UPDATE", "airlocknodes", "n2", airlockNode("n2", "airlock-system", "airlock-node-n2"), false},
		{"another node's secret", sa, n1, "UPDATE", "secrets", "airlock-node-n2", secret, false},
		{"the master", sa, n1, "UPDATE", "secrets", "airlock-master", secret, false},
		{"no node in the token", sa, nil, "CREATE", "airlocknodes", "n1", airlockNode("n1", "airlock-system", "airlock-node-n1"), false},
		{"its node naming another node's admin key", sa, n1, "UPDATE", "airlocknodes", "n1", airlockNode("n1", "airlock-system", "airlock-node-n2"), false},
		{"its node naming the master", sa, n1, "UPDATE", "airlocknodes", "n1", airlockNode("n1", "airlock-system", "airlock-master"), false},
		{"its node naming a Secret elsewhere", sa, n1, "CREATE", "airlocknodes", "n1", airlockNode("n1", "kube-system", "airlock-node-n1"), false},
		{"an operator", "admin", nil, "UPDATE", "airlocknodes", "n2", airlockNode("n2", "airlock-system", "anything"), true},
	} {
		if got := admits(t, p, c.user, c.extra, c.op, c.res, c.name, c.object); got != c.want {
			t.Errorf("%s: admitted %v, want %v", c.what, got, c.want)
		}
	}
}
