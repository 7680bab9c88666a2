package core

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// A sandbox's TTL: the default, and the most a create or an extend asks.
const (
	DefaultTTL = time.Hour
	MaxTTL     = 7 * 24 * time.Hour
)

// ParseDuration reads a request's duration field: def when empty, at most
// max (0: no bound).
func ParseDuration(field, s string, def, max time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || (max > 0 && d > max) {
		return 0, errdefs.Invalid(fmt.Sprintf("%s %q: want a duration such as 30m, at most %v", field, s, max))
	}
	return d, nil
}

// SpecOf turns a create request into a validated spec.
func SpecOf(req *api.CreateSandbox) (spec.Spec, time.Duration, time.Duration, error) {
	s := spec.Default()
	if req.Image != "" {
		s.Image = req.Image
	}
	if req.Isolation != "" {
		s.Isolation = req.Isolation
	}
	s.WritableRootfs = req.WritableRootfs
	s.Workspace, s.Repo, s.Commit = req.Workspace, req.Repo, req.Commit
	if s.Repo != "" && s.Commit == "" {
		s.Commit = "HEAD"
	}
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		// Checked before joining: a name "A=B" would pass as A.
		if err := spec.CheckEnvName(k); err != nil {
			return s, 0, 0, err
		}
		s.Env = append(s.Env, k+"="+req.Env[k])
	}
	s.Hostname = req.Hostname
	s.AllowDegraded = req.AllowDegraded
	l := req.Limits
	if l.MemoryBytes != 0 {
		s.Limits.Memory = l.MemoryBytes
	}
	if l.DiskBytes != 0 {
		s.Limits.Disk = l.DiskBytes
	}
	if l.CPUs != 0 {
		s.Limits.CPUs = l.CPUs
	}
	if l.Pids != 0 {
		s.Limits.Pids = l.Pids
	}
	n := req.Network
	s.Net.Mode, s.Net.Allow, s.Net.Deny = n.Mode, n.Allow, n.Deny
	if n.EgressBytes != 0 {
		s.Net.EgressBytes = n.EgressBytes
	}
	if n.MaxConns != 0 {
		s.Net.MaxConns = n.MaxConns
	}
	ttl, err := ParseDuration("ttl", req.TTL, DefaultTTL, MaxTTL)
	if err != nil {
		return s, 0, 0, err
	}
	if ttl == 0 {
		return s, 0, 0, errdefs.Invalid("ttl must be positive")
	}
	idle, err := ParseDuration("idle_timeout", req.IdleTimeout, 0, MaxTTL)
	if err != nil {
		return s, 0, 0, err
	}
	s.Timeout = ttl
	switch req.OnTTL {
	case "", "end":
	case "pause":
		s.OnTTL = "pause"
	default:
		return s, 0, 0, errdefs.Invalid(fmt.Sprintf("on_ttl %q: end or pause", req.OnTTL))
	}
	if len(req.Metadata) > 64 {
		return s, 0, 0, errdefs.Invalid("metadata: at most 64 keys")
	}
	for k, v := range req.Metadata {
		if len(k) == 0 || len(k) > 128 || len(v) > 4096 {
			return s, 0, 0, errdefs.Invalid("metadata: keys of 1–128 bytes, values up to 4096")
		}
	}
	if len(req.Trigger.Inputs) > 256 || len(req.Trigger.TaskID) > 256 || len(req.Trigger.PromptDigest) > 256 {
		return s, 0, 0, errdefs.Invalid("trigger: task_id and prompt_digest up to 256 bytes, at most 256 inputs")
	}
	for i, g := range req.Grants {
		gttl, err := ParseDuration(fmt.Sprintf("grant %d: ttl", i+1), g.TTL, 0, MaxTTL)
		if err != nil {
			return s, 0, 0, err
		}
		s.Grants = append(s.Grants, spec.Grant{Secret: g.Secret, Env: g.Env, Host: g.Host, Port: g.Port, Header: g.Header,
			Scheme: g.Scheme, Username: g.Username, Allow: g.Allow, TTL: gttl})
	}
	return s, ttl, idle, s.ValidateLongLived()
}
