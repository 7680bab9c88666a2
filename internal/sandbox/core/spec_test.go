package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func decodeCreate(b []byte) (*api.CreateSandbox, error) {
	var req api.CreateSandbox
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return &req, dec.Decode(&req)
}

func TestSpecOf(t *testing.T) {
	sp, ttl, idle, err := SpecOf(&api.CreateSandbox{Env: map[string]string{"B": "2", "A": "1"}, TTL: "2h", IdleTimeout: "5m", Repo: "/src"})
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
		if _, _, _, err := SpecOf(req); !errors.Is(err, errdefs.ErrInvalidArgument) {
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
		sp, ttl, idle, err := SpecOf(req)
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
