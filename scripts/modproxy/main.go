// Command modproxy builds a file-based Go module proxy (GOPROXY=file://DIR)
// that serves this repository's modules, as they are in the working tree,
// at one version: the root module and each nested module named on the
// command line.
//
//	go run . -o DIR -version v0.1.0 -repo ../.. . otelidem idemsql
//
// It writes, for each module, what the proxy protocol asks for
// (https://go.dev/ref/mod#goproxy-protocol): @v/list, @v/VERSION.info,
// @v/VERSION.mod and @v/VERSION.zip. The zip holds what the go command
// would put in it: the module's files that git tracks or would track (not
// ignored ones), less the directories of other modules (any directory with
// a go.mod of its own), VCS directories, vendor directories and anything
// that is not a regular file, under the prefix MODULE@VERSION/. The .mod
// is the module's go.mod, byte for byte, replace directives included: the
// go command ignores those of a dependency, which is what the check that
// uses this proxy (scripts/modcheck) proves harmless.
//
// It needs git and the standard library only: the core module's go.mod
// stays as it is, and golang.org/x/mod is not needed.
package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
)

// Limits of the go command on a module zip (golang.org/x/mod/zip).
const (
	maxZipFile = 500 << 20
	maxGoMod   = 16 << 20
)

func main() {
	out := flag.String("o", "", "write the proxy to `DIR` (created; its module directories are replaced)")
	version := flag.String("version", "", "the `version` every module is served at, such as v0.1.0")
	repo := flag.String("repo", ".", "the repository's root `directory`")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: modproxy -o DIR -version VERSION [-repo DIR] MODULE_DIR...\n\n"+
			"Builds a file-based GOPROXY serving the modules in the MODULE_DIRs (relative to -repo; . is the root module)\n"+
			"from the working tree, all at VERSION.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if !semver.MatchString(*version) {
		fmt.Fprintf(os.Stderr, "modproxy: -version %q: want a release version such as v0.1.0\n", *version)
		os.Exit(2)
	}
	if err := build(*out, *version, *repo, flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "modproxy: %v\n", err)
		os.Exit(1)
	}
}

// semver matches the release versions modproxy serves (no pre-release, no
// build metadata: a tag a release would cut).
var semver = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// build writes the proxy for the modules in dirs.
func build(out, version, repo string, dirs []string) error {
	repo, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	files, err := listFiles(repo)
	if err != nil {
		return err
	}
	roots := moduleRoots(files)
	t, err := commitTime(repo)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		d = path.Clean(filepath.ToSlash(d))
		if !slices.Contains(roots, d) {
			return fmt.Errorf("%s: no go.mod there (modules: %s)", d, strings.Join(roots, ", "))
		}
		if err := writeModule(out, version, repo, d, files, roots, t); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
	}
	return nil
}

// listFiles returns the repository's files that git tracks or would track,
// as slash-separated paths relative to repo, sorted. Files deleted from the
// working tree are left out.
func listFiles(repo string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var files []string
	for f := range strings.SplitSeq(string(b), "\x00") {
		if f == "" {
			continue
		}
		fi, err := os.Lstat(filepath.Join(repo, filepath.FromSlash(f)))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			continue // symlinks and the like: the go command leaves them out
		}
		files = append(files, f)
	}
	slices.Sort(files)
	return slices.Compact(files), nil
}

// moduleRoots returns the directories that hold a go.mod: "." for the
// repository's root, then the nested modules'.
func moduleRoots(files []string) []string {
	var roots []string
	for _, f := range files {
		if path.Base(f) == "go.mod" {
			roots = append(roots, path.Dir(f))
		}
	}
	return roots
}

// commitTime returns the time of the working tree's commit, for the .info
// files.
func commitTime(repo string) (time.Time, error) {
	cmd := exec.Command("git", "log", "-1", "--format=%cI")
	cmd.Dir = repo
	b, err := cmd.Output()
	if err != nil {
		return time.Time{}, fmt.Errorf("git log: %v", err)
	}
	return time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
}

// writeModule writes the proxy's files for the module in dir.
func writeModule(out, version, repo, dir string, files, roots []string, t time.Time) error {
	gomod, err := os.ReadFile(filepath.Join(repo, filepath.FromSlash(dir), "go.mod"))
	if err != nil {
		return err
	}
	if len(gomod) > maxGoMod {
		return fmt.Errorf("go.mod is larger than %d bytes", maxGoMod)
	}
	mod := modulePath(gomod)
	if mod == "" {
		return errors.New("go.mod has no module line")
	}
	esc, err := escapePath(mod)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.RemoveAll(vdir); err != nil {
		return err
	}
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, t.UTC()})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".info"), info, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".mod"), gomod, 0o644); err != nil {
		return err
	}
	if err := writeZip(filepath.Join(vdir, version+".zip"), mod+"@"+version, repo, dir, files, roots); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(vdir, "list"), []byte(version+"\n"), 0o644)
}

// modulePath returns the path on gomod's module line.
func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// escapePath escapes a module path for the proxy's file names: each upper
// case letter becomes '!' and its lower case.
func escapePath(p string) (string, error) {
	var b strings.Builder
	for _, r := range p {
		switch {
		case r == '!' || r >= unicode.MaxASCII:
			return "", fmt.Errorf("module path %q: not one modproxy can serve", p)
		case 'A' <= r && r <= 'Z':
			b.WriteByte('!')
			b.WriteRune(unicode.ToLower(r))
		default:
			b.WriteRune(r)
		}
	}
	return b.String(), nil
}

// inModule reports whether the repository's file f belongs to the module
// in dir: it is under dir and under no deeper module's directory, nor in a
// vendor or VCS directory.
func inModule(f, dir string, roots []string) (string, bool) {
	rel := f
	if dir != "." {
		var ok bool
		if rel, ok = strings.CutPrefix(f, dir+"/"); !ok {
			return "", false
		}
	}
	for _, r := range roots {
		if r != dir && (dir == "." || strings.HasPrefix(r, dir+"/")) && strings.HasPrefix(f, r+"/") {
			return "", false // another module's
		}
	}
	for _, part := range strings.Split(path.Dir(rel), "/") {
		switch part {
		case "vendor", ".git", ".hg", ".svn", ".bzr":
			return "", false
		}
	}
	return rel, true
}

// writeZip writes the module zip of the module in dir, its files under
// prefix (MODULE@VERSION).
func writeZip(name, prefix, repo, dir string, files, roots []string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".zip-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	zw := zip.NewWriter(tmp)
	var total int64
	seen := map[string]string{} // lower-cased path: path (the go command refuses paths equal but for case)
	for _, f := range files {
		rel, ok := inModule(f, dir, roots)
		if !ok {
			continue
		}
		if prev, dup := seen[strings.ToLower(rel)]; dup {
			return fmt.Errorf("%s and %s differ only in case: the go command refuses such a module", prev, rel)
		}
		seen[strings.ToLower(rel)] = rel
		src, err := os.Open(filepath.Join(repo, filepath.FromSlash(f)))
		if err != nil {
			return err
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: prefix + "/" + rel, Method: zip.Deflate})
		if err == nil {
			var n int64
			n, err = io.Copy(w, src)
			total += n
		}
		src.Close()
		if err != nil {
			return err
		}
		if total > maxZipFile {
			return fmt.Errorf("the module's files add up to more than %d bytes", maxZipFile)
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
