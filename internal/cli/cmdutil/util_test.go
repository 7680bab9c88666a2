package cmdutil

import (
	"github.com/spf13/pflag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Regression (issue 14): `airlock create --workspace ./repo`, as --help
// shows it, was refused (the daemon resolves nothing against a client's
// directory) while `run` took it. Every door resolves a sandbox's host
// paths on the client, and leaves names alone.
func TestHostPathsAreTheClients(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ workspace, repo, image, wantWS, wantRepo, wantImage string }{
		{"./ws", "repo", "./rootfs", filepath.Join(wd, "ws"), filepath.Join(wd, "repo"), filepath.Join(wd, "rootfs")},
		{"/abs/ws/", "", "oci:./layout", "/abs/ws", "", "oci:" + filepath.Join(wd, "layout")},
		{"", "../r", "docker-archive:img.tar", "", filepath.Join(filepath.Dir(wd), "r"), "docker-archive:" + filepath.Join(wd, "img.tar")},
		{"", "", "host", "", "", "host"},
		{"", "", "python:3.12-slim", "", "", "python:3.12-slim"},
		{"", "", "ghcr.io/acme/tools:1", "", "", "ghcr.io/acme/tools:1"},
		{"", "", "snapshot:s_0123", "", "", "snapshot:s_0123"},
		{"", "", "", "", "", ""},
		{"", "", "/a/../rootfs", "", "", "/rootfs"},
	} {
		ws, repo, img := c.workspace, c.repo, c.image
		if err := HostPaths(&ws, &repo, &img); err != nil {
			t.Fatal(err)
		}
		if ws != c.wantWS || repo != c.wantRepo || img != c.wantImage {
			t.Errorf("HostPaths(%q, %q, %q) = %q, %q, %q; want %q, %q, %q", c.workspace, c.repo, c.image, ws, repo, img, c.wantWS, c.wantRepo, c.wantImage)
		}
	}
}

// Regression (issue 14): `exec ID --cwd /tmp -- pwd` ran "--cwd" in the
// sandbox (command not found); a first word that is one of the command's
// own flags is named instead.
func TestMisplacedFlag(t *testing.T) {
	fs := pflag.NewFlagSet("exec", pflag.ContinueOnError)
	fs.String("cwd", "", "")
	fs.StringP("user", "u", "", "")
	fs.StringArrayP("env", "e", nil, "")
	for word, want := range map[string]string{
		"--cwd": "--cwd", "--cwd=/tmp": "--cwd", "-u": "-u", "-e": "-e", "--env=A=1": "--env",
		"pwd": "", "--": "", "-": "", "--nope": "", "-x": "", "-ux": "", "---cwd": "", "": "",
	} {
		if got := MisplacedFlag(fs, word); got != want {
			t.Errorf("MisplacedFlag(%q) = %q, want %q", word, got, want)
		}
	}
}

// Regression (issue 14): `image ls --json` with no image printed null;
// every --json list is [] when empty.
func TestPrintJSONOfAnEmptyListIsAList(t *testing.T) {
	var b strings.Builder
	var none []string
	if err := PrintJSON(&b, none); err != nil || strings.TrimSpace(b.String()) != "[]" {
		t.Errorf("a nil list printed %q (%v)", b.String(), err)
	}
}
