package controller

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
)

// startAPIServer runs a real kube-apiserver and etcd (scripts/kube.sh
// builds them; AIRLOCK_KUBE_BIN names their directory) with agent-sandbox's
// CRDs from its module. Without the binaries the test skips; under CI=true
// it fails.
func startAPIServer(t *testing.T) *envtest.Environment {
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
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/agent-sandbox").Output()
	if err != nil {
		t.Fatalf("finding agent-sandbox's module: %v", err)
	}
	ctrllog.SetLogger(logr.Discard())
	env := &envtest.Environment{
		BinaryAssetsDirectory: bin,
		CRDDirectoryPaths:     []string{filepath.Join(strings.TrimSpace(string(out)), "k8s", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	if _, err := env.Start(); err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { env.Stop() })
	return env
}

// eventually polls cond until it holds or a minute passes.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not after a minute (%s)", what, last)
}

// The warm pool and claim reconcilers in a manager against a real
// apiserver (the nodes are fake): a pool of 6 spreads over three nodes,
// the scale subresource takes it to 9, a claim binds warm with exactly
// three writes, its deletion deletes its Sandbox, and the pool's deletion
// removes its daemon pools.
func TestPoolsAndClaimsOnAnAPIServer(t *testing.T) {
	env := startAPIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: controllerScheme(t), Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	view := newFakeNodeView(t, "a", "b", "c")
	w := &writeCounter{n: map[string]int{}}
	counted := countWrites(mgr.GetClient(), w)
	if err := indexRefs(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	classes := Classes{"airlock": true}
	if err := (&WarmPoolReconciler{Client: mgr.GetClient(), Nodes: view, Classes: classes, Events: mgr.GetEventRecorder("test")}).SetupWithManager(mgr, 2); err != nil {
		t.Fatal(err)
	}
	if err := (&ClaimReconciler{Client: counted, Scheme: mgr.GetScheme(), Nodes: view, Classes: classes}).SetupWithManager(mgr, 8); err != nil {
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

	c := mgr.GetAPIReader()
	kc, err := client.New(env.Config, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tns}}); err != nil {
		t.Fatal(err)
	}
	tmpl := airlockTemplate("t", extv1.EnvVarsInjectionPolicyAllowed)
	tmpl.UID, tmpl.ResourceVersion = "", ""
	pool := testWarmPool("p", "t", 6)
	pool.UID = ""
	for _, o := range []client.Object{tmpl, pool} {
		if err := kc.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	bp, err := blueprint.ForTemplate(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	name := daemonPoolName("p", bp.Hash)
	pf := &poolFixture{nodes: view, name: name}
	sizesAre := func(want int) func() (bool, string) {
		return func() (bool, string) {
			got := pf.sizes()
			return got["a"] == want && got["b"] == want && got["c"] == want, fmt.Sprint(got)
		}
	}
	eventually(t, "2 on each node", sizesAre(2))
	eventually(t, "pool status", func() (bool, string) {
		var p extv1.SandboxWarmPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
			return false, err.Error()
		}
		return p.Status.Replicas == 6 && p.Status.Selector == sandboxv1.SandboxWarmPoolLabel+"=p" && p.Status.ObservedGeneration == p.Generation, fmt.Sprintf("%+v", p.Status)
	})

	// The scale subresource (as kubectl scale and an HPA use it).
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 9}}
	if err := kc.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("scale: %v", err)
	}
	eventually(t, "3 on each node after scaling to 9", sizesAre(3))
	if err := kc.SubResource("scale").Get(ctx, pool, scale); err != nil || scale.Status.Selector != sandboxv1.SandboxWarmPoolLabel+"=p" {
		t.Fatalf("scale status %+v: %v", scale.Status, err)
	}
	eventually(t, "status.replicas 9 through scale", func() (bool, string) {
		if err := kc.SubResource("scale").Get(ctx, pool, scale); err != nil {
			return false, err.Error()
		}
		return scale.Status.Replicas == 9, fmt.Sprint(scale.Status.Replicas)
	})

	// A warm claim: three writes.
	view.syncPools()
	w.reset()
	claim := claimOf("c1", "p", extv1.EnvVar{Name: "TASK", Value: "1"})
	claim.UID = ""
	if err := kc.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the claim Ready", func() (bool, string) {
		var cl extv1.SandboxClaim
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), &cl); err != nil {
			return false, err.Error()
		}
		r := readyCond(cl.Status.Conditions)
		return r != nil && r.Status == metav1.ConditionTrue && cl.Status.SandboxStatus.Name == "c1", fmt.Sprintf("%+v", cl.Status)
	})
	var sb sandboxv1.Sandbox
	if err := c.Get(ctx, types.NamespacedName{Namespace: tns, Name: "c1"}, &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Labels[sandboxv1.SandboxLaunchTypeLabel] != "warm" || sb.Status.NodeName == "" {
		t.Fatalf("Sandbox labels %v status %+v", sb.Labels, sb.Status)
	}
	if got := w.n; w.total() != 3 || got["create Sandbox"] != 1 || got["status Sandbox"] != 1 || got["status SandboxClaim"] != 1 {
		t.Fatalf("writes of a warm claim: %v", got)
	}

	// The claim's deletion deletes its Sandbox (held by its finalizer,
	// which the Sandbox reconciler, not run here, would drop).
	if err := kc.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Sandbox deleted", func() (bool, string) {
		if err := c.Get(ctx, types.NamespacedName{Namespace: tns, Name: "c1"}, &sb); err != nil {
			return false, err.Error()
		}
		return !sb.DeletionTimestamp.IsZero(), "no deletion timestamp"
	})
	sb.Finalizers = nil
	if err := kc.Update(ctx, &sb); err != nil {
		t.Fatal(err)
	}

	// The pool's deletion removes its daemon pools, then the pool.
	if err := kc.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, "no daemon pools", sizesAre(0))
	eventually(t, "the pool gone", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKeyFromObject(pool), &extv1.SandboxWarmPool{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}
