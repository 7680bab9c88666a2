package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recordWriters are the only packages that may make an audit.Record: the
// log itself (its checkpoints) and the one Recorder every door writes
// through (internal/audit/record).
var recordWriters = []string{"internal/audit", "internal/audit/record"}

// TestRecordsGoThroughTheRecorder: no package but recordWriters builds an
// audit.Record, so every record is of its kind's type and shape, whichever
// door (run, serve, mcp) made it. It fails when it finds none at all (it
// would then be checking nothing).
func TestRecordsGoThroughTheRecorder(t *testing.T) {
	root := "../.."
	found := 0
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if typeName(lit.Type, rel) != "internal/audit.Record" {
				return true
			}
			found++
			allowed := false
			for _, w := range recordWriters {
				allowed = allowed || rel == w
			}
			if !allowed {
				t.Errorf("%s builds an audit.Record: write it through record.Recorder with its kind's type (internal/audit/record)", p)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Error("no audit.Record is built anywhere: this check looks in the wrong place")
	}
}

// typeName names a composite literal's type as "PKG.Name" when it is the
// audit log's Record (audit.Record outside the package, Record inside).
func typeName(e ast.Expr, dir string) string {
	switch x := e.(type) {
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok && id.Name == "audit" {
			return "internal/audit." + x.Sel.Name
		}
	case *ast.Ident:
		if dir == "internal/audit" {
			return "internal/audit." + x.Name
		}
	}
	return ""
}
