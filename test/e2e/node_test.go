package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// A daemon held to two sandboxes makes two of five concurrent creates
// and refuses the rest (node capacity, across tenants); GET /v1/node
// reports what they hold; the event stream says hello, then their
// creation and ends, and beats; a tenant's key reads neither; the audit
// head the node reports anchors `airlock audit verify`, and a wrong one
// fails it.
func TestNodeCapacityAndEvents(t *testing.T) {
	data := newDataDir(t)
	d := startDaemon(t, data, "--node-name", "e2e-node", "--capacity-sandboxes", "2")
	ctx := context.Background()
	alice, bob := d.tenant(t, "alice", api.Quotas{}), d.tenant(t, "bob", api.Quotas{})
	if _, err := alice.Node(ctx); code(err) != api.CodePermissionDenied {
		t.Errorf("GET /v1/node with a tenant's key: %v", err)
	}
	if _, err := alice.NodeEvents(ctx, 0); code(err) != api.CodePermissionDenied {
		t.Errorf("GET /v1/node/events with a tenant's key: %v", err)
	}
	if _, err := d.admin.NodeEvents(ctx, 10*time.Millisecond); code(err) != api.CodeInvalidArgument {
		t.Errorf("a 10ms heartbeat: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // a bound against a hang only
	defer cancel()
	es, err := d.admin.NodeEvents(sctx, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	hello, err := es.Next()
	if err != nil {
		t.Fatal(err)
	}
	if n := hello.Node; hello.Type != api.NodeEventHello || n == nil || n.Name != "e2e-node" || n.Capacity.Sandboxes != 2 || n.Allocated != (api.Resources{}) ||
		len(n.BootID) != 32 || n.AuditHead == nil || n.Rev != hello.Rev || !strings.Contains(strings.Join(n.Isolations, ","), "container") {
		t.Fatalf("hello %+v, node %+v", hello, hello.Node)
	}

	// Five at once, of two tenants: two are made, three refused.
	small := api.Limits{CPUs: 0.25, MemoryBytes: 256 << 20}
	var mu sync.Mutex
	var made []string
	var refused []error
	var wg sync.WaitGroup
	for i := range 5 {
		c := alice
		if i%2 == 1 {
			c = bob
		}
		wg.Go(func() {
			sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Limits: small, Metadata: map[string]string{"n": fmt.Sprint(i)}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused = append(refused, err)
				return
			}
			made = append(made, sb.ID)
		})
	}
	wg.Wait()
	if len(made) != 2 || len(refused) != 3 {
		t.Fatalf("five concurrent creates on a node of two: %d made, refused %v", len(made), refused)
	}
	for _, err := range refused {
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeQuotaExceeded || !strings.HasPrefix(ae.Message, "node capacity: sandboxes:") {
			t.Errorf("a create past the node's capacity: %v", err)
		}
	}
	n, err := d.admin.Node(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Allocated != (api.Resources{CPUs: 0.5, MemoryBytes: 512 << 20, Sandboxes: 2}) || n.BootID != hello.Node.BootID {
		t.Errorf("the node with two sandboxes: %+v", n)
	}

	// Their creation, and the end of one, come through the stream.
	ended := made[0]
	if err := d.admin.Destroy(ctx, ended); err != nil {
		t.Fatal(err)
	}
	rev := hello.Rev
	created := map[string]bool{}
	var endReason string
	beats := 0
	for len(created) < 2 || endReason == "" || beats == 0 {
		ev, err := es.Next()
		if err != nil {
			t.Fatalf("the node's events: %v (created %v, ended %q)", err, created, endReason)
		}
		if ev.Rev <= rev {
			t.Errorf("%s at rev %d after rev %d", ev.Type, ev.Rev, rev)
		}
		rev = ev.Rev
		switch ev.Type {
		case api.NodeEventSandboxCreated:
			if ev.Sandbox.Tenant != "alice" && ev.Sandbox.Tenant != "bob" || ev.Sandbox.Metadata["n"] == "" {
				t.Errorf("sandbox.created %+v", ev.Sandbox)
			}
			created[ev.Sandbox.ID] = true
		case api.NodeEventSandboxEnded:
			if ev.Sandbox.ID != ended || ev.Sandbox.State != api.StateEnded {
				t.Errorf("sandbox.ended %+v", ev.Sandbox)
			}
			endReason = ev.Sandbox.EndReason
		case api.NodeEventHeartbeat:
			beats++
		}
	}
	if !created[made[0]] || !created[made[1]] || endReason != "destroyed by request" {
		t.Errorf("created %v, want %v; ended for %q", created, made, endReason)
	}
	// The place freed is taken again.
	if _, err := bob.CreateSandbox(ctx, &api.CreateSandbox{Limits: small}); err != nil {
		t.Errorf("a create once a place is free: %v", err)
	}

	// The head reported anchors the log; another hash, or a record past
	// its end, does not.
	n, err = d.admin.Node(ctx)
	if err != nil || n.AuditHead == nil {
		t.Fatalf("node %+v, %v", n, err)
	}
	verify := func(anchor string) result {
		t.Helper()
		cmd := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", data, "audit", "verify", "--anchor", anchor)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		r := result{stdout: out.String(), stderr: errb.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := verify(fmt.Sprintf("%d:%s", n.AuditHead.Seq, n.AuditHead.Hash)); r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("anchor seq %d holds", n.AuditHead.Seq)) {
		t.Errorf("verify against the node's head: %v", r)
	}
	other := strings.Repeat("0", 64)
	for _, anchor := range []string{fmt.Sprintf("%d:%s", n.AuditHead.Seq, other), fmt.Sprintf("%d:%s", n.AuditHead.Seq+1000000, n.AuditHead.Hash)} {
		if r := verify(anchor); r.code != 1 || !strings.Contains(r.stdout, "BAD:") || !strings.Contains(r.stdout, "anchor") {
			t.Errorf("verify --anchor %s: %v", anchor, r)
		}
	}
	if r := verify("12:nothex"); r.code == 0 || !strings.Contains(r.stderr, "--anchor") {
		t.Errorf("a malformed anchor: %v", r)
	}
}
