// Package k8s is airlock's cluster side: a controller that serves
// kubernetes-sigs/agent-sandbox's kinds (Sandbox, SandboxTemplate,
// SandboxWarmPool, SandboxClaim) on `airlock serve` daemons, one per node,
// and a gateway that lets Kubernetes identities reach those sandboxes
// (docs/kubernetes.md). It is a module of its own so that the daemon and
// the main module never link Kubernetes libraries.
package k8s
