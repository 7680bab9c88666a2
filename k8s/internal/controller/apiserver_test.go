package controller

import (
	"context"
	"fmt"
	"github.com/airlock-sandbox/airlock/k8s/internal/apiservertest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
)

// eventually polls cond until it holds or a minute passes.
func eventually(t testing.TB, what string, cond func() (bool, string)) {
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

// apiFixture is the warm pool and claim reconcilers in a manager against
// a real apiserver, on fake nodes a, b and c, with namespace tns made.
type apiFixture struct {
	kc    client.WithWatch // the test's own client
	c     client.Reader    // uncached
	view  *fakeNodeView
	w     *writeCounter // the claim reconciler's writes
	close func()
}

func startPoolsAndClaims(t testing.TB) *apiFixture {
	env := apiservertest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	skip := true // more than one manager in the test process
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: controllerScheme(t), Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &apiFixture{c: mgr.GetAPIReader(), view: newFakeNodeView(t, "a", "b", "c"), w: &writeCounter{n: map[string]int{}}}
	if err := indexRefs(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	classes := Classes{"airlock": true}
	if err := (&WarmPoolReconciler{Client: mgr.GetClient(), Nodes: f.view, Classes: classes, Events: mgr.GetEventRecorder("test")}).SetupWithManager(mgr, 2); err != nil {
		t.Fatal(err)
	}
	if err := (&ClaimReconciler{Client: countWrites(mgr.GetClient(), f.w), Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Nodes: f.view, Classes: classes}).SetupWithManager(mgr, 64); err != nil {
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
	if f.kc, err = client.NewWithWatch(env.Config, client.Options{Scheme: mgr.GetScheme()}); err != nil {
		t.Fatal(err)
	}
	if err := f.kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tns}}); err != nil {
		t.Fatal(err)
	}
	return f
}

// makePool makes template t (env policy Allowed) and warm pool p of it,
// and answers p's daemon pool name.
func (f *apiFixture) makePool(t testing.TB, replicas int32) (*extv1.SandboxWarmPool, string) {
	ctx := context.Background()
	tmpl := airlockTemplate("t", extv1.EnvVarsInjectionPolicyAllowed)
	tmpl.UID, tmpl.ResourceVersion = "", ""
	pool := testWarmPool("p", "t", replicas)
	pool.UID = ""
	for _, o := range []client.Object{tmpl, pool} {
		if err := f.kc.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	bp, err := blueprint.ForTemplate(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return pool, daemonPoolName("p", bp.Hash)
}

// The warm pool and claim reconcilers in a manager against a real
// apiserver (the nodes are fake): a pool of 6 spreads over three nodes,
// the scale subresource takes it to 9, a claim binds warm with exactly
// three writes, its deletion deletes its Sandbox, and the pool's deletion
// removes its daemon pools.
func TestPoolsAndClaimsOnAnAPIServer(t *testing.T) {
	f := startPoolsAndClaims(t)
	ctx := context.Background()
	kc, c, view, w := f.kc, f.c, f.view, f.w
	pool, name := f.makePool(t, 6)
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

// BenchmarkWarmClaimOnAnAPIServer is a warm claim's time from its create
// to its Ready status, serially and 8 and 32 at a time, on a real
// apiserver with fake nodes (the controller's and the apiserver's share of
// a claim: the daemon's bind is a fake's). BenchmarkAPIFloorOnAnAPIServer
// is the floor to read it against.
func BenchmarkWarmClaimOnAnAPIServer(b *testing.B) {
	for _, par := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("par-%d", par), func(b *testing.B) {
			f := startPoolsAndClaims(b)
			ctx := context.Background()
			_, name := f.makePool(b, 3)
			for _, n := range []string{"a", "b", "c"} {
				f.view.setPool(n, tns, name, 1, 1<<20) // the share of 3 over 3 nodes, so never set again
			}
			var claims extv1.SandboxClaimList
			watch, err := f.kc.Watch(ctx, &claims, client.InNamespace(tns))
			if err != nil {
				b.Fatal(err)
			}
			defer watch.Stop()
			var mu sync.Mutex
			ready := map[string]chan struct{}{}
			go func() {
				for ev := range watch.ResultChan() {
					cl, ok := ev.Object.(*extv1.SandboxClaim)
					if readyCondOf(cl, ok) {
						mu.Lock()
						if c := ready[cl.Name]; c != nil {
							close(c)
							delete(ready, cl.Name)
						}
						mu.Unlock()
					}
				}
			}()
			lat := make([]time.Duration, b.N)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range par {
				wg.Go(func() {
					for i := int(next.Add(1)) - 1; i < b.N; i = int(next.Add(1)) - 1 {
						claim := claimOf(fmt.Sprintf("bench-%d", i), "p")
						claim.UID = ""
						done := make(chan struct{})
						mu.Lock()
						ready[claim.Name] = done
						mu.Unlock()
						start := time.Now()
						if err := f.kc.Create(ctx, claim); err != nil {
							b.Error(err)
							return
						}
						<-done
						lat[i] = time.Since(start)
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(f.w.total())/float64(b.N), "writes/claim")
		})
	}
}

func readyCondOf(cl *extv1.SandboxClaim, ok bool) bool {
	if !ok || cl == nil {
		return false
	}
	r := readyCond(cl.Status.Conditions)
	return r != nil && r.Status == metav1.ConditionTrue
}

// BenchmarkAPIFloorOnAnAPIServer is research §5.1's floor beside
// BenchmarkWarmClaimOnAnAPIServer, in the same process and apiserver: a
// claim's create and the three writes of its bind done inline (no
// controller, no informer, no daemon), to the watch's Ready.
func BenchmarkAPIFloorOnAnAPIServer(b *testing.B) {
	env := apiservertest.Start(b)
	ctx := context.Background()
	kc, err := client.NewWithWatch(env.Config, client.Options{Scheme: controllerScheme(b)})
	if err != nil {
		b.Fatal(err)
	}
	if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tns}}); err != nil {
		b.Fatal(err)
	}
	tmpl := airlockTemplate("t", "")
	var claims extv1.SandboxClaimList
	watch, err := kc.Watch(ctx, &claims, client.InNamespace(tns))
	if err != nil {
		b.Fatal(err)
	}
	defer watch.Stop()
	var lat []time.Duration
	b.ResetTimer()
	for i := range b.N {
		claim := claimOf(fmt.Sprintf("floor-%d", i), "p")
		claim.UID = ""
		start := time.Now()
		if err := kc.Create(ctx, claim); err != nil {
			b.Fatal(err)
		}
		sb := &sandboxv1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: tns, Name: claim.Name, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: extv1.GroupVersion.String(), Kind: "SandboxClaim", Name: claim.Name, UID: claim.UID,
			}}},
			Spec: sandboxv1.SandboxSpec{SandboxBlueprint: tmpl.Spec.SandboxBlueprint},
		}
		if err := kc.Create(ctx, sb); err != nil {
			b.Fatal(err)
		}
		MarkReady(sb, "a")
		if err := kc.Status().Update(ctx, sb); err != nil {
			b.Fatal(err)
		}
		claim.Status.SandboxStatus.Name = sb.Name
		claim.Status.Conditions = []metav1.Condition{*readyCond(sb.Status.Conditions)}
		if err := kc.Status().Update(ctx, claim); err != nil {
			b.Fatal(err)
		}
		for ev := range watch.ResultChan() {
			cl, ok := ev.Object.(*extv1.SandboxClaim)
			if readyCondOf(cl, ok) && cl.Name == claim.Name {
				break
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
