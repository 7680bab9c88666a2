package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock-sandbox/airlock/api"
)

// `airlock image pull` says what it pulls from where and draws each
// layer's progress on stderr when asked (--progress: the test's stderr is
// not a terminal), nothing under --json or unasked; a pull that fails says
// why, in the exit status of its class: a registry that is not there, a
// tag that is not, a registry that wants credentials.
func TestImagePullSaysWhatWhereAndHowFar(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(64<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := host + "/acme/tool:1"
	rref, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(rref, img); err != nil {
		t.Fatal(err)
	}
	defer airlock(t, "", "image", "rm", ref)

	r := airlock(t, "", "--progress", "image", "pull", ref)
	if r.code != 0 {
		t.Fatalf("pull: %s", r)
	}
	for _, want := range []string{
		"airlock: pulling " + host + "/acme/tool:1 (" + host + ")\n",
		"airlock: pull " + ref + ": layer 1/2 ",
		"airlock: pull " + ref + ": layer 2/2 ",
		"airlock: unpacked " + ref + ": 2 layers,",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("pull --progress: no %q in\n%s", want, r)
		}
	}
	if strings.ContainsAny(r.stderr, "\r\x1b") {
		t.Errorf("pull --progress to a pipe redraws a line: %q", r.stderr)
	}
	if r = airlock(t, "", "image", "pull", ref); r.code != 0 || r.stderr != "" {
		t.Errorf("pull to a pipe, unasked: %s", r)
	}
	r = airlock(t, "", "--progress", "image", "pull", "--json", ref)
	var out struct{ ID, Name string }
	if err := json.Unmarshal([]byte(r.stdout), &out); r.code != 0 || r.stderr != "" || err != nil || out.Name != ref || !strings.HasPrefix(out.ID, "sha256:") {
		t.Errorf("pull --json: %v %s", err, r)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	deny := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	defer deny.Close()
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"image", "pull", closed + "/acme/tool:1"}, 1, closed + " refused the connection"},
		{[]string{"image", "pull", host + "/acme/tool:2"}, 1, "has no acme/tool:2 (HTTP 404, manifest unknown: no such tag) (did you mean " + ref + ", which is in the image cache?)"},
		{[]string{"run", "--image", strings.TrimPrefix(deny.URL, "http://") + "/acme/tool:1", "--", "true"}, 125, "without credentials (HTTP 401)"},
		{[]string{"run", "--image", closed + "/acme/tool:1", "--", "true"}, 125, "refused the connection"},
	} {
		r := airlock(t, "", c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.says) {
			t.Errorf("%v: want exit %d saying %q: %s", c.args, c.code, c.says, r)
		}
	}
}

// `airlock create` on a terminal (here forced: --progress) draws what the
// daemon reports of its image's unpack, streamed with the create
// (?progress=true), then prints the id alone on stdout; a create refused
// before any progress is a plain error reply, in its own class.
func TestCreateStreamsTheImagesProgress(t *testing.T) {
	forEachWall(t, createStreamsTheImagesProgress)
}

func createStreamsTheImagesProgress(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	tn, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: "progress", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(oci, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(testImage(t)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", d.data, "--progress", "create", "--image", "oci:"+oci, "--ttl", "5m")
	cmd.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock, "AIRLOCK_API_KEY="+tn.Key)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("create: %v\n%s%s", err, out.String(), errb.String())
	}
	c := d.client(t, tn.Key)
	id := strings.TrimSpace(out.String())
	defer func() { _ = c.Destroy(context.Background(), id) }()
	if _, err := c.Sandbox(context.Background(), id); err != nil {
		t.Errorf("stdout %q is not the sandbox's id: %v", out.String(), err)
	}
	for _, want := range []string{"airlock: unpack oci:" + oci + ": layer 1/2 ", "airlock: unpack oci:" + oci + ": layer 2/2 ", "airlock: unpacked oci:" + oci + ": 2 layers,"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("no %q in stderr:\n%s", want, errb.String())
		}
	}

	var events []*api.Progress
	_, err = c.CreateSandboxProgress(context.Background(), &api.CreateSandbox{Image: "127.0.0.1:1/acme/tool:1"}, func(p *api.Progress) { events = append(events, p) })
	if code(err) != api.CodePermissionDenied || len(events) != 0 {
		t.Errorf("an unlisted registry: %v after %d events", err, len(events))
	}
}
