package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
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
	options, errs := optionsAndErrors(t, ".")
	names := append(options, errs...)
	if len(names) < 20 {
		t.Fatalf("found only %d options and errors: %v", len(names), names)
	}
	for _, n := range names {
		if !strings.Contains(string(readme), "`"+n) {
			t.Errorf("README.md does not name %s", n)
		}
	}
}

// The README's section on the doors' and drivers' options lists each
// package's options in that package's own paragraph (so that httpidem's
// WithFingerprint does not stand for idemstream's), and its errors.
// The nested modules' directories are read where they are: in this
// repository, not in the core module's download.
func TestReadmeListsTheDoorsOptionsAndErrors(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	const heading = "### The doors' and drivers' options"
	_, section, ok := strings.Cut(string(readme), heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	// A paragraph is a list item, up to the next item or blank line.
	var paragraphs []string
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "- "):
			paragraphs = append(paragraphs, line)
		case line == "" || len(paragraphs) == 0:
			paragraphs = append(paragraphs, "")
		default:
			paragraphs[len(paragraphs)-1] += " " + line
		}
	}
	for _, tc := range []struct {
		dir    string
		nested bool // a module of its own
	}{
		{"httpidem", false}, {"idemstream", false}, {"grpcidem", true},
		{"idemsql", true}, {"idempgx", true}, {"otelidem", true},
	} {
		if _, err := os.Stat(tc.dir); err != nil && tc.nested {
			t.Logf("%s: not here (%v): its module is checked in the repository", tc.dir, err)
			continue
		}
		options, errs := optionsAndErrors(t, tc.dir)
		if len(options) == 0 {
			t.Errorf("%s: no options found", tc.dir)
		}
		var own string // the paragraphs about this package
		for _, p := range paragraphs {
			first, _, _ := strings.Cut(p, "**:")
			if strings.HasPrefix(p, "- **") && strings.Contains(first, "`"+tc.dir+".") {
				own += p + "\n"
			}
		}
		if own == "" {
			t.Errorf("README.md's %q has no paragraph about %s", heading, tc.dir)
			continue
		}
		for _, n := range options {
			if !strings.Contains(own, "`"+n+"(") && !strings.Contains(own, "."+n+"(") {
				t.Errorf("README.md's paragraph about %s does not name %s", tc.dir, n)
			}
		}
		for _, n := range errs {
			if !strings.Contains(section, n+"`") {
				t.Errorf("README.md's %q does not name %s.%s", heading, tc.dir, n)
			}
		}
	}
}

// optionsAndErrors returns the exported functions named With... and the
// variables named Err... of the package in dir.
func optionsAndErrors(t *testing.T, dir string) (options, errs []string) {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && strings.HasPrefix(d.Name.Name, "With") && d.Name.IsExported() {
					options = append(options, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if vs, ok := s.(*ast.ValueSpec); ok {
						for _, n := range vs.Names {
							if strings.HasPrefix(n.Name, "Err") {
								errs = append(errs, n.Name)
							}
						}
					}
				}
			}
		}
	}
	return options, errs
}
