package host

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

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
