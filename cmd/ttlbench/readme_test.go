package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/internal/readmetest"
)

// TestReadme runs every command of README.md as from the repository's
// root, with the ttlbench built from this tree for go run ./cmd/ttlbench,
// on the traces in testdata, and checks what each prints. It runs in a
// directory of its own: the charts the commands write land there.
func TestReadme(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "ttlbench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	root := t.TempDir()
	testdata, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(root, "cmd", "ttlbench", "testdata"), os.DirFS(testdata)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	readmetest.Run(t, "README.md", readmetest.Options{
		Dir:     root,
		Replace: []string{"go run ./cmd/ttlbench", bin},
	})
	if _, err := os.Stat(filepath.Join(root, "docs", "ttlbench.svg")); err != nil {
		t.Errorf("the README's -svg docs/ttlbench.svg wrote no chart: %v", err)
	}
}
