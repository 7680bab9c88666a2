package sandbox

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// GET /v1/sandboxes/{id} of an id that is not live used to load every
// ended sandbox of the last day, of every tenant, with its spec and
// metadata (up to 256 KiB each), to find one: a tenant that makes and
// ends many sandboxes with large metadata had each such GET cost the
// daemon all of them in memory. One record is read, by its id.
func TestGetEndedReadsOneRecord(t *testing.T) {
	r := newTenantRig(t, nil, "")
	alice, _ := r.tenant(t, "alice")
	ctx := context.Background()
	meta := `{"k":"` + strings.Repeat("m", 256<<10) + `"}`
	now := time.Now()
	for i := 0; i < 100; i++ {
		if err := r.db.PutSandbox(ctx, store.Sandbox{ID: fmt.Sprintf("%012x", i), Tenant: alice.ID, TenantName: "alice", State: api.StateEnded,
			Spec: "{}", Metadata: meta, Trigger: "{}", Created: now, Expires: now, LastActive: now, Ended: now}); err != nil {
			t.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := r.svc.Get(ctx, alice, "ffffffffffff")
	runtime.ReadMemStats(&after)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an unknown id: %v", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
		t.Errorf("one GET of an unknown id allocated %d MiB (every ended record read)", n>>20)
	}
	sb, err := r.svc.Get(ctx, alice, fmt.Sprintf("%012x", 7))
	if err != nil || sb.ID != fmt.Sprintf("%012x", 7) {
		t.Fatalf("an ended sandbox of its own: %+v %v", sb, err)
	}
	bob, _ := r.tenant(t, "bob")
	if _, err := r.svc.Get(ctx, bob, fmt.Sprintf("%012x", 7)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's ended sandbox: %v, want not found", err)
	}
}
