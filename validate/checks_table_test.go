package validate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/validate/judge"
)

// TestEveryEmittedCheckHasARow reads the root's source: every value put in
// a row's Check field, passed to coverageRow as its check or to tolerance
// as the check whose threshold it wants, must be a judge check constant
// with a row in judge.Checks, and every row must be emitted somewhere. A
// check added as a bare string, or a row no code emits, fails here.
func TestEveryEmittedCheckHasARow(t *testing.T) {
	consts := judgeStringConsts(t)
	fset := token.NewFileSet()
	emitted := map[string]bool{}
	sites := 0
	use := func(e ast.Expr) {
		sites++
		pos := fset.Position(e.Pos())
		if id, ok := e.(*ast.Ident); ok && id.Name == "check" {
			return // coverageRow's parameter: its callers are checked
		}
		sel, ok := e.(*ast.SelectorExpr)
		if ok {
			x, isIdent := sel.X.(*ast.Ident)
			ok = isIdent && x.Name == "judge"
		}
		if !ok {
			t.Errorf("%s: a check named by %T, not by a judge constant", pos, e)
			return
		}
		name, ok := consts[sel.Sel.Name]
		if !ok {
			t.Errorf("%s: judge.%s is not a check name", pos, sel.Sel.Name)
			return
		}
		if !slices.ContainsFunc(judge.Checks, func(c judge.Check) bool { return c.Name == name }) {
			t.Errorf("%s: check %q has no row in judge.Checks", pos, name)
		}
		emitted[name] = true
	}
	for _, af := range parseSources(t, fset, "*.go") {
		ast.Inspect(af, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for i, lhs := range n.Lhs {
					if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "Check" && len(n.Rhs) == len(n.Lhs) {
						use(n.Rhs[i])
					}
				}
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok && k.Name == "Check" {
					use(n.Value)
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
					switch {
					case sel.Sel.Name == "coverageRow" && len(n.Args) > 1:
						use(n.Args[1])
					case sel.Sel.Name == "tolerance" && len(n.Args) == 2:
						use(n.Args[0])
					}
				}
			}
			return true
		})
	}
	if sites < len(judge.Checks) {
		t.Fatalf("found %d places that name a check, fewer than the %d rows: the scan misses them", sites, len(judge.Checks))
	}
	for _, c := range judge.Checks {
		if !emitted[c.Name] {
			t.Errorf("row %s: no code emits it", c.Name)
		}
	}
}

// judgeStringConsts maps judge's exported string constants to their values.
func judgeStringConsts(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, af := range parseSources(t, token.NewFileSet(), "judge/*.go") {
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						out[id.Name] = v
					}
				}
			}
		}
	}
	if len(out) < len(judge.Checks) {
		t.Fatalf("read %d string constants in judge, fewer than its %d checks", len(out), len(judge.Checks))
	}
	return out
}

// parseSources parses the Go files that match pattern, tests left out.
func parseSources(t *testing.T, fset *token.FileSet, pattern string) []*ast.File {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	var out []*ast.File
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, af)
	}
	return out
}
