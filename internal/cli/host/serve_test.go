package host

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestServeConfigFileIsStrict(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	_ = os.WriteFile(good, []byte("socket: /run/x.sock\nlog_level: debug\nimage_cache_size: 5G\negress_allow_net: [10.20.0.0/16]\nmax_background_execs: 8\nmax_background_execs_per_tenant: 32\nregistries: [ghcr.io, \"registry.internal:5000\"]\ndefault_isolation: gvisor\ne2b_listen: 127.0.0.1:3000\ne2b_template: [base=host, py=snapshot:abc]\ne2b_allow_internet: [pypi.org]\n"), 0o600)
	f, err := loadServeFile(good)
	if err != nil || f.Socket != "/run/x.sock" || f.LogLevel != "debug" || f.ImageCacheSize != "5G" || len(f.EgressAllowNet) != 1 ||
		f.MaxBackgroundExecs != 8 || f.MaxBackgroundExecsPerTenant != 32 || len(f.Registries) != 2 || f.Registries[1] != "registry.internal:5000" || f.DefaultIsolation != "gvisor" ||
		f.E2BListen != "127.0.0.1:3000" || len(f.E2BTemplates) != 2 || len(f.E2BAllowInternet) != 1 {
		t.Fatalf("good config: %+v %v", f, err)
	}
	for name, body := range map[string]string{
		"unknown key": "sockett: /run/x.sock\n",
		"wrong type":  "socket: [a, b]\n",
		"not yaml":    "socket: \"unterminated\n",
	} {
		p := filepath.Join(dir, "bad.yaml")
		_ = os.WriteFile(p, []byte(body), 0o600)
		if _, err := loadServeFile(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	if _, err := loadServeFile(filepath.Join(dir, "missing.yaml")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("missing file: %v", err)
	}
}

func TestParseAllowNets(t *testing.T) {
	got, err := parseAllowNets([]string{"10.20.1.2/16", "2001:db8::/32"})
	if err != nil || len(got) != 2 || got[0].String() != "10.20.0.0/16" || got[1].String() != "2001:db8::/32" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"10.20.0.0", "example.com/8", "10.0.0.0/33", ""} {
		if _, err := parseAllowNets([]string{bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want invalid argument", bad, err)
		}
	}
}

func TestE2BTemplatesAreNameImagePairs(t *testing.T) {
	m, err := parseTemplates([]string{"base=host", "py=snapshot:abc=1"})
	if err != nil || m["base"] != "host" || m["py"] != "snapshot:abc=1" || len(m) != 2 {
		t.Fatalf("parseTemplates: %v %v", m, err)
	}
	for _, bad := range []string{"base", "=host", "base="} {
		if _, err := parseTemplates([]string{bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want invalid argument", bad, err)
		}
	}
}

// The node's capacity given (by flag, or by the config file's keys,
// which a flag given wins over) is held; the CPUs and memory not given
// are the host's, reported only; nonsense is refused.
func TestNodeCapacityFlags(t *testing.T) {
	for _, c := range []struct {
		args    []string
		file    serveFile
		held    api.Resources
		name    string
		refused bool
	}{
		{args: nil, held: api.Resources{}},
		{args: []string{"--node-name", "a", "--capacity-cpus", "2", "--capacity-memory", "1GiB", "--capacity-sandboxes", "3"}, name: "a", held: api.Resources{CPUs: 2, MemoryBytes: 1 << 30, Sandboxes: 3}},
		{args: []string{"--capacity-cpus", "4"}, file: serveFile{NodeName: "b", CapacityCPUs: 1, CapacityMemory: "512MiB", CapacitySandboxes: 5}, name: "b", held: api.Resources{CPUs: 4, MemoryBytes: 512 << 20, Sandboxes: 5}},
		{args: []string{"--capacity-cpus", "-1"}, refused: true},
		{args: []string{"--capacity-memory", "lots"}, refused: true},
		{args: []string{"--capacity-sandboxes", "-2"}, refused: true},
	} {
		var n nodeFlags
		cmd := &cobra.Command{}
		n.add(cmd)
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		nc, err := n.config(cmd, &c.file)
		if c.refused {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%v: %v, want invalid_argument", c.args, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if nc.Held != c.held {
			t.Errorf("%v: held %+v, want %+v", c.args, nc.Held, c.held)
		}
		if host, _ := os.Hostname(); c.name == "" && nc.Name != host || c.name != "" && nc.Name != c.name {
			t.Errorf("%v: name %q", c.args, nc.Name)
		}
		if nc.Capacity.Sandboxes != c.held.Sandboxes || nc.Capacity.CPUs <= 0 || nc.Capacity.MemoryBytes <= 0 ||
			c.held.CPUs != 0 && nc.Capacity.CPUs != c.held.CPUs || c.held.MemoryBytes != 0 && nc.Capacity.MemoryBytes != c.held.MemoryBytes {
			t.Errorf("%v: capacity %+v, held %+v", c.args, nc.Capacity, c.held)
		}
	}
}
