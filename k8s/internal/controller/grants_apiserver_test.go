package controller

import (
	"context"
	"errors"
	"fmt"
	"github.com/airlock-sandbox/airlock/k8s/internal/apiservertest"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
)

// On a real apiserver, with the controller's cache options: an unlabelled
// Secret is not in the cache at all (refused), a labelled one is pushed, a
// change of its value reaches the node through the watch, and removing
// its label removes the node's copy.
func TestGrantSecretsOnAnAPIServer(t *testing.T) {
	env := apiservertest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	skip := true
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: controllerScheme(t), Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: &skip},
		Cache:      cache.Options{ByObject: SecretCache()},
	})
	if err != nil {
		t.Fatal(err)
	}
	view := newFakeNodeView(t, "a")
	g := &GrantSecrets{Reader: mgr.GetClient(), Tenants: view, Log: logr.Discard()}
	if err := g.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	kc, err := client.New(env.Config, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tns}}); err != nil {
		t.Fatal(err)
	}
	labelled, raw := grantSecret("gh", true, map[string]string{"token": grantValue}), grantSecret("raw", false, map[string]string{"token": grantValue})
	for _, s := range []*corev1.Secret{labelled, raw} {
		s.Namespace = tns
		if err := kc.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	ref := func(name string) []blueprint.SecretRef {
		return []blueprint.SecretRef{{Name: name, Key: "token", Daemon: blueprint.DaemonSecretName(name, "token"), Hosts: []string{"api.github.com"}}}
	}
	d := view.daemons["a"]
	held := func(name string) (string, bool) {
		d.mu.Lock()
		defer d.mu.Unlock()
		v, ok := d.secrets[tns+"/"+blueprint.DaemonSecretName(name, "token")]
		return v, ok
	}
	eventually(t, "the labelled Secret pushed", func() (bool, string) {
		err := g.Push(ctx, "a", tns, ref("gh"))
		return err == nil, fmt.Sprint(err)
	})
	if v, _ := held("gh"); v != grantValue {
		t.Fatalf("node holds %q", v)
	}
	var ge *GrantError
	if err := g.Push(ctx, "a", tns, ref("raw")); !errors.As(err, &ge) {
		t.Fatalf("the unlabelled Secret: %v", err)
	}
	if _, ok := held("raw"); ok {
		t.Fatal("the unlabelled Secret was pushed")
	}
	labelled.Data["token"] = []byte(grantValue + "-2")
	if err := kc.Update(ctx, labelled); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new value on the node", func() (bool, string) {
		v, _ := held("gh")
		return v == grantValue+"-2", "not yet"
	})
	labelled.Labels = nil
	if err := kc.Update(ctx, labelled); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the copy removed", func() (bool, string) {
		_, ok := held("gh")
		return !ok, "still held"
	})
}
