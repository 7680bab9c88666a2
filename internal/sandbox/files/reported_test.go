package files

import (
	"strings"
	"testing"
)

// A path the sandbox reports is taken only if a file can have it.
func TestReportedPath(t *testing.T) {
	for p, want := range map[string]string{
		"/home/user/a": "/home/user/a", "/": "/", "": "", "a/b": "", "/a/../b": "", "/a/": "", "/a\x00b": "",
		"/" + strings.Repeat("a", 4096): "",
	} {
		if got := reportedPath(p); got != want {
			t.Errorf("%q: %q, want %q", p, got, want)
		}
	}
}
