package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// The README lists every option and every error of the package: a new
// one that it does not name fails here.
func TestReadmeListsOptionsAndErrors(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && strings.HasPrefix(d.Name.Name, "With") && d.Name.IsExported() {
					names = append(names, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if vs, ok := s.(*ast.ValueSpec); ok {
						for _, n := range vs.Names {
							if strings.HasPrefix(n.Name, "Err") {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d options and errors: %v", len(names), names)
	}
	for _, n := range names {
		if !strings.Contains(string(readme), "`"+n) {
			t.Errorf("README.md does not name %s", n)
		}
	}
}
