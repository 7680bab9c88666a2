package spec

import (
	"errors"
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
		"empty tag":           func(s *Spec) { s.Image = "alpine:" },
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

func FuzzValidate(f *testing.F) {
	f.Add("host", "/ws", "A=1", "true", int64(1<<30), 1.0)
	f.Add("oci:/x", "", "B", "", int64(0), -1.0)
	f.Fuzz(func(t *testing.T, image, ws, env, cmd string, mem int64, cpus float64) {
		s := Default()
		s.Image, s.Workspace, s.Env, s.Command = image, ws, []string{env}, []string{cmd}
		s.Limits.Memory, s.Limits.CPUs = mem, cpus
		if err := s.Validate(); err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("Validate returned an unclassed error: %v", err)
		}
	})
}
