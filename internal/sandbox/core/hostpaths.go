package core

import (
	"fmt"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// A tenant names host paths (workspace, repo, a rootfs, oci: and
// docker-archive: images) only under the roots the operator granted it:
// Confine checks that on every create and MCP spec, whatever the door, and
// gives the spec those roots, beneath which the backend opens each path
// without following a link out. Roots are checked when granted: absolute,
// existing directories, kept by their real path, never holding or lying in
// the daemon's own directories (internal/tenant).

// refusal says why a tenant may not name host path p, and what to do.
func refusal(field, p string, roots []string) error {
	have := "none"
	if len(roots) > 0 {
		have = strings.Join(roots, ", ")
	}
	return errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("%s %q: a tenant names host paths only under the roots the operator granted it (this tenant's: %s). "+
		"Bring files with the archive upload (PUT /v1/sandboxes/{id}/archive), clone a repository inside the sandbox through egress with a grant, "+
		"start from a snapshot, or ask the operator for a root (airlock tenant update NAME --root DIR)", field, p, have))
}

// Confine holds tenant t's spec sp to the host paths it may name. The
// embedded service (Config.HostPaths: airlock mcp, root on the host, one
// user) takes them as they are.
func (s *Core) Confine(t *tenant.Principal, sp *spec.Spec) error {
	if s.Cfg.HostPaths {
		return nil
	}
	for _, f := range sp.HostPaths() {
		if f[0] == "policy" {
			return errdefs.New(errdefs.ErrPermissionDenied, "a policy file is a host path: give a tenant's sandbox its rules in network.allow and network.deny")
		}
		if spec.RootOf(t.Roots, f[1]) == "" {
			return refusal(f[0], f[1], t.Roots)
		}
	}
	sp.HostRoots = append([]string{}, t.Roots...)
	return nil
}
