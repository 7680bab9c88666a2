package archtest

import (
	"slices"
	"strings"
	"testing"
)

// fake is a graph of the module's packages (keys of own, with their direct
// imports) and the libraries they import (any other name; "net/http" and
// the like are the standard library, names with a dot in their first
// element are not).
func fake(own map[string][]string, docs map[string]string) graph {
	g := graph{}
	for p, imports := range own {
		g[p] = &pkg{Own: true, Imports: imports, Doc: docs[p], GoFiles: 1}
	}
	for _, imports := range own {
		for _, imp := range imports {
			if g[imp] == nil {
				first, _, _ := strings.Cut(imp, "/")
				g[imp] = &pkg{Standard: !strings.Contains(first, "."), GoFiles: 1}
			}
		}
	}
	return g
}

// wantProblem fails t unless one of the problems found contains every
// part. (A fault may show more than once: a package in no layer is also
// one that others may not reach.)
func wantProblem(t *testing.T, problems []string, parts ...string) {
	t.Helper()
	for _, p := range problems {
		if !slices.ContainsFunc(parts, func(part string) bool { return !strings.Contains(p, part) }) {
			return
		}
	}
	t.Fatalf("want a problem containing %q, got %q", parts, problems)
}

// A small module: a service over a lifecycle over a kernel wrapper.
var small = map[string][]string{
	"internal/service":     {"internal/lifecycle"},
	"internal/lifecycle":   {"internal/linux/mount", "golang.org/x/sys/unix"},
	"internal/linux/mount": {"golang.org/x/sys/unix"},
}

var smallLayers = []layer{
	{"kernel", []string{"internal/linux/..."}, nil},
	{"lifecycle", []string{"internal/lifecycle"}, []string{"kernel"}},
	{"service", []string{"internal/service"}, []string{"lifecycle", "kernel"}},
}

func TestLayersPassWhatTheyAllow(t *testing.T) {
	if p := checkLayers(fake(small, nil), smallLayers); p != nil {
		t.Fatal(p)
	}
}

func TestLayersFailOnAMissingPackage(t *testing.T) {
	rules := append(smallLayers[:len(smallLayers):len(smallLayers)], layer{"gone", []string{"internal/daemon"}, nil})
	wantProblem(t, checkLayers(fake(small, nil), rules), `"gone"`, "internal/daemon", "no package")
}

func TestLayersFailOnAnUnknownLayer(t *testing.T) {
	rules := []layer{smallLayers[0], {"lifecycle", []string{"internal/lifecycle"}, []string{"kernel", "kernal"}}, smallLayers[2]}
	wantProblem(t, checkLayers(fake(small, nil), rules), `"kernal"`)
}

func TestLayersFailOnAnUnplacedPackage(t *testing.T) {
	wantProblem(t, checkLayers(fake(small, nil), smallLayers[1:]), "internal/linux/mount", "in no layer")
}

func TestLayersFailOnAPackagePlacedTwice(t *testing.T) {
	rules := append(smallLayers[:len(smallLayers):len(smallLayers)], layer{"also", []string{"internal/linux/mount"}, nil})
	wantProblem(t, checkLayers(fake(small, nil), rules), "internal/linux/mount", "2 lines")
}

func TestLayersFailOnAForbiddenTransitiveImport(t *testing.T) {
	// The service may use the lifecycle but not reach the kernel, which
	// it imports nowhere itself: the chain names who brings it in.
	rules := []layer{smallLayers[0], smallLayers[1], {"service", []string{"internal/service"}, []string{"lifecycle"}}}
	wantProblem(t, checkLayers(fake(small, nil), rules),
		`"service" may not reach internal/linux/mount`, "internal/service → internal/lifecycle → internal/linux/mount")
}

func TestBanFailsOnATransitiveReach(t *testing.T) {
	wantProblem(t, checkBan(fake(small, nil), []string{"internal/service"}, "golang.org/x/sys/unix", false),
		"internal/service → internal/lifecycle → golang.org/x/sys/unix")
	if p := checkBan(fake(small, nil), []string{"internal/service"}, "golang.org/x/sys/unix", true); p != nil {
		t.Fatalf("the service does not import x/sys itself: %q", p)
	}
}

func TestBanFailsWhenItChecksNothing(t *testing.T) {
	wantProblem(t, checkBan(fake(small, nil), []string{"internal/daemon"}, "golang.org/x/sys/unix", false), "internal/daemon", "no package")
	wantProblem(t, checkBan(fake(small, nil), []string{"internal/service"}, "net/htp", false), "net/htp", "nothing in the build imports it")
}

func TestKnownOnlyToFails(t *testing.T) {
	g := fake(small, nil)
	if p := checkImporters(g, "internal/lifecycle", []string{"internal/service"}); p != nil {
		t.Fatal(p)
	}
	wantProblem(t, checkImporters(g, "internal/linux/mount", []string{"internal/service"}), "internal/lifecycle imports internal/linux/mount")
	wantProblem(t, checkImporters(g, "internal/lifecycle", []string{"internal/service", "internal/system"}), "internal/system", "no package")
}

const smallTable = `# x

## Packages (as built)

| path | owns | imports |
|---|---|---|
| internal/service | the service | internal/lifecycle (its Backend) |
| internal/lifecycle | the lifecycle | internal/linux/..., x/sys |
| internal/linux/{mount} | the kernel | x/sys |

after
`

func tableProblems(t *testing.T, g graph, md string) []string {
	t.Helper()
	rows, err := parseTable(md, func(name string) bool { return strings.HasPrefix(name, "internal/") })
	if err != nil {
		t.Fatal(err)
	}
	return checkTable(g, rows)
}

func TestTablePassesWhenTrue(t *testing.T) {
	if p := tableProblems(t, fake(small, nil), smallTable); p != nil {
		t.Fatal(p)
	}
}

func TestTableFailsOnAnUnnamedImport(t *testing.T) {
	md := strings.Replace(smallTable, "internal/lifecycle (its Backend)", "—", 1)
	wantProblem(t, tableProblems(t, fake(small, nil), md), "internal/service imports internal/lifecycle, which its row does not name")
}

func TestTableFailsOnAStaleImport(t *testing.T) {
	md := strings.Replace(smallTable, "internal/lifecycle (its Backend)", "internal/lifecycle, internal/linux/mount", 1)
	wantProblem(t, tableProblems(t, fake(small, nil), md), "internal/linux/mount, which no package of the row imports")
}

func TestTableFailsOnAMissingPackage(t *testing.T) {
	md := strings.Replace(smallTable, "internal/lifecycle (its Backend)", "internal/lifecycle, internal/daemon", 1)
	wantProblem(t, tableProblems(t, fake(small, nil), md), "internal/daemon, which is no package")
	md = strings.Replace(smallTable, "{mount}", "{mount,cgroup}", 1)
	wantProblem(t, tableProblems(t, fake(small, nil), md), "internal/linux/cgroup is no package")
}

func TestTableFailsOnAPackageWithoutARow(t *testing.T) {
	own := map[string][]string{"internal/errdefs": nil}
	for p, imports := range small {
		own[p] = imports
	}
	wantProblem(t, tableProblems(t, fake(own, nil), smallTable), "internal/errdefs has 0 rows")
}

func TestTableFailsOnProse(t *testing.T) {
	md := strings.Replace(smallTable, "internal/lifecycle (its Backend)", "internal/lifecycle and its kernel", 1)
	wantProblem(t, tableProblems(t, fake(small, nil), md), `"internal/lifecycle and its kernel" is not one name`)
}

func TestClaimsFail(t *testing.T) {
	docs := map[string]string{
		"internal/lifecycle":   "Package lifecycle builds. It imports internal/linux/mount and x/sys.",
		"internal/linux/mount": "Package mount mounts. Only x/sys is imported.",
		"internal/service":     "Package service serves.",
	}
	good := []claim{
		{pkg: "internal/lifecycle", phrase: "It imports internal/linux/mount and x/sys.", own: []string{"internal/linux/mount"}, libs: []string{"golang.org/x/sys/..."}},
		{pkg: "internal/linux/mount", phrase: "Only x/sys is imported.", libs: []string{"golang.org/x/sys/..."}},
	}
	if p := checkClaims(fake(small, docs), good); p != nil {
		t.Fatal(p)
	}

	t.Run("phrase gone", func(t *testing.T) {
		wantProblem(t, checkClaims(fake(small, docs), append(good[1:], claim{pkg: "internal/lifecycle", phrase: "It imports internal/linux/mount.", own: []string{"internal/linux/mount"}})),
			"no longer says", "It imports internal/linux/mount.")
	})
	t.Run("mention unchecked", func(t *testing.T) {
		wantProblem(t, checkClaims(fake(small, docs), good[:1]), "internal/linux/mount", "no claim checks")
	})
	t.Run("claim false", func(t *testing.T) {
		d := map[string]string{"internal/service": "Package service serves. It imports nothing of airlock."}
		wantProblem(t, checkClaims(fake(small, d), []claim{{pkg: "internal/service", phrase: "It imports nothing of airlock.", atMost: true}}),
			"imports internal/lifecycle")
	})
	t.Run("import claimed and not made", func(t *testing.T) {
		d := map[string]string{"internal/service": "Package service serves. It imports internal/lifecycle and internal/linux/mount."}
		wantProblem(t, checkClaims(fake(small, d), []claim{{pkg: "internal/service", phrase: "It imports internal/lifecycle and internal/linux/mount.", own: []string{"internal/lifecycle", "internal/linux/mount"}}}),
			"does not import internal/linux/mount")
	})
	t.Run("library not claimed", func(t *testing.T) {
		d := map[string]string{"internal/linux/mount": "Package mount mounts. It imports the standard library only."}
		wantProblem(t, checkClaims(fake(small, d), []claim{{pkg: "internal/linux/mount", phrase: "It imports the standard library only.", libs: std}}),
			"imports golang.org/x/sys/unix")
	})
	t.Run("never imports", func(t *testing.T) {
		d := map[string]string{"internal/service": "Package service serves; it never imports the lifecycle."}
		wantProblem(t, checkClaims(fake(small, d), []claim{{pkg: "internal/service", phrase: "never imports", own: []string{"internal/lifecycle"}, not: true}}),
			"imports internal/lifecycle")
	})
}
