package execs

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Regression (issue 12, item 14): an exec's env names were not checked
// by the daemon.
func TestCheckEnv(t *testing.T) {
	if err := checkEnv(map[string]string{"A": "1", "B_2": ""}); err != nil {
		t.Fatal(err)
	}
	many := map[string]string{}
	for i := 0; i <= spec.MaxEnv; i++ {
		many[fmt.Sprintf("V%d", i)] = ""
	}
	for name, env := range map[string]map[string]string{
		"= in name": {"A=B": "x"}, "NUL in name": {"A\x00": "x"}, "empty name": {"": "x"},
		"NUL in value": {"A": "x\x00y"}, "too many": many,
	} {
		if err := checkEnv(env); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
}

// Regression (issue 12, item 14): every background command holds a
// stream of the daemon's, and nothing capped them. Past a sandbox's or a
// tenant's cap a background exec is resource_exhausted; an ended one
// gives its place back.
func TestBackgroundExecsAreCapped(t *testing.T) {
	s := New(core.New(core.Config{MaxBackground: 2, MaxBackgroundPerTenant: 3}))
	a1, a2, b1 := &core.Box{Rec: store.Sandbox{ID: "a1", Tenant: "t-a", TenantName: "a"}}, &core.Box{Rec: store.Sandbox{ID: "a2", Tenant: "t-a", TenantName: "a"}}, &core.Box{Rec: store.Sandbox{ID: "b1", Tenant: "t-b", TenantName: "b"}}
	var releases []func()
	take := func(b *core.Box) error {
		r, err := s.takeBackground(b)
		if err == nil {
			releases = append(releases, r)
		}
		return err
	}
	for _, b := range []*core.Box{a1, a1, a2} {
		if err := take(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := take(a1); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "sandbox a1") {
		t.Errorf("past the sandbox's cap: %v", err)
	}
	if err := take(a2); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "tenant a") {
		t.Errorf("past the tenant's cap: %v", err)
	}
	if err := take(b1); err != nil {
		t.Errorf("another tenant: %v", err)
	}
	releases[0]()
	releases[0]() // twice is once
	if err := take(a2); err != nil {
		t.Errorf("after one ended: %v", err)
	}
	if err := take(a2); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("one release counted twice: %v", err)
	}
}
