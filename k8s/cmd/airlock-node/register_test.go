package main

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestRegisterMakesThenKeepsTheNodeAndItsKey(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset()
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{nodesGVR: "AirlockNodeList"})
	o := registration{Name: "n1", Endpoint: "unix:///run/n1.sock", Namespace: "airlock-system", AdminKey: "airlock_admin_1", RuntimeClasses: []string{"airlock", "airlock-gvisor"}}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	if err := o.apply(ctx, kube, dyn); err != nil {
		t.Fatal(err)
	}
	node, err := dyn.Resource(nodesGVR).Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep, _, _ := unstructured.NestedString(node.Object, "spec", "endpoint")
	classes, _, _ := unstructured.NestedStringSlice(node.Object, "spec", "runtimeClasses")
	ref, _, _ := unstructured.NestedStringMap(node.Object, "spec", "adminKeySecretRef")
	if ep != o.Endpoint || strings.Join(classes, ",") != "airlock,airlock-gvisor" ||
		ref["namespace"] != "airlock-system" || ref["name"] != "airlock-node-n1" || ref["key"] != adminKeyField {
		t.Fatalf("node spec %v", node.Object["spec"])
	}
	sec, err := kube.CoreV1().Secrets("airlock-system").Get(ctx, "airlock-node-n1", metav1.GetOptions{})
	if err != nil || string(sec.Data[adminKeyField]) != "airlock_admin_1" {
		t.Fatalf("secret %v %v", sec, err)
	}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].Kind != "AirlockNode" || sec.OwnerReferences[0].Name != "n1" {
		t.Fatalf("secret owners %v", sec.OwnerReferences)
	}

	// An operator cordons the node; the daemon moves and its key changes:
	// the next pass writes the new endpoint and key and keeps the cordon.
	unstructured.SetNestedField(node.Object, true, "spec", "unschedulable")
	if _, err := dyn.Resource(nodesGVR).Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	o.Endpoint, o.AdminKey = "unix:///run/n1b.sock", "airlock_admin_2"
	if err := o.apply(ctx, kube, dyn); err != nil {
		t.Fatal(err)
	}
	node, _ = dyn.Resource(nodesGVR).Get(ctx, "n1", metav1.GetOptions{})
	ep, _, _ = unstructured.NestedString(node.Object, "spec", "endpoint")
	cordon, _, _ := unstructured.NestedBool(node.Object, "spec", "unschedulable")
	if ep != "unix:///run/n1b.sock" || !cordon {
		t.Fatalf("after the second pass: spec %v", node.Object["spec"])
	}
	sec, _ = kube.CoreV1().Secrets("airlock-system").Get(ctx, "airlock-node-n1", metav1.GetOptions{})
	if string(sec.Data[adminKeyField]) != "airlock_admin_2" {
		t.Fatalf("key not updated: %q", sec.Data[adminKeyField])
	}

	// Nothing changed: the node is not written; the Secret is, without
	// reading any Secret first (airlock-node may not).
	kube.ClearActions()
	dyn.ClearActions()
	if err := o.apply(ctx, kube, dyn); err != nil {
		t.Fatal(err)
	}
	for _, a := range dyn.Actions() {
		if _, ok := a.(k8stesting.GetAction); !ok {
			t.Errorf("an unchanged pass wrote the node: %v", a)
		}
	}
	for _, a := range kube.Actions() {
		if a.GetVerb() == "get" || a.GetVerb() == "list" {
			t.Errorf("airlock-node read a Secret: %v", a)
		}
	}
}

func TestRegistrationRefusesBadFlags(t *testing.T) {
	good := registration{Name: "n1", Endpoint: "https://10.0.0.1:8443", AdminKey: "k", RuntimeClasses: []string{"airlock"}}
	for name, edit := range map[string]func(*registration){
		"plain http":      func(o *registration) { o.Endpoint = "http://10.0.0.1:8443" },
		"relative socket": func(o *registration) { o.Endpoint = "unix://run/a.sock" },
		"https with path": func(o *registration) { o.Endpoint = "https://h:1/v1" },
		"bad name":        func(o *registration) { o.Name = "N_1" },
		"empty key":       func(o *registration) { o.AdminKey = "" },
		"no classes":      func(o *registration) { o.RuntimeClasses = nil },
		"CA not PEM":      func(o *registration) { o.CABundle = []byte("nope") },
		"CA on a socket":  func(o *registration) { o.Endpoint, o.CABundle = "unix:///a.sock", []byte("x") },
	} {
		o := good
		edit(&o)
		if o.validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := good.validate(); err != nil {
		t.Fatal(err)
	}
}
