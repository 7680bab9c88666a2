package archtest

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// row is one row of the packages table of docs/architecture.md.
type row struct {
	line    int
	paths   []string // the packages it describes (names, see expand)
	imports []string // the module's packages they import (names)
	bad     []string // items of the imports column that are not one name
}

// parenthetical is a note in the imports column: never a package.
var parenthetical = regexp.MustCompile(`\([^)]*\)`)

// parseTable reads the table under "## Packages (as built)" (columns path,
// owns, imports). own tells a name of the module's packages from a library.
func parseTable(md string, own func(name string) bool) ([]row, error) {
	_, after, ok := strings.Cut(md, "\n## Packages (as built)\n")
	if !ok {
		return nil, fmt.Errorf(`no "## Packages (as built)" section`)
	}
	first := strings.Count(md, "\n") - strings.Count(after, "\n") + 1 // line of the heading
	var rows []row
	inTable := false
	for i, line := range strings.Split(after, "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			return nil, fmt.Errorf("architecture.md:%d: %d cells, want path | owns | imports", first+i+1, len(cells))
		}
		if !inTable {
			inTable = true
			if h := strings.Join(strings.Fields(strings.Join(cells, "|")), " "); h != "path | owns | imports" {
				return nil, fmt.Errorf("architecture.md:%d: header %q, want path | owns | imports", first+i+1, h)
			}
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(cells[0]), "---") {
			continue
		}
		r := row{line: first + i + 1}
		for _, p := range splitNames(cells[0]) {
			r.paths = append(r.paths, strings.TrimSpace(p))
		}
		for _, item := range splitNames(parenthetical.ReplaceAllString(cells[2], "")) {
			item = strings.TrimSpace(item)
			switch {
			case item == "—":
			case strings.ContainsAny(item, " \t"):
				r.bad = append(r.bad, item)
			case own(item):
				r.imports = append(r.imports, item)
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// splitNames splits a cell at its commas, but for those inside braces.
func splitNames(cell string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range cell {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, cell[start:i])
				start = i + 1
			}
		}
	}
	return append(out, cell[start:])
}

// checkTable returns what the table says that the graph does not: a row
// names a package that does not exist, a package has no row or two, a
// package imports one of the module's packages its row does not name, a
// row names an import none of its packages makes.
func checkTable(g graph, rows []row) []string {
	var problems []string
	covered := map[string]int{}
	for _, r := range rows {
		for _, m := range g.missing(r.paths) {
			problems = append(problems, fmt.Sprintf("architecture.md:%d: %s is no package of the module", r.line, m))
		}
		for _, b := range r.bad {
			problems = append(problems, fmt.Sprintf("architecture.md:%d: %q is not one name (notes go in parentheses)", r.line, b))
		}
		made := map[string]bool{} // the module's packages the row's packages import, but for each other
		for _, p := range g.own() {
			if !matchAny(r.paths, p) {
				continue
			}
			covered[p]++
			for _, imp := range g.ownImports(p) {
				if matchAny(r.paths, imp) {
					continue
				}
				made[imp] = true
				if !matchAny(r.imports, imp) {
					problems = append(problems, fmt.Sprintf("architecture.md:%d: %s imports %s, which its row does not name", r.line, p, imp))
				}
			}
		}
		for _, item := range r.imports {
			if m := g.missing([]string{item}); m != nil {
				problems = append(problems, fmt.Sprintf("architecture.md:%d: imports names %s, which is no package of the module", r.line, strings.Join(m, ", ")))
				continue
			}
			if !slices.ContainsFunc(mapKeys(made), func(imp string) bool { return matchAny([]string{item}, imp) }) {
				problems = append(problems, fmt.Sprintf("architecture.md:%d: imports names %s, which no package of the row imports", r.line, item))
			}
		}
	}
	for _, p := range g.own() {
		if covered[p] != 1 {
			problems = append(problems, fmt.Sprintf("architecture.md: %s has %d rows in the packages table, want 1", p, covered[p]))
		}
	}
	return problems
}

func mapKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestArchitectureTable(t *testing.T) {
	g := moduleGraph(t)
	md, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	tops := map[string]bool{}
	for _, p := range g.own() {
		top, _, _ := strings.Cut(p, "/")
		tops[top] = true
	}
	rows, err := parseTable(string(md), func(name string) bool {
		top, _, _ := strings.Cut(name, "/")
		return tops[top]
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkTable(g, rows) {
		t.Error(p)
	}
}

// claim is a sentence of a package doc that says what the package imports,
// and what it means: which of the module's packages it imports (exactly,
// or at most), or must not import; and, when libs is not nil, which
// packages outside the module and the standard library it may import.
type claim struct {
	pkg    string
	phrase string   // as written in the package doc (spaces normalised)
	own    []string // names of the module's packages
	atMost bool     // own is what it may import, not what it does
	not    bool     // own is what it never imports
	libs   []string // import paths (or "path/...") of libraries; empty: the standard library only
}

var std = []string{}

// claims is every claim of every package doc: a doc that mentions
// importing outside these phrases fails, so does a phrase that is gone.
var claims = []claim{
	{pkg: "api", phrase: "It imports only the standard library, protobuf and connect.", atMost: true, libs: []string{"google.golang.org/protobuf/...", "connectrpc.com/connect"}},
	{pkg: "bench", phrase: "imports nothing of airlock", atMost: true},
	{pkg: "client", phrase: "It imports only api/ and the standard library.", own: []string{"api"}, libs: std},
	{pkg: "internal/audit", phrase: "It imports only the standard library.", libs: std},
	{pkg: "internal/errdefs", phrase: "It imports only the standard library.", libs: std},
	{pkg: "internal/version", phrase: "It imports nothing.", libs: std},
	{pkg: "internal/progress", phrase: "It imports the standard library only.", libs: std},
	{pkg: "internal/editdist", phrase: "It imports nothing of airlock.", atMost: true},
	{pkg: "internal/untrusted", phrase: "It imports nothing of airlock,", atMost: true},
	{pkg: "internal/spec", phrase: "It may import only api/ and errdefs.", own: []string{"api", "internal/errdefs"}, atMost: true},
	{pkg: "internal/store", phrase: "It imports the standard library and the driver only.", libs: []string{"modernc.org/sqlite/..."}},
	{pkg: "internal/tenant", phrase: "never imports", own: []string{"internal/sandbox/..."}, not: true},

	{pkg: "internal/linux/cgroup", phrase: "Only x/sys is imported.", libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/linux/hostpath", phrase: "It imports x/sys only.", libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/linux/landlock", phrase: "Only x/sys and go-landlock are imported.", libs: []string{"golang.org/x/sys/...", "github.com/landlock-lsm/go-landlock/..."}},
	{pkg: "internal/linux/lockfile", phrase: "Only x/sys is imported.", libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/linux/mount", phrase: "Only x/sys is imported.", libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/linux/seccomp/filter", phrase: "Only x/sys is imported.", libs: []string{"golang.org/x/sys/..."}},

	{pkg: "internal/confined/nsinit", phrase: "imports only internal/linux/* and internal/confined/nsinit/rootfs (no net/http, nothing of the host side)", own: []string{"internal/linux/...", "internal/confined/nsinit/rootfs"}},
	{pkg: "internal/confined/nsinit/rootfs", phrase: "like init it imports nothing of airlock but internal/linux/mount.", own: []string{"internal/linux/mount"}},
	{pkg: "internal/wall", phrase: "this package imports nothing of airlock.", atMost: true},
	{pkg: "internal/wall/container", phrase: "It imports internal/wall, internal/wall/container/sealedexe, internal/wall/initexe, internal/wall/uidlease, internal/linux/*, internal/errdefs, internal/cleanup and nsinit (for the wire types), nothing above.", own: []string{"internal/wall", "internal/wall/container/sealedexe", "internal/wall/initexe", "internal/wall/uidlease", "internal/linux/...", "internal/errdefs", "internal/cleanup", "internal/confined/nsinit"}},
	{pkg: "internal/wall/gvisor", phrase: "It imports internal/wall, internal/wall/uidlease, internal/wall/initexe, internal/linux/*, internal/errdefs, internal/cleanup, nsinit (for gvisor-init's wire type) and its rootfs (whose Write makes the generated layer's files, as on the container wall), and internal/workspace/hostcopy (to copy a checkpoint's /tmp and home, which the sandbox wrote), nothing above.", own: []string{"internal/wall", "internal/wall/uidlease", "internal/wall/initexe", "internal/linux/...", "internal/errdefs", "internal/cleanup", "internal/confined/nsinit", "internal/confined/nsinit/rootfs", "internal/workspace/hostcopy"}},
	{pkg: "internal/wall/container/sealedexe", phrase: "It imports x/sys only.", libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/wall/initexe", phrase: "It imports internal/errdefs, internal/version and x/sys only.", own: []string{"internal/errdefs", "internal/version"}, libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/wall/uidlease", phrase: "It imports internal/linux/lockfile only.", own: []string{"internal/linux/lockfile"}, libs: std},

	{pkg: "internal/image", phrase: "It imports its subpackages, go-containerregistry, internal/errdefs, internal/editdist, internal/progress and x/sys.", own: []string{"internal/image/{rootfs,unpack}", "internal/errdefs", "internal/editdist", "internal/progress"}, libs: []string{"github.com/google/go-containerregistry/...", "golang.org/x/sys/..."}},
	{pkg: "internal/image/rootfs", phrase: "It imports internal/errdefs and x/sys.", own: []string{"internal/errdefs"}, libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/image/unpack", phrase: "It imports internal/errdefs and x/sys.", own: []string{"internal/errdefs"}, libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/workspace", phrase: "It imports internal/workspace/safefs, internal/untrusted, go-udiff and x/sys.", own: []string{"internal/workspace/safefs", "internal/untrusted"}, libs: []string{"github.com/aymanbagabas/go-udiff/...", "golang.org/x/sys/..."}},
	{pkg: "internal/workspace/safefs", phrase: "It imports internal/untrusted and x/sys only;", own: []string{"internal/untrusted"}, libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/workspace/checkout", phrase: "It imports go-git, internal/workspace/safefs, internal/errdefs and x/sys.", own: []string{"internal/workspace/safefs", "internal/errdefs"}, libs: []string{"github.com/go-git/...", "golang.org/x/sys/..."}},
	{pkg: "internal/workspace/hostcopy", phrase: "It imports internal/workspace/safefs, internal/untrusted, internal/errdefs and x/sys.", own: []string{"internal/workspace/safefs", "internal/untrusted", "internal/errdefs"}, libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/workspace/snapshot", phrase: "It imports internal/workspace/safefs and x/sys.", own: []string{"internal/workspace/safefs"}, libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/workspace/internal/wstest", phrase: "It imports x/sys only.", libs: []string{"golang.org/x/sys/..."}},
	{pkg: "internal/testutil/tartest", phrase: "It imports the standard library only.", libs: std},
	{pkg: "internal/testutil/memlog", phrase: "It imports internal/audit only.", own: []string{"internal/audit"}, libs: std},

	{pkg: "internal/netns", phrase: "It imports netlink, netns, nftables, x/sys and internal/linux/lockfile.", own: []string{"internal/linux/lockfile"}, libs: []string{"github.com/vishvananda/netlink/...", "github.com/vishvananda/netns", "github.com/google/nftables/...", "golang.org/x/sys/..."}},
	{pkg: "internal/egress", phrase: "It imports its subpackages and the standard library.", own: []string{"internal/egress/{dns,eventlog,policy,sni}"}, libs: std},
	{pkg: "internal/egress/dns", phrase: "It imports internal/egress/policy, internal/egress/eventlog and miekg/dns.", own: []string{"internal/egress/policy", "internal/egress/eventlog"}, libs: []string{"github.com/miekg/dns"}},
	{pkg: "internal/egress/eventlog", phrase: "It imports internal/untrusted and the standard library.", own: []string{"internal/untrusted"}, libs: std},
	{pkg: "internal/egress/policy", phrase: "it imports internal/editdist, the standard library and yaml.", own: []string{"internal/editdist"}, libs: []string{"gopkg.in/yaml.v3"}},
	{pkg: "internal/egress/sni", phrase: "It imports the standard library only.", libs: std},
	{pkg: "internal/egress/internal/tlstest", phrase: "It imports the standard library only.", libs: std},
	{pkg: "internal/broker/keys", phrase: "It imports only the standard library.", libs: std},
	{pkg: "internal/audit/record", phrase: "It imports internal/audit (the log), internal/spec (a sandbox's spec), internal/egress/eventlog (the egress record is the proxy's Event), internal/workspace (a change's type), internal/scan (the rule set's name) and internal/errdefs.",
		own: []string{"internal/audit", "internal/spec", "internal/egress/eventlog", "internal/workspace", "internal/scan", "internal/errdefs"}, libs: std},

	{pkg: "internal/portfront", phrase: "It imports api, the service (internal/sandbox, its core and ports), internal/tenant, the broker's key type (internal/broker/keys: the MAC that signs tokens, from a key file of its own) and internal/errdefs.",
		own: []string{"api", "internal/sandbox", "internal/sandbox/{core,ports}", "internal/tenant", "internal/broker/keys", "internal/errdefs"}, libs: std},

	{pkg: "internal/cli", phrase: "It imports internal/cli/host, internal/cli/remote, internal/cli/admin, internal/cli/cmdutil, api, internal/system, internal/mcp, internal/sandbox, internal/tenant, internal/audit, internal/audit/record, internal/store, internal/spec, internal/errdefs, internal/untrusted and internal/version.",
		own: []string{"internal/cli/{host,remote,admin,cmdutil}", "api", "internal/system", "internal/mcp", "internal/sandbox", "internal/tenant", "internal/audit", "internal/audit/record", "internal/store", "internal/spec", "internal/errdefs", "internal/untrusted", "internal/version"}},
	{pkg: "internal/cli/admin", phrase: "the package imports api, internal/cli/cmdutil and internal/errdefs, nothing of the engine.", own: []string{"api", "internal/cli/cmdutil", "internal/errdefs"}},
	{pkg: "internal/cli/cmdutil", phrase: "It imports api, client, internal/spec, internal/errdefs, internal/progress and internal/untrusted, and nothing of the engine", own: []string{"api", "client", "internal/spec", "internal/errdefs", "internal/progress", "internal/untrusted"}},
	{pkg: "internal/cli/host", phrase: "It imports api, internal/cli/cmdutil, internal/system, internal/run, internal/sandboxnet, internal/doctor, internal/sandbox, internal/spec and internal/errdefs.",
		own: []string{"api", "internal/cli/cmdutil", "internal/system", "internal/run", "internal/sandboxnet", "internal/doctor", "internal/sandbox", "internal/spec", "internal/errdefs"}},
	{pkg: "internal/cli/remote", phrase: "It imports api, client, internal/cli/cmdutil, internal/spec, internal/errdefs, internal/progress and internal/untrusted, nothing of the engine.", own: []string{"api", "client", "internal/cli/cmdutil", "internal/spec", "internal/errdefs", "internal/progress", "internal/untrusted"}},
}

// importWord is how a doc speaks of importing.
var importWord = regexp.MustCompile(`(?i)\bimport(s|ed|ing)?\b`)

// checkClaims returns every claim the graph makes false, every claim whose
// phrase is gone from its package's doc, and every mention of importing in
// a package doc that no claim covers.
func checkClaims(g graph, claims []claim) []string {
	var problems []string
	spans := map[string][][2]int{} // package → where its claims are in its doc
	for _, c := range claims {
		i := g[c.pkg]
		if i == nil || !i.Own {
			problems = append(problems, fmt.Sprintf("claim of %s: no package of the module", c.pkg))
			continue
		}
		at := strings.Index(i.Doc, c.phrase)
		if at < 0 {
			problems = append(problems, fmt.Sprintf("%s: its doc no longer says %q: update claims", c.pkg, c.phrase))
			continue
		}
		spans[c.pkg] = append(spans[c.pkg], [2]int{at, at + len(c.phrase)})
		for _, m := range g.missing(c.own) {
			problems = append(problems, fmt.Sprintf("%s claims %q of %s, which is no package of the module", c.pkg, c.phrase, m))
		}
		imports := g.ownImports(c.pkg)
		for _, imp := range imports {
			if matchAny(c.own, imp) == c.not {
				problems = append(problems, fmt.Sprintf("%s says %q and imports %s", c.pkg, c.phrase, imp))
			}
		}
		if !c.atMost && !c.not {
			for _, n := range c.own {
				for _, p := range expand(n) {
					if !slices.ContainsFunc(imports, func(imp string) bool { return match(p, imp) }) {
						problems = append(problems, fmt.Sprintf("%s says %q and does not import %s", c.pkg, c.phrase, p))
					}
				}
			}
		}
		if c.libs != nil {
			for _, imp := range i.Imports {
				if d := g[imp]; d != nil && !d.Own && !d.Standard && !matchAny(c.libs, imp) {
					problems = append(problems, fmt.Sprintf("%s says %q and imports %s", c.pkg, c.phrase, imp))
				}
			}
		}
	}
	for _, p := range g.own() {
		if p == "internal/archtest" {
			continue // its doc speaks of the imports of the others
		}
	mentions:
		for _, m := range importWord.FindAllStringIndex(g[p].Doc, -1) {
			for _, s := range spans[p] {
				if m[0] >= s[0] && m[1] <= s[1] {
					continue mentions
				}
			}
			problems = append(problems, fmt.Sprintf("%s: its doc speaks of imports (%q) that no claim checks: add one to claims", p, around(g[p].Doc, m[0])))
		}
	}
	return problems
}

func around(s string, at int) string {
	return s[max(0, at-40):min(len(s), at+40)]
}

func TestPackageDocsClaims(t *testing.T) {
	for _, p := range checkClaims(moduleGraph(t), claims) {
		t.Error(p)
	}
}

func TestEveryPackageSaysWhatItOwns(t *testing.T) {
	g := moduleGraph(t)
	for _, p := range g.own() {
		if g[p].GoFiles > 0 && g[p].Doc == "" {
			t.Errorf("%s has no package doc", p)
		}
	}
}
