package e2e

// The benchmarks of issue 18, each a whole scenario run once:
//
//	go test -run '^$' -bench . -benchtime 1x ./e2e
//
// They report figures (b.ReportMetric and a log line each), never assert a
// time. The API-write floor (BenchmarkAPIWriteFloor) is measured in the
// same run, on the same apiserver, for the claims' figures to be read
// against. Node-kill detection and recovery are TestNodeKilled's log line.

import (
	"bufio"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-sandbox/airlock/api"
)

// benchCPU is the CPU limit of the benchmarks' sandboxes: small, so that
// pools of tens fit the nodes' 2 CPUs each.
const benchCPU = "50m"

// readyWatch follows one kind's objects in a namespace and records when
// each is first seen to satisfy ready. The apiserver closes a watch whose
// reader falls behind (a busy machine): the watch is then made again from
// a fresh list, whose newly ready objects are stamped as they are found.
type readyWatch struct {
	mu      sync.Mutex
	at      map[string]time.Time
	waiters map[string]chan struct{}
}

func watchReady(b testing.TB, list client.ObjectList, ns string, ready func(client.Object) bool) *readyWatch {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	rw := &readyWatch{at: map[string]time.Time{}, waiters: map[string]chan struct{}{}}
	started := make(chan error, 1)
	go func() {
		first := true
		for ctx.Err() == nil {
			l := list.DeepCopyObject().(client.ObjectList)
			err := env.c.List(ctx, l, client.InNamespace(ns))
			var w watch.Interface
			if err == nil {
				items, _ := meta.ExtractList(l)
				for _, it := range items {
					if o := it.(client.Object); ready(o) {
						rw.saw(o.GetName())
					}
				}
				w, err = env.c.Watch(ctx, list.DeepCopyObject().(client.ObjectList), client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: l.GetResourceVersion()}})
			}
			if first {
				started <- err
				first = false
			}
			if err != nil {
				if ctx.Err() == nil {
					time.Sleep(100 * time.Millisecond)
				}
				continue
			}
			for ev := range w.ResultChan() {
				if o, ok := ev.Object.(client.Object); ok && ev.Type != watch.Error && ready(o) {
					rw.saw(o.GetName())
				}
			}
			w.Stop()
		}
	}()
	if err := <-started; err != nil {
		b.Fatal(err)
	}
	return rw
}

func (rw *readyWatch) saw(name string) {
	now := time.Now()
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if _, seen := rw.at[name]; !seen {
		rw.at[name] = now
		if c := rw.waiters[name]; c != nil {
			close(c)
		}
	}
}

// expect registers interest in name before it is made.
func (rw *readyWatch) expect(name string) <-chan struct{} {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	c := make(chan struct{})
	rw.waiters[name] = c
	return c
}

// since waits until name is ready and returns how long after t0 (a
// worker's call: it reports a wait that never ends as an error).
func (rw *readyWatch) since(b testing.TB, name string, c <-chan struct{}, t0 time.Time) time.Duration {
	select {
	case <-c:
	case <-time.After(waitTimeout):
		b.Errorf("%s never ready", name)
		return 0
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.at[name].Sub(t0)
}

// latencies is a sample of durations.
type latencies []time.Duration

func (l latencies) pct(p int) time.Duration {
	s := append(latencies(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := len(s) * p / 100
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// run does k operations from par workers; op returns one latency. It
// returns the latencies and the wall time.
func run(k, par int, op func(i int) time.Duration) (latencies, time.Duration) {
	out := make(latencies, k)
	next := make(chan int)
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = op(i)
			}
		}()
	}
	for i := 0; i < k; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return out, time.Since(t0)
}

func report(b *testing.B, what string, l latencies, wall time.Duration) {
	b.ReportMetric(ms(l.pct(50)), what+"-p50-ms")
	b.ReportMetric(ms(l.pct(99)), what+"-p99-ms")
	b.ReportMetric(float64(len(l))/wall.Seconds(), what+"-per-s")
	b.Logf("%s (n=%d): p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, %.0f/s", what, len(l), ms(l.pct(50)), ms(l.pct(90)), ms(l.pct(99)), float64(len(l))/wall.Seconds())
}

// mutatingWrites reads the apiserver's apiserver_request_total of mutating
// verbs, by resource (group/resource[/subresource]).
func mutatingWrites(b testing.TB) map[string]float64 {
	b.Helper()
	body, err := env.apiGet("/metrics")
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		labels := map[string]string{}
		for _, kv := range strings.Split(line[len("apiserver_request_total{"):end], ",") {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = strings.Trim(v, `"`)
		}
		switch labels["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		default:
			continue
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		key := labels["group"] + "/" + labels["resource"]
		if labels["subresource"] != "" {
			key += "/" + labels["subresource"]
		}
		out[key+" "+labels["verb"]] += n
	}
	return out
}

func benchTemplate(ns, name string) *extv1beta1.SandboxTemplate {
	t := newTemplate(ns, name, extv1beta1.EnvVarsInjectionPolicyAllowed)
	t.Spec.PodTemplate.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(benchCPU)}
	return t
}

// BenchmarkWarmClaim: claims on a warm pool of 45 (15 a node), from the
// claim's create to the claim's Ready seen on a watch: serial, then 8 and
// 32 at once; with the apiserver's mutating writes per serial claim (the
// refill's pool status writes included) and the warm hits.
func BenchmarkWarmClaim(b *testing.B) {
	const ns, pool, replicas = "bench-warm", "swp", 45
	namespace(b, ns)
	create(b, benchTemplate(ns, "tpl"))
	create(b, newPool(ns, pool, "tpl", replicas))
	waitPool(b, ns, pool, replicas)
	rw := watchReady(b, &extv1beta1.SandboxClaimList{}, ns, func(o client.Object) bool { return claimReady(o.(*extv1beta1.SandboxClaim)) })
	phase := func(name string, k, par int) latencies {
		b.Helper()
		var made []*extv1beta1.SandboxClaim
		var mu sync.Mutex
		before := mutatingWrites(b)
		l, wall := run(k, par, func(i int) time.Duration {
			c := newClaim(ns, fmt.Sprintf("%s-%d", name, i), pool)
			ready := rw.expect(c.Name)
			t0 := time.Now()
			if err := env.c.Create(context.Background(), c); err != nil {
				b.Error(err)
				return 0
			}
			mu.Lock()
			made = append(made, c)
			mu.Unlock()
			return rw.since(b, c.Name, ready, t0)
		})
		after := mutatingWrites(b)
		report(b, name, l, wall)
		if par == 1 {
			total, detail := 0.0, []string{}
			for k, v := range after {
				if d := v - before[k]; d > 0 {
					total += d
					detail = append(detail, fmt.Sprintf("%s %.0f", k, d))
				}
			}
			sort.Strings(detail)
			b.ReportMetric(total/float64(k), "writes/claim")
			b.Logf("apiserver mutating writes per warm claim: %.2f (%d claims; %s)", total/float64(k), k, strings.Join(detail, ", "))
		}
		warm := 0
		for _, c := range made {
			s := &sandboxv1beta1.Sandbox{}
			if err := env.c.Get(context.Background(), client.ObjectKeyFromObject(c), s); err == nil && s.Labels[sandboxv1beta1.SandboxLaunchTypeLabel] == sandboxv1beta1.SandboxLaunchTypeWarm {
				warm++
			}
		}
		b.Logf("%s: %d of %d warm", name, warm, len(made))
		for _, c := range made {
			remove(b, c)
		}
		waitPool(b, ns, pool, replicas)
		return l
	}
	b.ResetTimer()
	phase("serial", 40, 1)
	phase("par8", 40, 8)
	phase("par32", 40, 32)
}

// BenchmarkAPIWriteFloor: the research's 4-write bind on the same
// apiserver, with no controller and no daemon in it: create a claim-like
// object, create a Sandbox, update the Sandbox's status, update the
// first's status; the time until a watch sees that last write. Both
// objects are Sandboxes of no runtime class, which airlock's controller
// leaves alone (TestOtherRuntimeClassUntouched).
func BenchmarkAPIWriteFloor(b *testing.B) {
	const ns = "bench-floor"
	namespace(b, ns)
	rw := watchReady(b, &sandboxv1beta1.SandboxList{}, ns, func(o client.Object) bool {
		return sandboxReady(o.(*sandboxv1beta1.Sandbox)) && strings.HasSuffix(o.GetName(), "-claim")
	})
	ctx := context.Background()
	ready := metav1.Condition{Type: string(sandboxv1beta1.SandboxConditionReady), Status: metav1.ConditionTrue, Reason: "Bound", LastTransitionTime: metav1.Now()}
	var mu sync.Mutex
	var made []client.Object
	phase := func(name string, k, par int) {
		l, wall := run(k, par, func(i int) time.Duration {
			claim := newSandbox(ns, fmt.Sprintf("%s-%d-claim", name, i), "", "")
			sb := newSandbox(ns, fmt.Sprintf("%s-%d", name, i), "", "")
			seen := rw.expect(claim.Name)
			t0 := time.Now()
			for _, step := range []func() error{
				func() error { return env.c.Create(ctx, claim) },
				func() error { return env.c.Create(ctx, sb) },
				func() error { sb.Status.Conditions = []metav1.Condition{ready}; return env.c.Status().Update(ctx, sb) },
				func() error {
					claim.Status.Conditions = []metav1.Condition{ready}
					return env.c.Status().Update(ctx, claim)
				},
			} {
				if err := step(); err != nil {
					b.Error(err)
					return 0
				}
			}
			mu.Lock()
			made = append(made, claim, sb)
			mu.Unlock()
			return rw.since(b, claim.Name, seen, t0)
		})
		report(b, "floor-"+name, l, wall)
	}
	b.ResetTimer()
	phase("serial", 100, 1)
	phase("par8", 200, 8)
	phase("par32", 200, 32)
	b.StopTimer()
	for _, o := range made {
		if err := env.c.Delete(ctx, o); err != nil {
			b.Error(err)
		}
	}
}

// BenchmarkColdClaim: claims on a pool of none (each a cold create from
// the template on the least allocated node) against airlock's own cold
// create of the same body on one daemon, serial.
func BenchmarkColdClaim(b *testing.B) {
	const ns, pool, k = "bench-cold", "swp", 20
	namespace(b, ns)
	create(b, benchTemplate(ns, "tpl"))
	create(b, newPool(ns, pool, "tpl", 0))
	rw := watchReady(b, &extv1beta1.SandboxClaimList{}, ns, func(o client.Object) bool { return claimReady(o.(*extv1beta1.SandboxClaim)) })
	b.ResetTimer()
	l, wall := run(k, 1, func(i int) time.Duration {
		c := newClaim(ns, fmt.Sprintf("cold-%d", i), pool)
		ready := rw.expect(c.Name)
		t0 := time.Now()
		if err := env.c.Create(context.Background(), c); err != nil {
			b.Error(err)
			return 0
		}
		d := rw.since(b, c.Name, ready, t0)
		remove(b, c)
		return d
	})
	report(b, "cold-claim", l, wall)
	// The same create on one daemon, as the namespace's tenant.
	n := env.nodes[0]
	tc := tenantClient(b, n, ns)
	body := &api.CreateSandbox{Image: "host", Limits: api.Limits{CPUs: 0.05, MemoryBytes: 256 << 20}}
	l, wall = run(k, 1, func(i int) time.Duration {
		t0 := time.Now()
		s, err := tc.CreateSandbox(context.Background(), body)
		d := time.Since(t0)
		if err != nil {
			b.Error(err)
			return 0
		}
		if err := tc.Destroy(context.Background(), s.ID); err != nil {
			b.Error(err)
		}
		return d
	})
	report(b, "daemon-cold-create", l, wall)
}

// BenchmarkPlacement: Sandboxes made from 16 workers onto the three real
// nodes, from the first create to the last Ready: Sandboxes placed a
// second.
func BenchmarkPlacement(b *testing.B) {
	const ns, k = "bench-place", 90
	namespace(b, ns)
	rw := watchReady(b, &sandboxv1beta1.SandboxList{}, ns, func(o client.Object) bool { return sandboxReady(o.(*sandboxv1beta1.Sandbox)) })
	var mu sync.Mutex
	var made []client.Object
	b.ResetTimer()
	l, wall := run(k, 16, func(i int) time.Duration {
		s := newSandbox(ns, fmt.Sprintf("p-%d", i), "airlock", benchCPU)
		ready := rw.expect(s.Name)
		t0 := time.Now()
		if err := env.c.Create(context.Background(), s); err != nil {
			b.Error(err)
			return 0
		}
		mu.Lock()
		made = append(made, s)
		mu.Unlock()
		return rw.since(b, s.Name, ready, t0)
	})
	b.StopTimer()
	report(b, "placed", l, wall)
	for _, s := range made {
		remove(b, s)
	}
	noResidue(b, ns)
}
