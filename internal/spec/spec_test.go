package spec

import (
	"errors"
	"fmt"
	"math"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"1024": 1024, "1k": 1024, "512M": 512 << 20, "2G": 2 << 30, "1.5GiB": 3 << 29, "256mib": 256 << 20,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "G", "-1G", "1X", "1e400", "99999999999T", "1..2M"} {
		if _, err := ParseSize(in); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseSize(%q) err = %v, want invalid argument", in, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{256 << 20: "256MiB", 2 << 30: "2GiB", 100: "100B", 1536: "1.5KiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Default()
	ok.Command = []string{"true"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("default spec: %v", err)
	}
	cases := map[string]func(*Spec){
		"no command":          func(s *Spec) { s.Command = nil },
		"relative workspace":  func(s *Spec) { s.Workspace = "ws" },
		"unclean workspace":   func(s *Spec) { s.Workspace = "/a/../etc" },
		"repo without commit": func(s *Spec) { s.Repo = "/src" },
		"option as commit":    func(s *Spec) { s.Repo, s.Commit = "/src", "--upload-pack=x" },
		"both workspaces":     func(s *Spec) { s.Workspace, s.Repo, s.Commit = "/a", "/b", "HEAD" },
		"bad user":            func(s *Spec) { s.User = "admin" },
		"bad env":             func(s *Spec) { s.Env = []string{"1X=2"} },
		"env without =":       func(s *Spec) { s.Env = []string{"FOO"} },
		"duplicate env":       func(s *Spec) { s.Env = []string{"A=1", "A=2"} },
		"degrade seccomp":     func(s *Spec) { s.AllowDegraded = []string{"seccomp"} },
		"tiny memory":         func(s *Spec) { s.Limits.Memory = 1 },
		"zero cpus":           func(s *Spec) { s.Limits.CPUs = 0 },
		"few pids":            func(s *Spec) { s.Limits.Pids = 1 },
		"zero timeout":        func(s *Spec) { s.Timeout = 0 },
		"huge timeout":        func(s *Spec) { s.Timeout = 1000 * time.Hour },
		"relative oci":        func(s *Spec) { s.Image = "oci:rel/path" },
		"bad hostname":        func(s *Spec) { s.Hostname = "A_B" },
		// Regression: a relative path was taken for a registry reference
		// and looked up in DNS.
		"relative image path": func(s *Spec) { s.Image = "../../etc" },
		"upper-case repo":     func(s *Spec) { s.Image = "docker.io/Library/alpine" },
		// Regression (issue 12, item 14): 2^63-1 was accepted for every
		// size, and overflowed a tenant's quota sums.
		"max int64 memory":   func(s *Spec) { s.Limits.Memory = math.MaxInt64 },
		"max int64 disk":     func(s *Spec) { s.Limits.Disk = math.MaxInt64 },
		"max int64 egress":   func(s *Spec) { s.Net.EgressBytes = math.MaxInt64 },
		"negative egress":    func(s *Spec) { s.Net.EgressBytes = -1 },
		"too many conns":     func(s *Spec) { s.Net.MaxConns = math.MaxInt },
		"max int64 pids":     func(s *Spec) { s.Limits.Pids = math.MaxInt64 },
		"max uint64 nofile":  func(s *Spec) { s.Limits.NoFile = math.MaxUint64 },
		"infinite cpus":      func(s *Spec) { s.Limits.CPUs = math.Inf(1) },
		"NaN cpus":           func(s *Spec) { s.Limits.CPUs = math.NaN() },
		"max duration":       func(s *Spec) { s.Timeout = math.MaxInt64 },
		"long env name":      func(s *Spec) { s.Env = []string{strings.Repeat("A", MaxEnvName+1) + "=1"} },
		"NUL in env":         func(s *Spec) { s.Env = []string{"A=1\x002"} },
		"too many variables": func(s *Spec) { s.Env = manyEnv(MaxEnv + 1) },
		"too many host rules": func(s *Spec) {
			s.Net.Mode, s.Net.Allow, s.Net.Deny = "proxy", make([]string, MaxHostRules/2+1), make([]string, MaxHostRules/2)
			for i := range s.Net.Allow {
				s.Net.Allow[i] = fmt.Sprintf("h%d.example", i)
			}
			for i := range s.Net.Deny {
				s.Net.Deny[i] = fmt.Sprintf("d%d.example", i)
			}
		},
		"empty tag": func(s *Spec) { s.Image = "alpine:" },
	}
	for _, ref := range []string{"alpine", "alpine:3.20", "docker.io/library/alpine:3.20", "localhost:5000/a/b-c_d:v1.2", "ghcr.io/x/y@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"} {
		s := ok
		s.Command, s.Image = []string{"true"}, ref
		if err := s.Validate(); err != nil {
			t.Errorf("image %q: %v", ref, err)
		}
	}
	for name, mutate := range cases {
		s := ok
		s.Command = []string{"true"}
		mutate(&s)
		if err := s.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: Validate() = %v, want invalid argument", name, err)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1G", "512m", "1.5GiB", "", "-1", "1e9", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}

func manyEnv(n int) []string {
	env := make([]string, n)
	for i := range env {
		env[i] = fmt.Sprintf("V%d=x", i)
	}
	return env
}

// Every limit's ceiling and floor is enforced, at its edges too.
func TestLimitsAtTheirCeilings(t *testing.T) {
	s := Default()
	s.Command = []string{"true"}
	s.Limits = Limits{Memory: MaxMemory, Disk: MaxDisk, CPUs: MaxCPUs, Pids: MaxPids, NoFile: MaxNoFile}
	s.Net.EgressBytes, s.Net.MaxConns, s.Timeout = MaxEgressBytes, MaxMaxConns, MaxTimeout
	s.Env = append(manyEnv(MaxEnv-1), strings.Repeat("N", MaxEnvName)+"=v")
	if err := s.Validate(); err != nil {
		t.Fatalf("at the ceilings: %v", err)
	}
	for name, mutate := range map[string]func(*Spec){
		"memory": func(s *Spec) { s.Limits.Memory++ },
		"disk":   func(s *Spec) { s.Limits.Disk++ },
		"cpus":   func(s *Spec) { s.Limits.CPUs += 0.5 },
		"pids":   func(s *Spec) { s.Limits.Pids++ },
		"nofile": func(s *Spec) { s.Limits.NoFile++ },
		"egress": func(s *Spec) { s.Net.EgressBytes++ },
		"conns":  func(s *Spec) { s.Net.MaxConns++ },
		"ttl":    func(s *Spec) { s.Timeout++ },
	} {
		s2 := s
		mutate(&s2)
		err := s2.Validate()
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "between") {
			t.Errorf("%s past its ceiling: %v", name, err)
		}
	}
}

// Regression (issue 12, item 14): an API env map key "A=B" became the
// variable A. The name alone is checked wherever env enters.
func TestCheckEnvName(t *testing.T) {
	for _, k := range []string{"A", "_x", "PATH", "a1_B2", strings.Repeat("Z", MaxEnvName)} {
		if err := CheckEnvName(k); err != nil {
			t.Errorf("%q: %v", k, err)
		}
	}
	for _, k := range []string{"", "A=B", "=A", "A\x00", "1A", "A-B", "A B", "Ä", strings.Repeat("Z", MaxEnvName+1)} {
		if err := CheckEnvName(k); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want invalid argument", k, err)
		}
	}
}

func FuzzValidate(f *testing.F) {
	f.Add("host", "/ws", "A=1", "true", int64(1<<30), int64(1<<30), int64(1<<30), int64(512), 1.0)
	f.Add("oci:/x", "", "B", "", int64(0), int64(0), int64(-1), int64(0), -1.0)
	f.Add("host", "", "A=B=C", "x", int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), math.Inf(1))
	f.Fuzz(func(t *testing.T, image, ws, env, cmd string, mem, disk, egress, pids int64, cpus float64) {
		s := Default()
		s.Image, s.Workspace, s.Env, s.Command = image, ws, []string{env}, []string{cmd}
		s.Limits.Memory, s.Limits.Disk, s.Limits.Pids, s.Limits.CPUs, s.Net.EgressBytes = mem, disk, pids, cpus, egress
		err := s.Validate()
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Validate returned an unclassed error: %v", err)
			}
			return
		}
		// What passes is within what the host can mean.
		l := s.Limits
		if l.Memory < MinMemory || l.Memory > MaxMemory || l.Disk < MinDisk || l.Disk > MaxDisk || l.Pids > MaxPids ||
			!(l.CPUs > 0 && l.CPUs <= MaxCPUs) || s.Net.EgressBytes < 0 || s.Net.EgressBytes > MaxEgressBytes {
			t.Fatalf("accepted out-of-range limits %+v egress %d", l, s.Net.EgressBytes)
		}
		k, v, _ := strings.Cut(env, "=")
		if CheckEnvName(k) != nil || strings.IndexByte(v, 0) >= 0 {
			t.Fatalf("accepted env %q", env)
		}
	})
}

// FuzzRootOf: the root chosen for a path holds it by whole path
// components, however the path is spelled; an unclean path has none.
func FuzzRootOf(f *testing.F) {
	for _, s := range []string{"/srv/t/ws", "/srv/tx", "/srv/t/../../etc", "/srv/t", "/srv/t/", "/srv", "//srv/t/a", "/srv/t/./a", "/srv/t\x00/a"} {
		f.Add(s)
	}
	roots := []string{"/srv/t", "/srv/t/deep", "/data/u"}
	f.Fuzz(func(t *testing.T, p string) {
		r := RootOf(roots, p)
		if r == "" {
			return
		}
		if path.Clean(p) != p || !path.IsAbs(p) || strings.ContainsRune(p, 0) {
			t.Fatalf("%q: unclean, yet under %s", p, r)
		}
		rel, err := filepath.Rel(r, p)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("%q is not below %s (%q)", p, r, rel)
		}
		for _, o := range roots {
			if len(o) > len(r) && Within(o, p) {
				t.Fatalf("%q: %s chosen over the nearer %s", p, r, o)
			}
		}
	})
}

// A long-lived sandbox's commands get less than the sandbox, so that they
// meet their own limit first, and never nothing.
func TestCommandLimitsLeaveAReserve(t *testing.T) {
	for _, c := range []struct {
		mem, pids         int64
		wantMem, wantPids int64
	}{
		{MinMemory, 8, 8 << 20, 4},
		{64 << 20, 64, 48 << 20, 32},
		{2 << 30, 1024, 2<<30 - 128<<20, 992},
		{MaxMemory, MaxPids, MaxMemory - 128<<20, MaxPids - 32},
	} {
		mem, pids := Limits{Memory: c.mem, Pids: c.pids}.CommandLimits()
		if mem != c.wantMem || pids != c.wantPids || mem <= 0 || pids <= 0 || mem >= c.mem || pids >= c.pids {
			t.Errorf("limits %d/%d: commands get %d/%d, want %d/%d", c.mem, c.pids, mem, pids, c.wantMem, c.wantPids)
		}
	}
}

// A tenant held to a wall gets it or a stronger one, never less; no hold
// (or "container") allows every wall.
func TestHeldToRefusesLessThanTheHold(t *testing.T) {
	for _, c := range []struct {
		asked, held string
		ok          bool
	}{
		{"", "", true}, {"container", "", true}, {"gvisor", "", true}, {"container", "container", true},
		{"gvisor", "gvisor", true}, {"container", "gvisor", false}, {"", "gvisor", false},
	} {
		err := HeldTo(c.asked, c.held)
		if (err == nil) != c.ok || !c.ok && (!errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "held to --isolation gvisor")) {
			t.Errorf("asked %q, held %q: %v", c.asked, c.held, err)
		}
	}
	if ValidHold("vm") == nil || ValidHold("gvisor") != nil || ValidHold("") != nil {
		t.Error("ValidHold")
	}
}
