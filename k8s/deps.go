//go:build tools

package k8s

// The module's pinned dependencies, held while the packages that use them
// are written.
import (
	_ "github.com/airlock-sandbox/airlock/client"
	_ "k8s.io/api/authentication/v1"
	_ "k8s.io/api/authorization/v1"
	_ "k8s.io/client-go/kubernetes"
	_ "sigs.k8s.io/agent-sandbox/api/v1beta1"
	_ "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	_ "sigs.k8s.io/controller-runtime"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
)
