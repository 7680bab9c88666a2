package cli

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
	_ = os.WriteFile(good, []byte("socket: /run/x.sock\nlog_level: debug\nimage_cache_size: 5G\n"), 0o600)
	f, err := loadServeFile(good)
	if err != nil || f.Socket != "/run/x.sock" || f.LogLevel != "debug" || f.ImageCacheSize != "5G" {
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
