package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/k8s/internal/blueprint"
	"github.com/airlock-sandbox/airlock/k8s/internal/daemontest"
)

// the value the tests' Secrets hold; it must never show outside the daemon.
const grantValue = "ghp_k8sGrantValueNeverShown0123456789"

// logBuffer collects every log line at every verbosity.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func withGrantSecrets(h *harness) *logBuffer {
	lb := &logBuffer{}
	log := funcr.New(func(prefix, args string) {
		lb.mu.Lock()
		lb.b.WriteString(prefix + " " + args + "\n")
		lb.mu.Unlock()
	}, funcr.Options{Verbosity: 10})
	h.r.Log = log
	h.r.Grants = &GrantSecrets{Reader: h.c, Tenants: h.tr, Log: log}
	return lb
}

func grantSecret(name string, labelled bool, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name}, Data: map[string][]byte{}}
	if labelled {
		s.Labels = map[string]string{blueprint.LabelGrant: "true"}
	}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func grantSandbox(name, secret string) *sandboxv1.Sandbox {
	return sandbox(name, "airlock", func(s *sandboxv1.Sandbox) {
		s.Spec.PodTemplate.ObjectMeta.Annotations = map[string]string{
			blueprint.AnnotationGrants: `[{"secret": "` + secret + `", "host": "api.github.com", "allow": ["GET /repos/**"], "env": "GH_TOKEN"}]`,
		}
	})
}

// noValue fails when the Secret's value shows in the Sandbox (status,
// annotations) or the log.
func noValue(t *testing.T, h *harness, name string, lb *logBuffer) {
	t.Helper()
	j, err := json.Marshal(h.get(name))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(j), grantValue) || strings.Contains(lb.String(), grantValue) {
		t.Fatalf("the Secret's value shows:\nsandbox %s\nlog %s", j, lb)
	}
}

// A Sandbox whose grants name a labelled Secret: the key's value is the
// daemon secret of the namespace's tenant on the node before the create
// (the fake daemon, like airlock serve, refuses a create whose grant names
// a secret it lacks), its trailing line break dropped.
func TestGrantSecretIsPushedBeforeTheCreate(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	lb := withGrantSecrets(h)
	if err := h.c.Create(h.ctx, grantSecret("gh", true, map[string]string{"token": grantValue + "\n"})); err != nil {
		t.Fatal(err)
	}
	h.create(grantSandbox("box", "gh/token"))
	h.reconcile("box")
	s := h.get("box")
	if cond(s, sandboxv1.SandboxConditionReady).Status != metav1.ConditionTrue || s.Annotations["airlock.dev/node"] != "n1" {
		t.Fatalf("not Ready: %+v", s.Status)
	}
	v, version, ok := d.Secret("team-a", blueprint.DaemonSecretName("gh", "token"))
	if !ok || v != grantValue || version != 1 {
		t.Fatalf("daemon secret %q v%d %v", v, version, ok)
	}
	// a second Sandbox on the node: the unchanged value is not sent again
	h.create(grantSandbox("box2", "gh/token"))
	h.reconcile("box2")
	if _, version, _ := d.Secret("team-a", blueprint.DaemonSecretName("gh", "token")); version != 1 {
		t.Fatalf("an unchanged value was pushed again (version %d)", version)
	}
	noValue(t, h, "box", lb)
}

// A Secret without the label airlock.dev/grant=true, a missing one, or one
// without the key is refused: no push, no create, Ready=False
// GrantSecretUnavailable, tried again later.
func TestGrantSecretWithoutTheLabelIsRefused(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	lb := withGrantSecrets(h)
	for _, s := range []*corev1.Secret{
		grantSecret("unlabelled", false, map[string]string{"token": grantValue}),
		grantSecret("labelled", true, map[string]string{"token": grantValue, "big": strings.Repeat("x", 16<<10+1), "nl": "a\nb"}),
	} {
		if err := h.c.Create(h.ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ sandbox, secret, why string }{
		{"unlabelled", "unlabelled/token", "none labelled airlock.dev/grant=true"},
		{"missing", "nope/token", "none labelled airlock.dev/grant=true"},
		{"nokey", "labelled/other", `has no key "other"`},
		{"big", "labelled/big", "a daemon secret is at most 16384"},
		{"nl", "labelled/nl", "holds a control character"},
	} {
		h.create(grantSandbox(tc.sandbox, tc.secret))
		res := h.reconcile(tc.sandbox)
		s := h.get(tc.sandbox)
		c := cond(s, sandboxv1.SandboxConditionReady)
		if c.Status != metav1.ConditionFalse || c.Reason != ReasonGrantSecret || !strings.Contains(c.Message, tc.why) {
			t.Fatalf("%s: Ready %+v", tc.sandbox, c)
		}
		if res.RequeueAfter != grantRetry || s.Annotations["airlock.dev/node"] != "" {
			t.Fatalf("%s: requeue %v, annotations %v", tc.sandbox, res.RequeueAfter, s.Annotations)
		}
		noValue(t, h, tc.sandbox, lb)
	}
	if d.Creates != 0 {
		t.Fatalf("%d daemon sandboxes made", d.Creates)
	}
	for _, n := range []string{"unlabelled", "labelled"} {
		if _, _, ok := d.Secret("team-a", blueprint.DaemonSecretName(n, "token")); ok {
			t.Fatalf("secret %s was pushed", n)
		}
	}
}

// A labelled Secret's new value reaches every node holding a copy; an
// unchanged Secret is not pushed again; a Secret that loses its label (or
// is deleted) has its copies removed, so its grants fail closed.
func TestGrantSecretUpdateIsPushedAgain(t *testing.T) {
	d1 := daemontest.Start(t, "n1", api.Resources{CPUs: 0.25, MemoryBytes: 4 << 30})
	d2 := daemontest.Start(t, "n2", api.Resources{CPUs: 0.25, MemoryBytes: 4 << 30})
	h := start(t, d1, d2)
	lb := withGrantSecrets(h)
	sec := grantSecret("gh", true, map[string]string{"token": grantValue})
	if err := h.c.Create(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} { // one a node: each node gets a copy
		h.create(grantSandbox(n, "gh/token"))
		h.reconcile(n)
	}
	name := blueprint.DaemonSecretName("gh", "token")
	for _, d := range []*daemontest.Daemon{d1, d2} {
		if v, _, ok := d.Secret("team-a", name); !ok || v != grantValue {
			t.Fatalf("%s holds %q %v", d.Name, v, ok)
		}
	}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: "gh"}}
	if _, err := h.r.Grants.Reconcile(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, v, _ := d1.Secret("team-a", name); v != 1 {
		t.Fatalf("an unchanged Secret was pushed again (version %d)", v)
	}
	rotated := grantValue + "-rotated"
	sec.Data["token"] = []byte(rotated)
	if err := h.c.Update(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Grants.Reconcile(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*daemontest.Daemon{d1, d2} {
		if v, version, _ := d.Secret("team-a", name); v != rotated || version != 2 {
			t.Fatalf("%s holds %q v%d after the update", d.Name, v, version)
		}
	}
	sec.Labels = nil
	if err := h.c.Update(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Grants.Reconcile(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*daemontest.Daemon{d1, d2} {
		if _, _, ok := d.Secret("team-a", name); ok {
			t.Fatalf("%s keeps the copy of a Secret without the label", d.Name)
		}
	}
	if strings.Contains(lb.String(), rotated) || strings.Contains(lb.String(), grantValue) {
		t.Fatalf("a value is in the log:\n%s", lb)
	}
}

// serveSecret is the fake daemon's POST /v1/secrets, PUT and DELETE
// /v1/secrets/{name}; d.mu is held.
func (d *poolDaemon) serveSecret(w http.ResponseWriter, r *http.Request, tenant string) {
	if d.secrets == nil {
		d.secrets = map[string]string{}
	}
	if r.Method == "DELETE" {
		name := strings.TrimPrefix(r.URL.Path, "/v1/secrets/")
		if _, ok := d.secrets[tenant+"/"+name]; !ok {
			fakeAPIError(w, 404, api.CodeNotFound, "no secret "+name)
			return
		}
		delete(d.secrets, tenant+"/"+name)
		w.WriteHeader(204)
		return
	}
	var body api.AddSecret
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		fakeAPIError(w, 400, api.CodeInvalidArgument, err.Error())
		return
	}
	name, status := body.Name, 201
	if r.Method == "PUT" {
		name, status = strings.TrimPrefix(r.URL.Path, "/v1/secrets/"), 200
		if _, ok := d.secrets[tenant+"/"+name]; !ok {
			fakeAPIError(w, 404, api.CodeNotFound, "no secret "+name)
			return
		}
	} else if _, ok := d.secrets[tenant+"/"+name]; ok {
		fakeAPIError(w, 409, api.CodeAlreadyExists, "secret "+name+" exists")
		return
	}
	d.secrets[tenant+"/"+name] = body.Value
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(&api.Secret{Name: name, Version: 1})
}

func templateWithGrants() *extv1.SandboxTemplate {
	tmpl := airlockTemplate("t", "")
	tmpl.Spec.PodTemplate.ObjectMeta.Annotations = map[string]string{
		blueprint.AnnotationGrants: `[{"secret": "gh/token", "host": "api.github.com", "allow": ["GET /**"]}]`,
	}
	return tmpl
}

// A warm pool of a template with grants makes no daemon pool (a pooled
// sandbox cannot hold grants) and says so in an Event.
func TestWarmPoolOfATemplateWithGrantsHoldsNone(t *testing.T) {
	c, _ := countingClient(t, templateWithGrants(), testWarmPool("p", "t", 3))
	fn := newFakeNodeView(t, "a", "b")
	rec := events.NewFakeRecorder(10)
	r := &WarmPoolReconciler{Client: c, Nodes: fn, Classes: Classes{"airlock": true}, Events: rec}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: tns, Name: "p"}}); err != nil {
		t.Fatal(err)
	}
	for n, d := range fn.daemons {
		if len(d.poolOps) != 0 {
			t.Fatalf("node %s: pool calls %v", n, d.poolOps)
		}
	}
	var p extv1.SandboxWarmPool
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "p"}, &p); err != nil {
		t.Fatal(err)
	}
	if p.Status.Replicas != 0 || p.Status.ObservedGeneration != p.Generation {
		t.Fatalf("status %+v", p.Status)
	}
	select {
	case ev := <-rec.Events:
		if !strings.Contains(ev, "TemplateUnusable") || !strings.Contains(ev, "a pooled sandbox cannot hold grants") {
			t.Fatalf("event %q", ev)
		}
	default:
		t.Fatal("no event")
	}
}

// A claim of such a pool is made cold, its Secret pushed to the node first.
func TestClaimOfATemplateWithGrantsGoesColdWithItsSecret(t *testing.T) {
	sec := grantSecret("gh", true, map[string]string{"token": grantValue})
	sec.Namespace = tns
	c, _ := countingClient(t, templateWithGrants(), testWarmPool("p", "t", 3), claimOf("c1", "p"), sec)
	fn := newFakeNodeView(t, "a")
	r := &ClaimReconciler{Client: c, Scheme: controllerScheme(t), Nodes: fn, Classes: Classes{"airlock": true},
		Grants: &GrantSecrets{Reader: c, Tenants: fn, Log: logr.Discard()}}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: tns, Name: "c1"}}); err != nil {
		t.Fatal(err)
	}
	var sb sandboxv1.Sandbox
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: "c1"}, &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Labels[sandboxv1.SandboxLaunchTypeLabel] != "cold" {
		t.Fatalf("launch %q", sb.Labels[sandboxv1.SandboxLaunchTypeLabel])
	}
	d := fn.daemons["a"]
	if v := d.secrets[tns+"/"+blueprint.DaemonSecretName("gh", "token")]; v != grantValue {
		t.Fatalf("daemon secret %q", v)
	}
	if last := d.creates[len(d.creates)-1]; len(last.Grants) != 1 || last.Grants[0].Secret != blueprint.DaemonSecretName("gh", "token") {
		t.Fatalf("create grants %+v", last.Grants)
	}
	j, _ := json.Marshal([]any{sb, claimStatus(t, c, "c1")})
	if strings.Contains(string(j), grantValue) {
		t.Fatalf("the value shows: %s", j)
	}
}

func claimStatus(t *testing.T, c client.Client, name string) extv1.SandboxClaimStatus {
	var cl extv1.SandboxClaim
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: tns, Name: name}, &cl); err != nil {
		t.Fatal(err)
	}
	return cl.Status
}

// A claim whose template's grant names an unlabelled Secret is refused:
// no create, claim Ready=False GrantSecretUnavailable, tried again later.
func TestClaimWithAnUnlabelledGrantSecretIsRefused(t *testing.T) {
	sec := grantSecret("gh", false, map[string]string{"token": grantValue})
	sec.Namespace = tns
	c, _ := countingClient(t, templateWithGrants(), testWarmPool("p", "t", 3), claimOf("c1", "p"), sec)
	fn := newFakeNodeView(t, "a")
	r := &ClaimReconciler{Client: c, Scheme: controllerScheme(t), Nodes: fn, Classes: Classes{"airlock": true},
		Grants: &GrantSecrets{Reader: c, Tenants: fn, Log: logr.Discard()}}
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: tns, Name: "c1"}})
	if err != nil {
		t.Fatal(err)
	}
	st := claimStatus(t, c, "c1")
	rc := readyCond(st.Conditions)
	if rc == nil || rc.Status != metav1.ConditionFalse || rc.Reason != ReasonGrantSecret || res.RequeueAfter != grantRetry {
		t.Fatalf("Ready %+v, requeue %v", rc, res.RequeueAfter)
	}
	if d := fn.daemons["a"]; len(d.creates) != 0 || len(d.secrets) != 0 {
		t.Fatalf("creates %d, secrets %v", len(d.creates), d.secrets)
	}
	if j, _ := json.Marshal(st); strings.Contains(string(j), grantValue) {
		t.Fatalf("the value shows: %s", j)
	}
}

// A controller started afresh (no memory of its pushes) finds the copies
// the nodes hold when it first sees their Secret, and pushes the Secret's
// value changed meanwhile.
func TestGrantSecretChangedWhileTheControllerWasDownIsPushed(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	lb := withGrantSecrets(h)
	sec := grantSecret("gh", true, map[string]string{"token": grantValue})
	if err := h.c.Create(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	h.create(grantSandbox("box", "gh/token"))
	h.reconcile("box")
	rotated := grantValue + "-rotated"
	sec.Data["token"] = []byte(rotated)
	if err := h.c.Update(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	fresh := &GrantSecrets{Reader: h.c, Tenants: h.tr, Nodes: h.tr, Log: h.r.Grants.Log}
	if _, err := fresh.Reconcile(h.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: "gh"}}); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := d.Secret("team-a", blueprint.DaemonSecretName("gh", "token")); v != rotated {
		t.Fatalf("the node holds %q", v)
	}
	if strings.Contains(lb.String(), grantValue) {
		t.Fatalf("a value is in the log:\n%s", lb)
	}
}

// A Secret annotated airlock.dev/grant-hosts may be granted to those hosts
// only: a grant naming another is refused before anything is sent.
func TestGrantSecretHostsAreHeld(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	withGrantSecrets(h)
	sec := grantSecret("gh", true, map[string]string{"token": grantValue})
	sec.Annotations = map[string]string{blueprint.AnnotationGrantHosts: "github.com, api.github.com"}
	if err := h.c.Create(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	h.create(grantSandbox("ok", "gh/token")) // api.github.com
	h.create(sandbox("evil", "airlock", func(s *sandboxv1.Sandbox) {
		s.Spec.PodTemplate.ObjectMeta.Annotations = map[string]string{
			blueprint.AnnotationGrants: `[{"secret": "gh/token", "host": "api.github.com", "allow": ["GET /**"]},
				{"secret": "gh/token", "host": "collector.example", "allow": ["GET /**"]}]`,
		}
	}))
	h.reconcile("evil")
	c := cond(h.get("evil"), sandboxv1.SandboxConditionReady)
	if c.Reason != ReasonGrantSecret || !strings.Contains(c.Message, `not to "collector.example"`) {
		t.Fatalf("evil: Ready %+v", c)
	}
	if _, _, ok := d.Secret("team-a", blueprint.DaemonSecretName("gh", "token")); ok || d.Creates != 0 {
		t.Fatal("the value was sent for a host the Secret does not allow")
	}
	h.reconcile("ok")
	if c := cond(h.get("ok"), sandboxv1.SandboxConditionReady); c.Status != metav1.ConditionTrue {
		t.Fatalf("ok: Ready %+v", c)
	}
}

// A push that fails (the node down) leaves the node's older copy known:
// the Secret's later removal still removes it there.
func TestGrantSecretCopyIsRemovedAfterAFailedPush(t *testing.T) {
	d := daemontest.Start(t, "n1", api.Resources{CPUs: 2, MemoryBytes: 4 << 30})
	h := start(t, d)
	withGrantSecrets(h)
	sec := grantSecret("gh", true, map[string]string{"token": grantValue})
	if err := h.c.Create(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	h.create(grantSandbox("box", "gh/token"))
	h.reconcile("box")
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: "gh"}}
	sec.Data["token"] = []byte(grantValue + "-2")
	if err := h.c.Update(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	d.Down()
	if _, err := h.r.Grants.Reconcile(h.ctx, req); err == nil {
		t.Fatal("a push to a node that is down succeeded")
	}
	d.Up()
	if err := h.c.Delete(h.ctx, sec); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Grants.Reconcile(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	if v, _, ok := d.Secret("team-a", blueprint.DaemonSecretName("gh", "token")); ok {
		t.Fatalf("the node keeps the copy of a deleted Secret (%d bytes)", len(v))
	}
}
