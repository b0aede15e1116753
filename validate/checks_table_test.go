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
// a row's Check field, or passed to tolerance as the check whose threshold
// it wants, must be a judge check constant with a row in judge.Checks, and
// every row must be emitted somewhere. A function may take the check as a
// parameter and put it there (coverageRow, rowJudge's methods): then every
// call of it must pass a judge constant in that place (or a parameter of its
// own, whose callers are held to the same). A check added as a bare string
// or a local variable, or a row no code emits, fails here.
func TestEveryEmittedCheckHasARow(t *testing.T) {
	consts := judgeStringConsts(t)
	fset := token.NewFileSet()
	files := parseSources(t, fset, "*.go")
	// sinks are the calls whose argument is a check: tolerance's first, and
	// every parameter found below to carry a check into a row.
	type sink struct {
		fn  string
		arg int
	}
	sinks := map[sink]bool{{"tolerance", 0}: true}
	// visit calls use for each expression that names a check, with the
	// index of the enclosing function's parameter it is (-1: none).
	visit := func(use func(fn *ast.FuncDecl, e ast.Expr, param int)) {
		for _, af := range files {
			for _, d := range af.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				params := map[string]int{}
				i := 0
				for _, f := range fd.Type.Params.List {
					for _, n := range f.Names {
						params[n.Name] = i
						i++
					}
					if len(f.Names) == 0 {
						i++
					}
				}
				at := func(e ast.Expr) {
					param := -1
					if id, ok := e.(*ast.Ident); ok {
						if p, ok := params[id.Name]; ok {
							param = p
						}
					}
					use(fd, e, param)
				}
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.AssignStmt:
						for i, lhs := range n.Lhs {
							if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "Check" && len(n.Rhs) == len(n.Lhs) {
								at(n.Rhs[i])
							}
						}
					case *ast.KeyValueExpr:
						if k, ok := n.Key.(*ast.Ident); ok && k.Name == "Check" {
							at(n.Value)
						}
					case *ast.CallExpr:
						name := ""
						switch f := n.Fun.(type) {
						case *ast.Ident:
							name = f.Name
						case *ast.SelectorExpr:
							name = f.Sel.Name
						}
						for i, a := range n.Args {
							if sinks[sink{name, i}] {
								at(a)
							}
						}
					}
					return true
				})
			}
		}
	}
	// The parameters that carry a check, to a fixed point.
	for grew := true; grew; {
		grew = false
		visit(func(fd *ast.FuncDecl, _ ast.Expr, param int) {
			if k := (sink{fd.Name.Name, param}); param >= 0 && !sinks[k] {
				sinks[k], grew = true, true
			}
		})
	}
	emitted := map[string]bool{}
	sites := 0
	visit(func(_ *ast.FuncDecl, e ast.Expr, param int) {
		if param >= 0 {
			return // a parameter: its callers are checked
		}
		sites++
		pos := fset.Position(e.Pos())
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
	})
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
