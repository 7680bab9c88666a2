// Package apiservertest runs a real kube-apiserver and etcd for the k8s
// module's tests (through controller-runtime's envtest), with
// agent-sandbox's CRDs from its module and airlock's own: the binaries
// scripts/kube.sh builds, in AIRLOCK_KUBE_BIN (default
// /usr/local/lib/airlock/kube). Without them a test skips; under CI=true
// it fails.
package apiservertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/airlock-sandbox/airlock/k8s/config"
)

// Start starts the apiserver and etcd, stopped when t ends. The returned
// environment's Config is an admin's, with no client-side rate limit (as
// airlock-controller runs).
func Start(t testing.TB) *envtest.Environment {
	t.Helper()
	bin := os.Getenv("AIRLOCK_KUBE_BIN")
	if bin == "" {
		bin = "/usr/local/lib/airlock/kube"
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("no %s in %s (scripts/kube.sh builds it)", b, bin)
			}
			t.Skipf("no %s in %s (scripts/kube.sh builds it; AIRLOCK_KUBE_BIN names another directory)", b, bin)
		}
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/agent-sandbox").Output()
	if err != nil {
		t.Fatalf("finding agent-sandbox's module: %v", err)
	}
	objs, err := config.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	var crds []*apiextv1.CustomResourceDefinition
	for _, o := range objs {
		var c apiextv1.CustomResourceDefinition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &c); err != nil {
			t.Fatal(err)
		}
		crds = append(crds, &c)
	}
	ctrllog.SetLogger(logr.Discard())
	env := &envtest.Environment{
		BinaryAssetsDirectory: bin,
		CRDs:                  crds,
		CRDDirectoryPaths:     []string{filepath.Join(strings.TrimSpace(string(out)), "k8s", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	cfg.QPS = -1
	t.Cleanup(func() { _ = env.Stop() })
	return env
}
