package main

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/k8s/config"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// On a real apiserver (scripts/kube.sh's build; AIRLOCK_KUBE_BIN names
// another directory; skipped without it, failed under CI=true): the
// AirlockNode passes airlock's CRD, the Secret's owner (a cluster-scoped
// AirlockNode) is accepted, and a second pass replaces the key with a
// blind update.
func TestRegisterOnAnAPIServer(t *testing.T) {
	bin := os.Getenv("AIRLOCK_KUBE_BIN")
	if bin == "" {
		bin = "/usr/local/lib/airlock/kube"
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("no %s in %s (scripts/kube.sh builds it)", b, bin)
			}
			t.Skipf("no %s in %s (scripts/kube.sh builds it; AIRLOCK_KUBE_BIN names another directory)", b, bin)
		}
	}
	objs, err := config.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	var crds []*apiextv1.CustomResourceDefinition
	for _, o := range objs {
		var c apiextv1.CustomResourceDefinition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &c); err != nil {
			t.Fatal(err)
		}
		crds = append(crds, &c)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: bin, CRDs: crds}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	defer env.Stop()
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
