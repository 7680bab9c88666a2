package e2e

import (
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
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
		{[]string{"image", "pull", closed + "/acme/tool:1"}, 125, closed + " refused the connection"},
		{[]string{"image", "pull", host + "/acme/tool:2"}, 125, "has no acme/tool:2 (HTTP 404, manifest unknown: no such tag) (did you mean " + ref + ", which is in the image cache?)"},
		{[]string{"run", "--image", strings.TrimPrefix(deny.URL, "http://") + "/acme/tool:1", "--", "true"}, 125, "without credentials (HTTP 401)"},
		{[]string{"run", "--image", closed + "/acme/tool:1", "--", "true"}, 125, "refused the connection"},
	} {
		r := airlock(t, "", c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.says) {
			t.Errorf("%v: want exit %d saying %q: %s", c.args, c.code, c.says, r)
		}
	}
}
