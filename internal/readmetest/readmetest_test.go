package readmetest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/readmetest"
)

func TestParse(t *testing.T) {
	readme := "# x\n```sh\n$ not run\n```\n```console\n$ echo a \\\n    b   # exit 3\na b\n\n$ true\n```\n"
	cmds, err := readmetest.Parse([]byte(readme))
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 2 {
		t.Fatalf("%d commands, want 2: %+v", len(cmds), cmds)
	}
	if c := cmds[0]; c.Line != 6 || c.Text != "echo a b   # exit 3" || c.Exit != 3 || strings.Join(c.Expected, "|") != "a b" {
		t.Errorf("first command: %+v", c)
	}
	if c := cmds[1]; c.Text != "true" || c.Exit != 0 || len(c.Expected) != 0 {
		t.Errorf("second command: %+v", c)
	}
	for _, bad := range []string{"```console\noutput first\n```\n", "```console\n$ a \\\n```\n", "```console\n$ a\n"} {
		if _, err := readmetest.Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		shown, got string
		want       bool
	}{
		{"a|b", "a|b", true},
		{"a|b", "a|c", false},
		{"a|b", "a", false},
		{"a|...|d", "a|b|c|d", true},
		{"a|...|d", "a|d", true},
		{"a|...", "a|b|c", true},
		{"a|...|d", "a|b|c", false},
		{"x ... z", "x yy z", true},
		{"x ... z", "x yy", false},
		{"...z", "yz", true},
		{"x...", "xyz", true},
		{"a...b...c", "aXbYc", true},
		{"a...b...c", "aXcYb", false},
		{"ab...ba", "aba", false},
	} {
		if got := readmetest.Match(strings.Split(tc.shown, "|"), strings.Split(tc.got, "|")); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.shown, tc.got, got, tc.want)
		}
	}
}

// Run fails a test whose command exits otherwise or prints otherwise than
// shown, and passes one that does as shown.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.md", "```console\n$ echo hello ADDR\nhello 127.0.0.1:1\n$ echo out; echo err >&2; exit 1   # exit 1\nout\nerr\n```\n")
	readmetest.Run(t, good, readmetest.Options{Dir: dir, Replace: []string{"ADDR", "127.0.0.1:1"}})
	for _, bad := range []string{
		"```console\n$ false\n```\n",
		"```console\n$ echo a\nb\n```\n",
		"```console\n$ true   # exit 2\n```\n",
		"no commands\n",
	} {
		p := write("bad.md", bad)
		ft := &failures{TB: t}
		readmetest.Run(ft, p, readmetest.Options{Dir: dir})
		if len(ft.msgs) == 0 {
			t.Errorf("Run of %q passed", bad)
		}
	}
}

// failures records a test's failures instead of failing it.
type failures struct {
	testing.TB
	msgs []string
}

func (f *failures) Helper()                   {}
func (f *failures) Error(args ...any)         { f.msgs = append(f.msgs, fmt.Sprint(args...)) }
func (f *failures) Errorf(s string, a ...any) { f.msgs = append(f.msgs, fmt.Sprintf(s, a...)) }
func (f *failures) Fatal(args ...any)         { f.Error(args...) }
func (f *failures) Fatalf(s string, a ...any) { f.Errorf(s, a...) }
