package redistest_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/redistest"
)

// recordingTB records Skip and Fatal instead of ending the test, so that
// a test can check what a helper reported. Unlike the real ones, its Skip
// and Fatal return to the caller.
type recordingTB struct {
	testing.TB
	skipped string
	fatal   string
}

func (r *recordingTB) Helper()                   {}
func (r *recordingTB) Skip(args ...any)          { r.skipped = fmt.Sprint(args...) }
func (r *recordingTB) Skipf(f string, a ...any)  { r.skipped = fmt.Sprintf(f, a...) }
func (r *recordingTB) Fatal(args ...any)         { r.fatal = fmt.Sprint(args...) }
func (r *recordingTB) Fatalf(f string, a ...any) { r.fatal = fmt.Sprintf(f, a...) }

func TestRequireSkipsWithoutRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("checks what happens without -short (TestShortSkipsRealRedis checks -short)")
	}
	t.Setenv("PATH", t.TempDir())
	t.Setenv(redistest.RequireEnv, "")
	r := &recordingTB{TB: t}
	if s := redistest.Start(r, redistest.Config{}); s != nil {
		t.Error("Start without redis-server returned a server")
	}
	if !strings.Contains(r.skipped, "redis-server not found on PATH") {
		t.Errorf("skip message = %q, want it to say redis-server was not found", r.skipped)
	}
	if r.fatal != "" {
		t.Errorf("failed with %q, want a skip", r.fatal)
	}
}

func TestRequireFailsWhenRequired(t *testing.T) {
	if testing.Short() {
		t.Skip("checks what happens without -short (TestShortSkipsRealRedis checks -short)")
	}
	t.Setenv("PATH", t.TempDir())
	t.Setenv(redistest.RequireEnv, "1")
	r := &recordingTB{TB: t}
	redistest.Require(r)
	if !strings.Contains(r.fatal, "redis-server not found") || !strings.Contains(r.fatal, redistest.RequireEnv) {
		t.Errorf("fatal message = %q, want it to name redis-server and %s", r.fatal, redistest.RequireEnv)
	}
	if r.skipped != "" {
		t.Errorf("skipped with %q, want a failure", r.skipped)
	}
}

func TestStartFailureShowsLog(t *testing.T) {
	t.Parallel()
	redistest.Require(t)
	r := &recordingTB{TB: t}
	s := redistest.Start(r, redistest.Config{Extra: []string{"no-such-directive yes"}})
	if s != nil {
		t.Error("Start with a bad directive returned a server")
	}
	if !strings.Contains(r.fatal, "no-such-directive") || !strings.Contains(r.fatal, "redis.log") {
		t.Errorf("failure = %q, want the end of the server's log, which names the bad directive", r.fatal)
	}
}

// TestShortSkipsRealRedis runs itself again with -test.short, and
// IDEM_REQUIRE_REDIS=1: there Start must skip, saying why, not fail.
func TestShortSkipsRealRedis(t *testing.T) {
	if testing.Short() {
		r := &recordingTB{TB: t}
		if s := redistest.Start(r, redistest.Config{}); s != nil {
			t.Error("Start under -short returned a server")
		}
		if r.fatal != "" || !strings.Contains(r.skipped, "skipped with -short") {
			t.Errorf("under -short: skipped %q, failed %q; want a skip that names -short", r.skipped, r.fatal)
		}
		fmt.Println("short child: checked")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.short", "-test.run=^TestShortSkipsRealRedis$", "-test.v")
	cmd.Env = append(os.Environ(), redistest.RequireEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "short child: checked") {
		t.Fatalf("the test binary under -short: %v\n%s", err, out)
	}
}
