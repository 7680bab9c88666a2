package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
)

func decodeCreate(b []byte) (*api.CreateSandbox, error) {
	var req api.CreateSandbox
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return &req, dec.Decode(&req)
}

func TestSpecOf(t *testing.T) {
	sp, ttl, idle, err := specOf(&api.CreateSandbox{Env: map[string]string{"B": "2", "A": "1"}, TTL: "2h", IdleTimeout: "5m", Repo: "/src"})
	if err != nil {
		t.Fatal(err)
	}
	if ttl != 2*time.Hour || idle != 5*time.Minute || sp.Timeout != ttl || sp.Commit != "HEAD" {
		t.Errorf("ttl %v idle %v spec %+v", ttl, idle, sp)
	}
	if len(sp.Env) != 2 || sp.Env[0] != "A=1" {
		t.Errorf("env not in a stable order: %v", sp.Env)
	}
	for name, req := range map[string]*api.CreateSandbox{
		"zero ttl":        {TTL: "0s"},
		"ttl past max":    {TTL: "200h"},
		"negative idle":   {IdleTimeout: "-1s"},
		"bad env key":     {Env: map[string]string{"1A": "x"}},
		"relative ws":     {Workspace: "ws"},
		"tiny memory":     {Limits: api.Limits{MemoryBytes: 1}},
		"bad net mode":    {Network: api.Network{Mode: "open"}},
		"huge metadata":   {Metadata: map[string]string{"k": string(make([]byte, 5000))}},
		"degrade seccomp": {AllowDegraded: []string{"seccomp"}},
		// Regression (issue 12, item 14): the key "A=B" became "A=B=x",
		// read as the variable A; sizes of 2^63-1 were accepted.
		"= in env key":      {Env: map[string]string{"A=B": "x"}},
		"NUL in env key":    {Env: map[string]string{"A\x00B": "x"}},
		"empty env key":     {Env: map[string]string{"": "x"}},
		"max int64 memory":  {Limits: api.Limits{MemoryBytes: math.MaxInt64}},
		"max int64 disk":    {Limits: api.Limits{DiskBytes: math.MaxInt64}},
		"max int64 pids":    {Limits: api.Limits{Pids: math.MaxInt64}},
		"huge cpus":         {Limits: api.Limits{CPUs: 1e300}},
		"max int64 egress":  {Network: api.Network{EgressBytes: math.MaxInt64}},
		"max int conns":     {Network: api.Network{MaxConns: math.MaxInt}},
		"max duration ttl":  {TTL: "2562047h"},
		"max duration idle": {IdleTimeout: "2562047h"},
	} {
		if _, _, _, err := specOf(req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
}

// FuzzSpecOf: whatever JSON a client sends, a create request either fails
// as invalid or yields a spec that is valid for a long-lived sandbox with a
// TTL inside its bounds.
func FuzzSpecOf(f *testing.F) {
	for _, s := range []string{`{}`, `{"ttl":"1h","idle_timeout":"5m"}`, `{"image":"oci:/x","limits":{"memory_bytes":1048576000,"cpus":0.5}}`,
		`{"network":{"mode":"proxy","allow":["pypi","*.example.com:443"]}}`, `{"env":{"A":"b"},"metadata":{"k":"v"}}`, `{"repo":"/r","commit":"main"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodeCreate(b)
		if err != nil {
			return
		}
		sp, ttl, idle, err := specOf(req)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("unclassed error: %v", err)
			}
			return
		}
		if err := sp.ValidateLongLived(); err != nil {
			t.Fatalf("accepted an invalid spec: %v", err)
		}
		if ttl <= 0 || ttl > MaxTTL || idle < 0 || sp.Timeout != ttl {
			t.Fatalf("ttl %v idle %v", ttl, idle)
		}
	})
}

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
	s := New(Config{MaxBackground: 2, MaxBackgroundPerTenant: 3})
	a1, a2, b1 := &box{rec: store.Sandbox{ID: "a1", Tenant: "t-a", TenantName: "a"}}, &box{rec: store.Sandbox{ID: "a2", Tenant: "t-a", TenantName: "a"}}, &box{rec: store.Sandbox{ID: "b1", Tenant: "t-b", TenantName: "b"}}
	var releases []func()
	take := func(b *box) error {
		r, err := s.takeBackground(b)
		if err == nil {
			releases = append(releases, r)
		}
		return err
	}
	for _, b := range []*box{a1, a1, a2} {
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
