package archtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The import rules of docs/architecture.md, kept true by the build.
var rules = []struct {
	pkg       string
	forbidden []string
}{
	{"./client/...", []string{"github.com/airlock-sandbox/airlock/internal/"}},
	{"./internal/confined/nsinit", []string{"net/http", "github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/cli", "github.com/airlock-sandbox/airlock/internal/image", "github.com/airlock-sandbox/airlock/internal/image/", "github.com/airlock-sandbox/airlock/internal/workspace", "github.com/airlock-sandbox/airlock/internal/workspace/", "github.com/spf13/cobra"}},
	{"./internal/wall/container", []string{"github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/cli", "github.com/airlock-sandbox/airlock/internal/image", "github.com/airlock-sandbox/airlock/internal/image/", "net/http"}},
	{"./internal/linux/...", []string{"github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/spec"}},
	{"./internal/spec", []string{"os/exec", "net", "golang.org/x/sys/unix", "github.com/airlock-sandbox/airlock/internal/wall/container"}},
	{"./internal/errdefs", []string{"github.com/airlock-sandbox/airlock/"}},
	{"./internal/cli", []string{"github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/linux/", "github.com/airlock-sandbox/airlock/internal/image", "github.com/airlock-sandbox/airlock/internal/image/", "github.com/airlock-sandbox/airlock/internal/workspace", "github.com/airlock-sandbox/airlock/internal/workspace/", "github.com/airlock-sandbox/airlock/internal/netns", "github.com/airlock-sandbox/airlock/internal/egress", "github.com/airlock-sandbox/airlock/internal/egress/"}},
	{"./internal/egress/...", []string{"github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/broker", "golang.org/x/sys/unix"}},
	{"./api/...", []string{"github.com/airlock-sandbox/airlock/internal/", "github.com/airlock-sandbox/airlock/client"}},
	{"./internal/confined/agent", []string{"github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/cli", "github.com/airlock-sandbox/airlock/internal/sandbox", "github.com/airlock-sandbox/airlock/internal/store", "github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/image", "github.com/airlock-sandbox/airlock/internal/image/", "github.com/airlock-sandbox/airlock/internal/workspace", "github.com/airlock-sandbox/airlock/internal/workspace/"}},
	{"./internal/sandbox", []string{"github.com/airlock-sandbox/airlock/internal/system", "github.com/airlock-sandbox/airlock/internal/cli", "github.com/airlock-sandbox/airlock/internal/httpapi", "github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/linux/", "github.com/airlock-sandbox/airlock/internal/image", "github.com/airlock-sandbox/airlock/internal/image/", "github.com/airlock-sandbox/airlock/internal/netns", "golang.org/x/sys/unix"}},
	{"./internal/httpapi", []string{"github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/store", "github.com/airlock-sandbox/airlock/internal/linux/", "connectrpc.com/connect"}},
	{"./internal/store", []string{"github.com/airlock-sandbox/airlock/"}},
	{"./internal/scan", []string{"github.com/airlock-sandbox/airlock/"}},
	{"./internal/untrusted", []string{"github.com/airlock-sandbox/airlock/"}},
	{"./internal/mcp", []string{"github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/cli", "github.com/airlock-sandbox/airlock/internal/httpapi", "github.com/airlock-sandbox/airlock/internal/store", "github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/linux/", "github.com/airlock-sandbox/airlock/internal/egress", "github.com/airlock-sandbox/airlock/internal/egress/", "github.com/airlock-sandbox/airlock/internal/broker"}},
	{"./internal/broker", []string{"github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/cli", "github.com/airlock-sandbox/airlock/internal/sandbox", "github.com/airlock-sandbox/airlock/internal/store", "github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/linux/", "github.com/airlock-sandbox/airlock/internal/httpapi", "golang.org/x/sys/unix"}},
	{"./internal/netns", []string{"github.com/airlock-sandbox/airlock/internal/wall/container", "github.com/airlock-sandbox/airlock/internal/daemon", "github.com/airlock-sandbox/airlock/internal/egress", "github.com/airlock-sandbox/airlock/internal/egress/"}},
}

func TestImportRules(t *testing.T) {
	for _, r := range rules {
		dir := "../../" + strings.TrimSuffix(strings.TrimPrefix(r.pkg, "./"), "/...")
		if _, err := os.Stat(dir); err != nil {
			continue // not written yet
		}
		// Direct imports only: what a package itself names.
		out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}: {{join .Imports " "}}`, "../../"+strings.TrimPrefix(r.pkg, "./")).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", r.pkg, err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, imports, _ := strings.Cut(line, ": ")
			for _, imp := range strings.Fields(imports) {
				for _, f := range r.forbidden {
					if imp == f || strings.HasSuffix(f, "/") && strings.HasPrefix(imp, f) {
						t.Errorf("%s imports %s", pkg, imp)
					}
				}
			}
		}
	}
}

func TestEveryPackageSaysWhatItOwns(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{len .GoFiles}}\t{{.Doc}}", "../../...").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) < 3 || f[1] == "0" {
			continue // tests only
		}
		if pkg, doc := f[0], f[2]; strings.TrimSpace(doc) == "" {
			t.Errorf("%s has no package doc", pkg)
		}
	}
}
