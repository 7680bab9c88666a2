package remote

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cp out of a sandbox: a tar whose links chain through each other (d -> .
// then d/d/../../..) writes no link that resolves outside the directory,
// and names each one it skips.
func TestExtractTarRefusesLinksThatResolveOutside(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "out/", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ name, target string }{
		{"out/d", "."},
		{"out/e", "d/d/d/d/../../../../.."},
		{"out/abs", "/etc/shadow"},
		{"out/up", "../.."},
		{"out/ok", "d/file"},
		{"out/x\x1b[2K", "/"},
	} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: l.name, Linkname: l.target}); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	dst := t.TempDir()
	skipped, err := extractTarAs(dst, &buf, "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	msg := strings.Join(skipped, "\n")
	for _, p := range []string{"out/e", "out/abs", "out/up"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); err == nil {
			t.Errorf("cp wrote %s", p)
		}
		if !strings.Contains(msg, p+" (symlink to ") {
			t.Errorf("%s not named: %q", p, msg)
		}
	}
	if strings.Contains(msg, "\x1b") || !strings.Contains(msg, `"out/x\033[2K"`) {
		t.Errorf("skipped names not quoted: %q", msg)
	}
	for _, p := range []string{"out/d", "out/ok"} {
		if _, err := os.Readlink(filepath.Join(dst, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
