package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type file struct {
	name, body, link string
	uid              int
	mode             int64
	dir              bool
}

func tarLayer(t *testing.T, files ...file) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, Size: int64(len(f.body)), Typeflag: tar.TypeReg}
		switch {
		case f.dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case f.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.link, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(f.body))
	}
	_ = tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is a tiny image: the static attack helper as /bin/attack, a
// root-owned /etc, a file owned by uid 1234, and a second layer that
// deletes one file (whiteout).
func testImage(t *testing.T) v1.Image {
	t.Helper()
	helper, err := os.ReadFile(attackBin)
	if err != nil {
		t.Fatal(err)
	}
	base := tarLayer(t,
		file{name: "bin/", dir: true, mode: 0o755},
		file{name: "bin/attack", body: string(helper), mode: 0o755},
		file{name: "etc/", dir: true, mode: 0o755},
		file{name: "etc/passwd", body: "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234::/srv:/bin/sh\n", mode: 0o644},
		file{name: "etc/group", body: "root:x:0:\napp:x:1234:\n", mode: 0o644},
		file{name: "srv/", dir: true, mode: 0o755, uid: 1234},
		file{name: "srv/data", body: "app data\n", mode: 0o600, uid: 1234},
		file{name: "srv/deleted", body: "gone\n", mode: 0o644},
	)
	top := tarLayer(t, file{name: "srv/.wh.deleted", mode: 0o644})
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "APP_MODE=test"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func checkImageRun(t *testing.T, w wallCase, ref string) {
	t.Helper()
	r := w.run(t, "--image", ref, "--", "attack", "stat", "/etc/passwd", "/srv/data", "/srv/deleted", "/bin/attack")
	if r.code != 0 {
		t.Fatalf("%s: %s", ref, r)
	}
	for _, want := range []string{"/etc/passwd 0:0 644", "/srv/data 1234:1234 600", "/srv/deleted: no such file", "/bin/attack 0:0 755"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("%s: missing %q in\n%s", ref, want, r.stdout)
		}
	}
	r = w.run(t, "--image", ref, "--", "attack", "whoami")
	if r.code != 0 || r.stdout != "1000\n" {
		t.Errorf("%s: whoami: %s", ref, r)
	}
}

func TestOCIImages(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		img := testImage(t)
		dir := t.TempDir()

		oci := filepath.Join(dir, "layout")
		lp, err := layout.Write(oci, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.AppendImage(img); err != nil {
			t.Fatal(err)
		}
		checkImageRun(t, w, "oci:"+oci)

		archive := filepath.Join(dir, "image.tar")
		tag, _ := name.NewTag("airlock.test/img:v1")
		if err := tarball.WriteToFile(archive, tag, img); err != nil {
			t.Fatal(err)
		}
		checkImageRun(t, w, "docker-archive:"+archive)

		srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
		defer srv.Close()
		ref := strings.TrimPrefix(srv.URL, "http://") + "/test/img:v1"
		rref, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(rref, img); err != nil {
			t.Fatal(err)
		}
		checkImageRun(t, w, ref)

		// One image, three sources: unpacked once.
		r := airlock(t, "", "image", "ls", "--json")
		if strings.Count(r.stdout, `"id"`) != 1 || !strings.Contains(r.stdout, "docker-archive:") || !strings.Contains(r.stdout, ref) {
			t.Fatalf("image ls: %s", r)
		}
		// Offline, the cached reference still runs.
		srv.Close()
		r = w.run(t, "--image", ref, "--", "attack", "whoami")
		if r.code != 0 || !strings.Contains(r.stderr, "using the cached") {
			t.Fatalf("offline cached run: %s", r)
		}
		r = airlock(t, "", "image", "rm", ref)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "removed ") {
			t.Fatalf("image rm: %s", r)
		}
		if r = airlock(t, "", "image", "ls", "--json"); strings.Contains(r.stdout, `"id"`) {
			t.Fatalf("image still listed: %s", r)
		}
		noResidue(t)
	})
}

func TestHostileImageRefused(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		img, err := mutate.AppendLayers(empty.Image, tarLayer(t, file{name: "../../etc/airlock-pwned", body: "x", mode: 0o644}))
		if err != nil {
			t.Fatal(err)
		}
		oci := filepath.Join(t.TempDir(), "layout")
		lp, _ := layout.Write(oci, empty.Index)
		if err := lp.AppendImage(img); err != nil {
			t.Fatal(err)
		}
		r := w.run(t, "--image", "oci:"+oci, "--", "true")
		if r.code != 125 || !strings.Contains(r.stderr, "path traversal") {
			t.Fatalf("%s", r)
		}
		if _, err := os.Stat("/etc/airlock-pwned"); err == nil {
			t.Fatal("a hostile layer wrote outside the cache")
		}
	})
}

func TestRootfsDirectoryImage(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		root := t.TempDir()
		helper, _ := os.ReadFile(attackBin)
		for _, d := range []string{"bin", "etc", "srv"} {
			_ = os.MkdirAll(filepath.Join(root, d), 0o755)
		}
		_ = os.WriteFile(filepath.Join(root, "bin/attack"), helper, 0o755)
		_ = os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
		_ = os.WriteFile(filepath.Join(root, "srv/owned"), []byte("x"), 0o644)
		_ = os.Chown(filepath.Join(root, "srv/owned"), 1234, 1234)
		r := w.run(t, "--image", root, "--", "/bin/attack", "stat", "/bin/attack", "/srv/owned", "/etc/passwd")
		if r.code != 0 || !strings.Contains(r.stdout, "/bin/attack 0:0 755") || !strings.Contains(r.stdout, "/srv/owned 1234:1234") {
			t.Fatalf("%s", r)
		}
		r = w.run(t, "--image", root, "--", "/bin/attack", "write-outside")
		if r.code != 0 || strings.Contains(r.stdout, "VULNERABLE") {
			t.Fatalf("%s", r)
		}
	})
}

func TestRootPackageInstall(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		if _, err := exec.LookPath("dpkg-deb"); err != nil {
			t.Skip("dpkg-deb is not installed: cannot build a test package")
		}
		ws := t.TempDir()
		pkg := filepath.Join(t.TempDir(), "pkg")
		writeFiles(t, pkg, map[string]string{
			"DEBIAN/control":       "Package: airlock-test\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.com>\nDescription: test\n",
			"usr/bin/airlock-test": "#!/bin/sh\necho installed\n",
			"DEBIAN/postinst":      "#!/bin/sh\nset -e\nuseradd --system airlockd\nchown airlockd /usr/bin/airlock-test\n",
		})
		_ = os.Chmod(filepath.Join(pkg, "usr/bin/airlock-test"), 0o755)
		_ = os.Chmod(filepath.Join(pkg, "DEBIAN/postinst"), 0o755)
		if out, err := exec.Command("dpkg-deb", "--build", pkg, filepath.Join(ws, "test.deb")).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb: %v\n%s", err, out)
		}
		r := w.run(t, "--user", "root", "--writable-rootfs", "--workspace", ws, "--", "sh", "-c",
			"mkdir -p /var/log && dpkg -i test.deb >/dev/null && airlock-test && stat -c %U /usr/bin/airlock-test && useradd -m bob && su bob -c 'id -un'")
		if r.code != 0 || r.stdout != "installed\nairlockd\nbob\n" {
			t.Fatalf("%s", r)
		}
		if _, err := os.Stat("/usr/bin/airlock-test"); err == nil {
			t.Fatal("the package landed on the host")
		}
	})
}
