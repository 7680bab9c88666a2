package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The daemon's default wall (serve --default-isolation) is the wall of a
// create that names none, and only that: a create naming a wall gets it,
// and a tenant's hold is judged on the wall the create ends up with.
func TestDefaultIsolationIsOnlyADefault(t *testing.T) {
	for _, tc := range []struct {
		name             string
		def, held, asked string
		want             string // the sandbox's wall; "" refused
	}{
		{"no default, none asked", "", "", "", "container"},
		{"default gvisor, none asked", "gvisor", "", "", "gvisor"},
		{"default gvisor, container asked", "gvisor", "", "container", "container"},
		{"default container, gvisor asked", "container", "", "gvisor", "gvisor"},
		{"default gvisor meets a gvisor hold", "gvisor", "gvisor", "", "gvisor"},
		{"no default, a gvisor hold", "", "gvisor", "", ""},
		{"default gvisor, container asked against a gvisor hold", "gvisor", "gvisor", "container", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLifeRig(t)
			r.svc.Cfg.DefaultIsolation = tc.def
			p := r.tenant(t, "acme", api.Quotas{}, false)
			p.Isolation = tc.held
			sb, err := r.svc.Create(context.Background(), p, &api.CreateSandbox{Isolation: tc.asked})
			if tc.want == "" {
				if !errors.Is(err, errdefs.ErrPermissionDenied) || r.be.count() != 0 {
					t.Fatalf("want a refusal and no sandbox: %+v %v", sb, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.svc.Get(context.Background(), p, sb.ID)
			if err != nil || sb.Isolation != tc.want || got.Isolation != tc.want {
				t.Errorf("created on %q, described as %+v (%v); want %q", sb.Isolation, got, err, tc.want)
			}
		})
	}
}
