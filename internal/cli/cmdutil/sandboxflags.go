package cmdutil

import (
	"github.com/spf13/pflag"

	"github.com/airlock-sandbox/airlock/api"
)

// SandboxFlags are the flags that describe a sandbox, shared by create and
// mcp: Bind them, then Spec() parses what needs parsing.
type SandboxFlags struct {
	Req                      api.CreateSandbox
	env, grants              []string
	memory, disk, grantsFile string
}

// IsolationHelp is --isolation's help, for run, create and mcp.
const IsolationHelp = `the wall: "container" (default: namespaces, seccomp, Landlock on the host's kernel) or "gvisor" (runsc: gVisor's own kernel answers the sandbox's system calls, its Sentry running as the sandbox's own host ids; the same egress policy; its memory can be saved and forked)`

// Bind adds the flags to f.
func (s *SandboxFlags) Bind(f *pflag.FlagSet) {
	f.StringVar(&s.Req.Isolation, "isolation", "", IsolationHelp)
	f.StringVar(&s.Req.Image, "image", "", `image: "host" (default), a rootfs directory, oci:PATH, docker-archive:PATH, a registry reference, or snapshot:ID (a daemon's tenant: paths under its roots, registries the daemon lists)`)
	f.BoolVar(&s.Req.WritableRootfs, "writable-rootfs", false, "a throwaway writable layer over the image (for package installs)")
	f.StringVar(&s.Req.Workspace, "workspace", "", "host directory copied at create to /workspace: the sandbox sees it as it was then (the host's files are never written; a daemon's tenant: under its roots)")
	f.StringVar(&s.Req.Repo, "repo", "", "host git repository to check out at /workspace (a daemon's tenant: under its roots)")
	f.StringVar(&s.Req.Commit, "commit", "", "commit (or branch, tag) of --repo (default HEAD)")
	f.StringArrayVarP(&s.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&s.memory, "memory", "", "memory limit (e.g. 512M; default 2G)")
	f.StringVar(&s.disk, "disk", "", "writable space (default 1G)")
	f.Float64Var(&s.Req.Limits.CPUs, "cpus", 0, "CPU limit (default 1)")
	f.Int64Var(&s.Req.Limits.Pids, "pids", 0, "process limit (default 512)")
	f.StringArrayVar(&s.Req.Network.Allow, "allow", nil, "allowed host pattern or preset (pypi, npm, go, github, debian); turns on the proxy")
	f.StringArrayVar(&s.Req.Network.Deny, "deny", nil, "denied host pattern")
	f.StringArrayVar(&s.grants, "grant", nil, GrantHelp)
	f.StringVar(&s.grantsFile, "grants", "", "YAML or JSON file: a list of grants (secret, host, port, allow, env, scheme, header, username, ttl)")
}

// Spec is the create request the flags describe.
func (s *SandboxFlags) Spec() (*api.CreateSandbox, error) {
	req := s.Req
	if err := HostPaths(&req.Workspace, &req.Repo, &req.Image); err != nil {
		return nil, err
	}
	var err error
	if req.Env, err = KVMap("-e", s.env); err != nil {
		return nil, err
	}
	if req.Limits.MemoryBytes, err = SizeFlag("memory", s.memory); err != nil {
		return nil, err
	}
	if req.Limits.DiskBytes, err = SizeFlag("disk", s.disk); err != nil {
		return nil, err
	}
	if req.Grants, err = GrantsOf(s.grants, s.grantsFile); err != nil {
		return nil, err
	}
	if len(req.Network.Allow) > 0 && req.Network.Mode == "" {
		req.Network.Mode = "proxy"
	}
	return &req, nil
}
