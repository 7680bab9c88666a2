package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// A fork's count is from 1 to api.MaxForks; any other is refused before
// anything is saved or made.
func TestForkCountIsBounded(t *testing.T) {
	r := newLifeRig(t)
	r.be.snap = &lifecycle.SnapshotFiles{ID: "0123456789abcdef01234567", Base: "host"}
	p := r.tenant(t, "acme", api.Quotas{}, false)
	src := r.create(t, p, &api.CreateSandbox{TTL: "10m"})
	for _, n := range []int{-1, 0, api.MaxForks + 1, 1 << 30} {
		if _, err := r.svc.Fork(context.Background(), p, src.ID, &api.CreateFork{Count: n}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("count %d: %v", n, err)
		}
	}
	if n := r.be.count(); n != 1 {
		t.Errorf("the host made %d sandboxes, want only the source", n)
	}
	for _, n := range []int{1, api.MaxForks} {
		if err := forkCount(n); err != nil {
			t.Errorf("count %d: %v", n, err)
		}
	}
}

// A fork past the tenant's quotas is refused whole before the source is
// saved: no copy, no checkpoint; one that fits is made whole, each copy
// with the source's expiry and a spec on the fork's files.
func TestForkIsAdmittedWhole(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{MaxSandboxes: 3}, false)
	src := r.create(t, p, &api.CreateSandbox{TTL: "10m", Metadata: map[string]string{"k": "v"}})
	// No snapshot can be saved yet: a refusal that reached the save would
	// say so, not "quota".
	_, err := r.svc.Fork(ctx, p, src.ID, &api.CreateFork{Count: 3})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "asks 3 more") {
		t.Fatalf("fork past max_sandboxes: %v", err)
	}
	if n := r.be.count(); n != 1 {
		t.Errorf("the host made %d sandboxes after the refusal, want only the source", n)
	}
	r.be.snap = &lifecycle.SnapshotFiles{ID: "0123456789abcdef01234567", Base: "host", Bytes: 10}
	r.be.sandbox(t, src.ID).snap = r.be.snap
	f, err := r.svc.Fork(ctx, p, src.ID, &api.CreateFork{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Sandboxes) != 2 || f.Memory || f.Source != src.ID || len(f.CreateMillis) != 2 {
		t.Fatalf("fork: %+v", f)
	}
	var ids []string
	for _, sb := range f.Sandboxes {
		ids = append(ids, sb.ID)
		if !r.live(sb.ID) || sb.ID == src.ID || !sb.Expires.Equal(src.Expires) || sb.Metadata["k"] != "v" {
			t.Errorf("copy %+v", sb)
		}
		r.svc.Mu.Lock()
		sp := r.svc.Boxes[sb.ID].Spec
		r.svc.Mu.Unlock()
		if sp.Fork != r.be.snap.ID || sp.Workspace != "/snap/"+r.be.snap.ID+"/workspace" || sp.Restore != "" {
			t.Errorf("copy's spec: fork %q workspace %q restore %q", sp.Fork, sp.Workspace, sp.Restore)
		}
	}
	if ids[0] == ids[1] {
		t.Errorf("copies share an id: %v", ids)
	}
	fr := r.records(src.ID, "sandbox.forked")
	if len(fr) != 1 || fr[0]["memory"] != false || fr[0]["content"] != r.be.snap.ID {
		t.Fatalf("sandbox.forked records: %v", fr)
	}
	if got := fr[0]["sandboxes"].([]any); len(got) != 2 || got[0] != ids[0] || got[1] != ids[1] {
		t.Errorf("the record names %v, want %v", got, ids)
	}
	// The files stay while a copy runs from them, and go with the last.
	if err := r.svc.Destroy(ctx, p, ids[0]); err != nil {
		t.Fatal(err)
	}
	if len(r.be.removed) != 0 {
		t.Errorf("files removed while a copy runs from them: %v", r.be.removed)
	}
	if err := r.svc.Destroy(ctx, p, ids[1]); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.be.removed, []string{r.be.snap.ID}) {
		t.Errorf("files removed after the last copy: %v", r.be.removed)
	}
}

// A fork whose copies cannot all be made makes none: those made are
// destroyed, said so, and the fork's files are removed.
func TestForkIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	r := newLifeRig(t)
	p := r.tenant(t, "acme", api.Quotas{}, false)
	src := r.create(t, p, &api.CreateSandbox{TTL: "10m"})
	r.be.snap = &lifecycle.SnapshotFiles{ID: "0123456789abcdef01234567", Base: "host"}
	r.be.sandbox(t, src.ID).snap = r.be.snap
	r.be.failCreate = func(n int) bool { return n == 3 } // the source was 1
	_, err := r.svc.Fork(ctx, p, src.ID, &api.CreateFork{Count: 3})
	if err == nil || !strings.Contains(err.Error(), "1 of 3 copies could not be made, none is kept") {
		t.Fatalf("fork with a failing copy: %v", err)
	}
	r.be.mu.Lock()
	var made []string
	for id := range r.be.made {
		if id != src.ID {
			made = append(made, id)
		}
	}
	r.be.mu.Unlock()
	if len(made) != 2 {
		t.Fatalf("the host made %d copies, want 2 (one failed)", len(made))
	}
	for _, id := range made {
		r.wantEnded(t, id, "fork undone: another copy could not be made")
	}
	if got := r.svc.List(ctx, p); len(got) != 1 || got[0].ID != src.ID {
		t.Errorf("live after the failed fork: %+v", got)
	}
	if len(r.records(src.ID, "sandbox.forked")) != 0 {
		t.Error("a failed fork was recorded as made")
	}
	if !slices.Equal(r.be.removed, []string{r.be.snap.ID}) {
		t.Errorf("files removed after the failed fork: %v", r.be.removed)
	}
}

// A copy's spec carries none of the source's grant placeholders (its
// own are minted at its create), and a gvisor copy is restored from the
// fork's memory.
func TestForkSpec(t *testing.T) {
	src := spec.Spec{Isolation: "gvisor", Image: "oci:x", Repo: "r", Env: []string{"A=1", "GH=tok-src"}, Grants: []spec.Grant{{Env: "GH", Token: "tok-src"}}}
	files := &lifecycle.SnapshotFiles{ID: "c0ffee", Base: "oci:x"}
	sp := forkSpec(src, files, "/snap/c0ffee/root", "/snap/c0ffee/workspace", true)
	if !slices.Equal(sp.Env, []string{"A=1"}) || sp.Grants[0].Token != "" || src.Grants[0].Token != "tok-src" || !slices.Equal(src.Env, []string{"A=1", "GH=tok-src"}) {
		t.Errorf("env %v grants %+v (source's: %v %+v)", sp.Env, sp.Grants, src.Env, src.Grants)
	}
	if sp.Image != "/snap/c0ffee/root" || sp.Workspace != "/snap/c0ffee/workspace" || sp.Repo != "" || sp.Restore != "c0ffee" || sp.Fork != "c0ffee" {
		t.Errorf("spec %+v", sp)
	}
}
