package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// docs/api.md documents every route, and only routes that exist.
func TestDocsListEveryRoute(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^### `((?:GET|POST|PUT|DELETE|PATCH|ANY) /\\S*)`$").FindAllStringSubmatch(string(b), -1) {
		documented = append(documented, m[1])
	}
	routes := (&Handler{}).Routes()
	slices.Sort(documented)
	slices.Sort(routes)
	if !slices.Equal(documented, routes) {
		t.Errorf("docs/api.md lists\n  %s\nthe API serves\n  %s", strings.Join(documented, "\n  "), strings.Join(routes, "\n  "))
	}
	for _, c := range api.Codes() {
		if !strings.Contains(string(b), "`"+string(c)+"`") {
			t.Errorf("error code %s is not documented", c)
		}
	}
}

// Every error class has one code, and a wrapped class keeps it.
func TestErrorClassesMapToCodes(t *testing.T) {
	for _, c := range classes {
		err := fmt.Errorf("context: %w", errdefs.New(c.class, "x"))
		if got := codeOf(err); got != c.code {
			t.Errorf("%v: code %s, want %s", c.class, got, c.code)
		}
	}
	if got := codeOf(errors.New("unclassed")); got != api.CodeInternal {
		t.Errorf("an unclassed error is %s", got)
	}
	if got := codeOf(&http.MaxBytesError{Limit: 1}); got != api.CodeTooLarge {
		t.Errorf("an oversize body is %s", got)
	}
}

// Every route but the health check asks for a key, whichever group it is
// registered in; the port front signs its caller in itself, by a port
// token or a key.
func TestOnlyHealthIsOpen(t *testing.T) {
	for _, rt := range (&Handler{}).routes() {
		if open := !rt.auth; open != (rt.pattern == "GET /v1/health" || rt.pattern == "/v1/sandboxes/{id}/ports/{port}/{path...}") {
			t.Errorf("%s: open %v", rt.pattern, open)
		}
	}
}

// Regression (issue 14): curl -d (a form type) got "Content-Type must be
// application/json" and no word of how to send JSON; the refusal says so,
// and a body with no type, or JSON's, is read.
func TestDecodeSaysHowToSendJSON(t *testing.T) {
	for ct, ok := range map[string]bool{"": true, "application/json": true, "application/json; charset=utf-8": true, "application/x-www-form-urlencoded": false, "text/plain": false} {
		r := httptest.NewRequest("PUT", "/v1/mcp/spec", strings.NewReader(`{"image":"host"}`))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		var v struct {
			Image string `json:"image"`
		}
		err := decode(httptest.NewRecorder(), r, &v)
		switch {
		case ok && (err != nil || v.Image != "host"):
			t.Errorf("%q: %v %+v", ct, err, v)
		case !ok && (err == nil || !strings.Contains(err.Error(), "-H 'Content-Type: application/json'") || !strings.Contains(err.Error(), ct)):
			t.Errorf("%q: %v", ct, err)
		}
	}
	// A hostile header is echoed in part only, escaped.
	r := httptest.NewRequest("PUT", "/v1/mcp/spec", strings.NewReader(`{}`))
	r.Header.Set("Content-Type", "text/\x1b[2J"+strings.Repeat("x", 100<<10))
	var v struct{}
	if err := decode(httptest.NewRecorder(), r, &v); err == nil || len(err.Error()) > 300 || strings.Contains(err.Error(), "\x1b[2J") {
		t.Errorf("a 100 KiB content type: %d bytes of error: %.100q", len(fmt.Sprint(err)), fmt.Sprint(err))
	}
}
