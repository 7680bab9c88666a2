package archtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// pkg is one package of the build (not its tests). A package of the module
// is named by its path inside the module ("internal/lifecycle"); every
// other package by its import path.
type pkg struct {
	Imports  []string // direct, named the same way
	Own      bool     // a package of the module
	Standard bool     // of the standard library
	Doc      string   // the package doc in full, spaces normalised (own packages)
	GoFiles  int      // how many files it builds from (none: tests only)
}

// graph is the module's packages and everything they import.
type graph map[string]*pkg

// own is the module's packages, sorted.
func (g graph) own() []string {
	var out []string
	for p, i := range g {
		if i.Own {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// ownImports is p's direct imports of the module's packages.
func (g graph) ownImports(p string) []string {
	var out []string
	for _, imp := range g[p].Imports {
		if i := g[imp]; i != nil && i.Own {
			out = append(out, imp)
		}
	}
	return out
}

// path finds the shortest import chain from p to target; nil if p does
// not reach target.
func (g graph) path(p, target string) []string {
	parent := map[string]string{p: ""}
	queue := []string{p}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == target {
			return chainTo(parent, cur)
		}
		for _, imp := range g[cur].Imports {
			if _, seen := parent[imp]; !seen && g[imp] != nil {
				parent[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

// chainTo is the chain of imports that parent (who first imported whom)
// recorded down to q.
func chainTo(parent map[string]string, q string) []string {
	var c []string
	for ; q != ""; q = parent[q] {
		c = append(c, q)
	}
	slices.Reverse(c)
	return c
}

func chain(c []string) string { return strings.Join(c, " → ") }

// expand turns one written name into the patterns it stands for: braces
// list siblings ("internal/image/{rootfs,unpack}"), "/..." keeps its Go
// meaning (the package and every package beneath it).
func expand(name string) []string {
	open, close := strings.Index(name, "{"), strings.Index(name, "}")
	if open < 0 || close < open {
		return []string{name}
	}
	var out []string
	for _, alt := range strings.Split(name[open+1:close], ",") {
		out = append(out, expand(name[:open]+alt+name[close+1:])...)
	}
	return out
}

// match reports whether path is named by pattern (after expand).
func match(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return pattern == path
}

// matchAny reports whether path is named by any of the written names.
func matchAny(names []string, path string) bool {
	for _, n := range names {
		for _, p := range expand(n) {
			if match(p, path) {
				return true
			}
		}
	}
	return false
}

// missing is the written names (after expand) that name no package of the
// module: a rule that names them checks nothing.
func (g graph) missing(names []string) []string {
	var out []string
	for _, n := range names {
		for _, p := range expand(n) {
			if !slices.ContainsFunc(g.own(), func(q string) bool { return match(p, q) }) {
				out = append(out, p)
			}
		}
	}
	return out
}

var (
	loadOnce sync.Once
	loaded   graph
	loadErr  error
)

// moduleGraph is the module as `go list -deps` sees it on this platform.
func moduleGraph(t *testing.T) graph {
	t.Helper()
	loadOnce.Do(func() { loaded, loadErr = load("../..") })
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return loaded
}

func load(root string) (graph, error) {
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Standard,Module,Imports,Dir,GoFiles", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("go list: %v\n%s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("go list: %w", err)
	}
	mod := exec.Command("go", "list", "-m")
	mod.Dir = root
	modOut, err := mod.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	module := strings.TrimSpace(string(modOut))
	name := func(importPath string) string {
		if rel, ok := strings.CutPrefix(importPath, module+"/"); ok {
			return rel
		}
		return importPath
	}
	g := graph{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			ImportPath string
			Standard   bool
			Module     *struct{ Path string }
			Imports    []string
			Dir        string
			GoFiles    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		i := &pkg{Standard: p.Standard, Own: p.Module != nil && p.Module.Path == module, GoFiles: len(p.GoFiles)}
		for _, imp := range p.Imports {
			i.Imports = append(i.Imports, name(imp))
		}
		if i.Own {
			if i.Doc, err = packageDoc(p.Dir, p.GoFiles); err != nil {
				return nil, err
			}
		}
		g[name(p.ImportPath)] = i
	}
	return g, nil
}

// packageDoc is every package comment of the package's files, joined, its
// white space normalised to single spaces.
func packageDoc(dir string, files []string) (string, error) {
	var docs []string
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, filepath.Join(dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return "", err
		}
		if af.Doc != nil {
			docs = append(docs, af.Doc.Text())
		}
	}
	return strings.Join(strings.Fields(strings.Join(docs, " ")), " "), nil
}
