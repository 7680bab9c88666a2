package main

import (
	"context"
	"encoding/base64"
	"github.com/airlock-sandbox/airlock/k8s/internal/apiservertest"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// On a real apiserver (scripts/kube.sh's build; AIRLOCK_KUBE_BIN names
// another directory; skipped without it, failed under CI=true): the
// AirlockNode passes airlock's CRD, the Secret's owner (a cluster-scoped
// AirlockNode) is accepted, and a second pass replaces the key with a
// blind update.
func TestRegisterOnAnAPIServer(t *testing.T) {
	cfg := apiservertest.Start(t).Config
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "airlock-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile("testdata/ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	o := registration{Name: "n1", Endpoint: "https://127.0.0.1:8443", CABundle: ca, Namespace: "airlock-system", AdminKey: "airlock_admin_1", RuntimeClasses: []string{"airlock"}}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"airlock_admin_1", "airlock_admin_2"} {
		o.AdminKey = key
		if err := o.apply(ctx, kube, dyn); err != nil {
			t.Fatal(err)
		}
		sec, err := kube.CoreV1().Secrets("airlock-system").Get(ctx, "airlock-node-n1", metav1.GetOptions{})
		if err != nil || string(sec.Data[adminKeyField]) != key {
			t.Fatalf("secret after writing %s: %v %v", key, sec, err)
		}
	}
	node, err := dyn.Resource(nodesGVR).Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, _, _ := unstructured.NestedString(node.Object, "spec", "caBundle")
	if got != base64.StdEncoding.EncodeToString(ca) {
		t.Fatalf("caBundle %q", got)
	}
}
