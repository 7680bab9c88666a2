package archtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// layer places packages of the module and says which layers they may reach,
// directly or through anything they import. A layer's own name is not
// implied: a layer whose packages import each other lists itself.
// Reach is not inherited either: loosening a low layer never loosens the
// ones above it silently, their own lines have to change too.
type layer struct {
	name string
	pkgs []string // names of packages (see expand and match)
	may  []string // the layers these packages may reach
}

// Every package of the module is placed by exactly one line; a new package
// gets a line (or joins one) here and a row in docs/architecture.md.
// Bottom first.
var layers = []layer{
	{"wire", []string{"api/..."}, []string{"wire"}},
	{"client", []string{"client"}, []string{"wire"}},
	{"tests", []string{"test/...", "bench", "internal/archtest", "internal/testutil/tartest", "internal/egress/internal/tlstest"}, nil},
	// The tests' audit log in memory, beside the log it stands in for.
	{"tests", []string{"internal/testutil/memlog"}, []string{"record"}},

	// Leaves: nothing of airlock above them.
	{"base", []string{"internal/errdefs", "internal/untrusted", "internal/cleanup", "internal/progress", "internal/editdist", "internal/version"}, nil},
	{"kernel", []string{"internal/linux/..."}, []string{"base"}},
	{"value", []string{"internal/spec", "internal/scan", "internal/egress/policy", "internal/egress/sni", "internal/egress/eventlog", "internal/broker/keys"}, []string{"base"}},
	{"record", []string{"internal/audit"}, nil},
	{"record", []string{"internal/store"}, nil},

	// Confined code: runs inside a sandbox and reaches nothing of the host.
	{"init", []string{"internal/confined/nsinit/..."}, []string{"kernel", "init"}},
	{"agent", []string{"internal/confined/agent/..."}, []string{"wire", "agent"}},
	// The binary every sandbox runs: init, the agent and the version, never
	// the command line, the daemon or anything else of the host side
	// (every page of it a sandbox touches is host memory, per sandbox).
	{"lean", []string{"cmd/airlock-init"}, []string{"base", "kernel", "init", "agent", "wire"}},

	// The wall: an interface that knows no kernel, and its implementations,
	// which only the composition root (and doctor) know.
	{"wall", []string{"internal/wall"}, []string{"base", "value"}},
	// The host uid ranges both walls lease from one pool.
	{"leases", []string{"internal/wall/uidlease"}, []string{"kernel"}},
	// The binary both walls run in a sandbox, found and checked.
	{"leases", []string{"internal/wall/initexe"}, []string{"base"}},
	{"backend", []string{"internal/wall/container", "internal/wall/container/sealedexe"}, []string{"base", "value", "kernel", "wall", "leases", "init", "backend"}},
	// gVisor's wall runs runsc; of the confined side it knows only
	// gvisor-init's wire type; it copies what a sandbox wrote (a
	// checkpoint's /tmp and home) as the workspace copies do.
	{"backend", []string{"internal/wall/gvisor"}, []string{"base", "kernel", "wall", "leases", "init", "workspace"}},

	// What the lifecycle builds a sandbox from, below it.
	{"image", []string{"internal/image/..."}, []string{"base", "image"}},
	{"workspace", []string{"internal/workspace/..."}, []string{"base", "workspace"}},
	{"egress", []string{"internal/egress", "internal/egress/dns"}, []string{"base", "value", "egress"}},
	{"broker", []string{"internal/broker"}, []string{"base", "value", "egress"}},
	{"netns", []string{"internal/netns"}, []string{"base", "kernel"}},
	// What the audit log says: one type per kind, for every door.
	{"records", []string{"internal/audit/record"}, []string{"base", "value", "record", "workspace"}},
	{"network", []string{"internal/sandboxnet"}, []string{"base", "value", "kernel", "wall", "egress", "broker", "netns"}},

	// The one construction path: never up into the service, the API, the
	// composition root or the command line, and no wall but the interface.
	{"lifecycle", []string{"internal/lifecycle", "internal/lifecycle/hostfiles"}, []string{"base", "value", "kernel", "wall", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle"}},
	{"run", []string{"internal/run"}, []string{"base", "value", "kernel", "wall", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "record", "records"}},

	// The service and who may call it.
	{"tenant", []string{"internal/tenant"}, []string{"base", "value", "record", "records", "workspace", "wire"}},
	{"secret", []string{"internal/secret"}, []string{"base", "value", "record", "records", "workspace", "wire", "tenant"}},
	{"service", []string{"internal/sandbox/..."}, []string{"base", "value", "record", "records", "wire", "kernel", "wall", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "tenant", "service"}},
	// The front of sandboxes' ports, which every door serves through.
	{"portfront", []string{"internal/portfront"}, []string{"base", "value", "record", "records", "wire", "kernel", "wall", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "tenant", "service"}},
	{"front", []string{"internal/httpapi"}, []string{"base", "value", "record", "records", "wire", "kernel", "wall", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "tenant", "secret", "service", "portfront"}},
	{"front", []string{"internal/e2bapi/..."}, []string{"base", "value", "record", "records", "wire", "kernel", "wall", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "tenant", "secret", "service", "portfront", "front"}},
	{"front", []string{"internal/mcp"}, []string{"base", "value", "record", "records", "wire", "client", "kernel", "wall", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "tenant", "service"}},

	// The composition root, the only host code that knows a wall by name.
	{"root", []string{"internal/system"}, []string{"base", "value", "record", "records", "wire", "client", "kernel", "wall", "backend", "leases", "init", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "run", "tenant", "secret", "service", "portfront", "front"}},
	{"root", []string{"internal/doctor"}, []string{"base", "value", "kernel", "wall", "backend", "leases", "init", "workspace"}},

	// The command line: the remote commands reach no further than the SDK.
	{"cmdutil", []string{"internal/cli/cmdutil"}, []string{"base", "value", "wire", "client"}},
	{"commands", []string{"internal/cli/remote", "internal/cli/admin"}, []string{"base", "value", "wire", "client", "cmdutil"}},
	{"host", []string{"internal/cli/host"}, []string{"base", "value", "record", "records", "wire", "client", "kernel", "wall", "backend", "leases", "init", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "run", "tenant", "secret", "service", "portfront", "front", "root", "cmdutil"}},
	{"cli", []string{"internal/cli"}, []string{"base", "value", "record", "records", "wire", "client", "kernel", "wall", "backend", "leases", "init", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "run", "tenant", "secret", "service", "portfront", "front", "root", "cmdutil", "commands", "host"}},
	{"main", []string{"cmd/airlock"}, []string{"base", "value", "record", "records", "wire", "client", "kernel", "wall", "backend", "leases", "init", "image", "workspace", "egress", "broker", "netns", "network", "lifecycle", "run", "tenant", "secret", "service", "portfront", "front", "root", "cmdutil", "commands", "host", "cli"}},
}

// knownOnlyTo names packages that exactly these packages import directly:
// what makes another wall addable without touching the service, the API,
// audit, egress or the broker, and keeps the command line and the confined
// side out of reach of everything else.
var knownOnlyTo = []struct {
	pkg       string
	importers []string
}{
	{"internal/wall/container", []string{"internal/system", "internal/doctor"}},
	{"internal/wall/gvisor", []string{"internal/system", "internal/doctor"}},
	{"internal/confined/nsinit", []string{"internal/wall/container", "internal/wall/gvisor", "cmd/airlock-init"}},
	{"internal/confined/agent", []string{"cmd/airlock-init"}},
	{"internal/cli", []string{"cmd/airlock"}},
	{"internal/system", []string{"internal/cli", "internal/cli/host"}},
}

// bans are packages outside the module that packages of it must not reach
// (transitively) or, where the package legitimately reaches them through
// something else, must not import themselves (direct).
var bans = []struct {
	pkgs   []string
	ban    string
	direct bool
	why    string
}{
	{[]string{"internal/confined/nsinit/..."}, "net/http", false, "init is PID 1 of the sandbox: no server, no client"},
	{[]string{"internal/confined/nsinit/..."}, "github.com/spf13/cobra", false, "init is dispatched before the command line exists"},
	{[]string{"internal/wall/container", "internal/wall/gvisor"}, "net/http", false, "the wall makes syscalls, it serves nothing"},
	{[]string{"cmd/airlock-init"}, "github.com/spf13/cobra", false, "the in-sandbox binary has no command line"},
	{[]string{"cmd/airlock-init"}, "modernc.org/sqlite", false, "the in-sandbox binary keeps no database"},
	{[]string{"cmd/airlock-init"}, "github.com/prometheus/client_golang/prometheus", false, "the in-sandbox binary exports no metrics"},
	{[]string{"cmd/airlock", "cmd/airlock-init"}, "github.com/moby/profiles/seccomp", false, "the seccomp filter is compiled ahead of time (internal/linux/seccomp/filter), not at every start"},
	{[]string{"cmd/airlock", "cmd/airlock-init"}, "github.com/elastic/go-seccomp-bpf/arch", false, "the seccomp filter is compiled ahead of time (internal/linux/seccomp/filter), not at every start"},
	{[]string{"internal/spec"}, "os/exec", false, "spec is pure"},
	{[]string{"internal/spec"}, "net", false, "spec is pure"},
	{[]string{"internal/spec"}, "golang.org/x/sys/unix", false, "spec is pure"},
	{[]string{"internal/egress/..."}, "golang.org/x/sys/unix", true, "the proxy works on sockets the standard library gives it"},
	{[]string{"internal/broker"}, "golang.org/x/sys/unix", true, "the broker is a library of keys and tokens, no syscalls"},
	{[]string{"internal/sandbox/..."}, "golang.org/x/sys/unix", true, "the service reaches the kernel only through the lifecycle"},
	{[]string{"internal/httpapi"}, "connectrpc.com/connect", true, "agents' calls go through the service, never from the API"},
}

func TestLayers(t *testing.T) {
	for _, p := range checkLayers(moduleGraph(t), layers) {
		t.Error(p)
	}
}

func TestKnownOnlyTo(t *testing.T) {
	g := moduleGraph(t)
	for _, k := range knownOnlyTo {
		for _, p := range checkImporters(g, k.pkg, k.importers) {
			t.Error(p)
		}
	}
}

func TestBans(t *testing.T) {
	g := moduleGraph(t)
	for _, b := range bans {
		for _, p := range checkBan(g, b.pkgs, b.ban, b.direct) {
			t.Errorf("%s (%s)", p, b.why)
		}
	}
}

// checkLayers returns what is wrong with the graph under rules, and with
// the rules themselves: a name that places no package, a layer reached
// that no line defines, a package placed twice or not at all.
func checkLayers(g graph, rules []layer) []string {
	var problems []string
	defined := map[string][]string{} // layer → its packages
	placed := map[string][]int{}     // package → its lines
	for i, r := range rules {
		for _, m := range g.missing(r.pkgs) {
			problems = append(problems, fmt.Sprintf("layer %q names %s, which is no package of the module", r.name, m))
		}
		defined[r.name] = append(defined[r.name], r.pkgs...)
		for _, p := range g.own() {
			if matchAny(r.pkgs, p) {
				placed[p] = append(placed[p], i)
			}
		}
	}
	for _, r := range rules {
		for _, l := range r.may {
			if defined[l] == nil {
				problems = append(problems, fmt.Sprintf("layer %q may reach layer %q, which no line defines", r.name, l))
			}
		}
	}
	for _, p := range g.own() {
		lines := placed[p]
		switch {
		case len(lines) == 0:
			problems = append(problems, fmt.Sprintf("%s is in no layer: place it in a line of layers", p))
			continue
		case len(lines) > 1:
			problems = append(problems, fmt.Sprintf("%s is placed by %d lines of layers", p, len(lines)))
			continue
		}
		r := rules[lines[0]]
		allowed := func(q string) bool {
			return slices.ContainsFunc(r.may, func(l string) bool { return matchAny(defined[l], q) })
		}
		// Walk what p reaches through what it may reach; a package it may
		// not reach is reported with its chain, and what lies beyond it is
		// that package's own fault.
		parent := map[string]string{p: ""}
		queue := []string{p}
		for len(queue) > 0 {
			cur := queue[0]
			queue = queue[1:]
			for _, imp := range g.ownImports(cur) {
				if _, seen := parent[imp]; seen {
					continue
				}
				parent[imp] = cur
				if allowed(imp) {
					queue = append(queue, imp)
				} else {
					problems = append(problems, fmt.Sprintf("layer %q may not reach %s: %s", r.name, imp, chain(chainTo(parent, imp))))
				}
			}
		}
	}
	return problems
}

// checkImporters returns what is wrong with the claim that exactly
// importers import pkg directly.
func checkImporters(g graph, pkg string, importers []string) []string {
	var problems []string
	for _, m := range g.missing(append([]string{pkg}, importers...)) {
		problems = append(problems, fmt.Sprintf("knownOnlyTo %s names %s, which is no package of the module", pkg, m))
	}
	for _, p := range g.own() {
		imports := slices.Contains(g[p].Imports, pkg)
		listed := slices.Contains(importers, p)
		switch {
		case imports && !listed:
			problems = append(problems, fmt.Sprintf("%s imports %s, which only %s may know", p, pkg, strings.Join(importers, " and ")))
		case listed && !imports && g[p] != nil && g[pkg] != nil:
			problems = append(problems, fmt.Sprintf("%s is listed as importing %s and does not: drop it from knownOnlyTo", p, pkg))
		}
	}
	return problems
}

// checkBan returns the packages of pkgs that reach ban (import it, if
// direct), with the chain; and what makes the ban check nothing: a name
// that matches no package, a ban nothing in the build imports.
func checkBan(g graph, pkgs []string, ban string, direct bool) []string {
	var problems []string
	for _, m := range g.missing(pkgs) {
		problems = append(problems, fmt.Sprintf("ban of %s names %s, which is no package of the module", ban, m))
	}
	if g[ban] == nil {
		problems = append(problems, fmt.Sprintf("ban of %s: nothing in the build imports it (renamed?)", ban))
	}
	for _, p := range g.own() {
		if !matchAny(pkgs, p) {
			continue
		}
		if direct {
			if slices.Contains(g[p].Imports, ban) {
				problems = append(problems, fmt.Sprintf("%s imports %s", p, ban))
			}
		} else if c := g.path(p, ban); c != nil {
			problems = append(problems, fmt.Sprintf("%s reaches %s: %s", p, ban, chain(c)))
		}
	}
	return problems
}

// The rules that keep airlock-init lean bite on the real module: the same
// graph with cmd/airlock-init importing the command line, the daemon's
// composition root or cobra fails them.
func TestLeanInitMayNotImportTheHostSide(t *testing.T) {
	real := moduleGraph(t)
	if real["cmd/airlock-init"] == nil {
		t.Fatal("no cmd/airlock-init in the module")
	}
	for _, imp := range []string{"internal/cli", "internal/system", "internal/sandbox", "internal/httpapi"} {
		g := withImport(real, "cmd/airlock-init", imp)
		wantProblem(t, checkLayers(g, layers), `layer "lean" may not reach `+imp)
	}
	for _, b := range bans {
		if !slices.Contains(b.pkgs, "cmd/airlock-init") {
			continue
		}
		g := withImport(real, "cmd/airlock-init", b.ban)
		wantProblem(t, checkBan(g, b.pkgs, b.ban, b.direct), "cmd/airlock-init reaches "+b.ban)
	}
}

// withImport is g with p importing imp too (g itself is left as it was).
func withImport(g graph, p, imp string) graph {
	out := make(graph, len(g))
	for k, v := range g {
		out[k] = v
	}
	cp := *g[p]
	cp.Imports = append(slices.Clone(cp.Imports), imp)
	out[p] = &cp
	return out
}

// kubernetesPrefixes name Kubernetes' libraries, which only the k8s/
// module (a module of its own, outside this build) may use: the daemon,
// the CLI and the SDK never link them (docs/kubernetes.md).
var kubernetesPrefixes = []string{"k8s.io/", "sigs.k8s.io/"}

func TestNoKubernetesInTheMainModule(t *testing.T) {
	for _, p := range checkNoPrefix(moduleGraph(t), kubernetesPrefixes) {
		t.Errorf("%s (Kubernetes belongs in the k8s/ module)", p)
	}
}

// checkNoPrefix returns every import of a library named by prefixes that
// the module's packages make, or reach through a library (with the chain
// from one of them).
func checkNoPrefix(g graph, prefixes []string) []string {
	var problems []string
	names := make([]string, 0, len(g))
	for q := range g {
		names = append(names, q)
	}
	slices.Sort(names)
	for _, q := range names {
		for _, imp := range g[q].Imports {
			if !slices.ContainsFunc(prefixes, func(pre string) bool { return strings.HasPrefix(imp, pre) }) {
				continue
			}
			if g[q].Own {
				problems = append(problems, fmt.Sprintf("%s imports %s", q, imp))
				continue
			}
			for _, p := range g.own() {
				if c := g.path(p, q); c != nil {
					problems = append(problems, fmt.Sprintf("%s reaches %s: %s", p, imp, chain(append(c, imp))))
					break
				}
			}
		}
	}
	return problems
}

// The rule bites: the real module with one package importing client-go
// fails it, and so does a library that pulls Kubernetes in underneath.
func TestNoKubernetesRuleBites(t *testing.T) {
	g := withImport(moduleGraph(t), "internal/httpapi", "k8s.io/client-go/kubernetes")
	wantProblem(t, checkNoPrefix(g, kubernetesPrefixes), "internal/httpapi imports k8s.io/client-go/kubernetes")
	deep := fake(map[string][]string{"internal/service": {"example.com/lib"}}, nil)
	deep["example.com/lib"].Imports = []string{"sigs.k8s.io/yaml"}
	wantProblem(t, checkNoPrefix(deep, kubernetesPrefixes), "internal/service → example.com/lib → sigs.k8s.io/yaml")
	if p := checkNoPrefix(fake(small, nil), kubernetesPrefixes); p != nil {
		t.Fatalf("a module without Kubernetes: %q", p)
	}
}
