package idemtest

import (
	"flag"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// inChildEnv names, in a child of RunInChild, the test it runs.
const inChildEnv = "IDEMTEST_IN_CHILD"

// RunInChild runs the calling top-level test in a child process of its
// own: this test binary run again for that test only, started at once.
// In the parent it then makes the test parallel, waits for the child, and
// passes, fails or skips as the child's run of the test did, with its
// output; it returns true, and the test returns. In the child it returns
// false, and the test's body runs, alone in its process.
//
// It serves two kinds of test: those that need their process to
// themselves (a goroutine-leak check, GOMAXPROCS), which would otherwise
// run serially before every parallel test, and long ones, which start
// when the serial pass of the tests reaches them rather than when a
// parallel slot frees up. A subtest runs in its parent's process: it
// returns false at once.
func RunInChild(t *testing.T) (parent bool) {
	t.Helper()
	if strings.Contains(t.Name(), "/") || os.Getenv(inChildEnv) == t.Name() {
		return false
	}
	// The output goes to a file, not a pipe: no goroutine of this process
	// copies it, for the leak checks of the serial tests that run
	// meanwhile.
	out, err := os.CreateTemp(t.TempDir(), "child")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1", "-test.v=true"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	flag.Visit(func(f *flag.Flag) {
		// The test's own flags (-rapid.checks, -soak) and -short go to
		// the child; the other flags of package testing are this run's.
		if !strings.HasPrefix(f.Name, "test.") || f.Name == "test.short" {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), inChildEnv+"="+t.Name())
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childSysProcAttr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	t.Parallel()
	err = cmd.Wait()
	waited = true
	b, rerr := os.ReadFile(out.Name())
	if rerr != nil {
		t.Fatal(rerr)
	}
	output := string(b)
	switch {
	case err != nil:
		t.Fatalf("in a child process (%v):\n%s", err, output)
	case strings.Contains(output, "--- SKIP: "+t.Name()+" "):
		t.Skipf("in a child process:\n%s", output)
	case !strings.Contains(output, "--- PASS: "+t.Name()+" "):
		t.Fatalf("in a child process, which did not run the test:\n%s", output)
	case testing.Verbose():
		t.Logf("in a child process:\n%s", output)
	}
	return true
}
