//go:build linux

package idem_test

// Rows 6 and 7 of docs/faults.md: an owner in another process is killed, or paused
// past its lease, inside fn. The owner is this test binary run again as a
// child (TestChildOwner), told what to do by environment variables; it
// reports on its stdout, and inside fn waits for a line on its stdin.
// Linux only: the child dies with the test (Pdeathsig), and the tests read
// /proc to see it stopped.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

const (
	// childEnv, set to a Redis address, makes TestChildOwner run; the
	// variables with its name as a prefix say the key and the lease.
	childEnv = "IDEM_TEST_CHILD_OWNER"
	// childTag starts every line the child reports.
	childTag = "idem-child:"
)

// TestChildOwner is the owner process of TestOwnerProcessKilled and
// TestOwnerProcessPaused. It calls Do once; inside fn it reports
// "in fn attempt=N" and waits for a line on its stdin; then it reports what
// Do returned.
func TestChildOwner(t *testing.T) {
	addr := os.Getenv(childEnv)
	if addr == "" {
		t.Skip("the owner process of the child-process tests; runs only as their child")
	}
	key := os.Getenv(childEnv + "_KEY")
	lease, err := time.ParseDuration(os.Getenv(childEnv + "_LEASE"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := idem.New(rdb, idem.WithLease(lease), idem.WithWait(0))
	defer c.Close()
	stdin := bufio.NewReader(os.Stdin)
	res, err := c.Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
		a, _ := idem.AttemptFrom(ctx)
		fmt.Printf("%s in fn attempt=%d\n", childTag, a.Number)
		if _, err := stdin.ReadString('\n'); err != nil {
			return nil, err
		}
		return []byte(fmt.Sprint("child#", a.Number)), nil
	})
	fmt.Printf("%s done res=%q leaselost=%v notrecorded=%v err=%v\n", childTag, res,
		errors.Is(err, idem.ErrLeaseLost), errors.Is(err, idem.ErrNotRecorded), err)
}

// childOwner is a running TestChildOwner.
type childOwner struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string   // the child's reports, without childTag; closed at its exit
	exited chan struct{} // closed once the child was waited for
	stderr bytes.Buffer  // read only after exited is closed
	err    error         // cmd.Wait's error, after exited is closed
}

// startChildOwner starts an owner process for key on the Redis at addr.
// It is killed, if still running, when the test ends.
func startChildOwner(t *testing.T, addr, key string, lease time.Duration) *childOwner {
	t.Helper()
	c := &childOwner{lines: make(chan string, 16), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestChildOwner$", "-test.count=1", "-test.timeout=2m")
	c.cmd.Env = append(os.Environ(), childEnv+"="+addr, childEnv+"_KEY="+key, childEnv+"_LEASE="+lease.String())
	c.cmd.Stderr = &c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), childTag+" "); ok {
				c.lines <- line
			}
		}
		close(c.lines)
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		for range c.lines {
		}
		<-c.exited
	})
	return c
}

// expect returns the rest of the child's next report, which must start
// with prefix.
func (c *childOwner) expect(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if rest, found := strings.CutPrefix(line, prefix); ok && found {
			return strings.TrimSpace(rest)
		}
		if ok {
			t.Fatalf("the child reported %q, want %q...", line, prefix)
		}
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
	}
	for range c.lines {
	}
	<-c.exited
	t.Fatalf("the child did not report %q (%v); its stderr:\n%s", prefix, c.err, c.stderr.String())
	return ""
}

// kill kills the child with SIGKILL and waits until it is gone.
func (c *childOwner) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for range c.lines {
	}
	<-c.exited
}

// signal sends sig to the child and waits until its state in /proc is
// want: 'T' stopped, or anything else when want is 0.
func (c *childOwner) signal(t *testing.T, sig syscall.Signal, want byte) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	stat := "/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/stat"
	eventually(t, 5*time.Second, fmt.Sprintf("the child's state after %v", sig), func() bool {
		b, err := os.ReadFile(stat)
		if err != nil {
			return false
		}
		// pid (comm) state ...: the state follows the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false
		}
		if want == 0 {
			return b[i+2] != 'T'
		}
		return b[i+2] == want
	})
}

// Row 6: the owner process is killed inside fn. Its record stays claimed
// until its lease ends: a waiter whose budget is shorter ends at its
// deadline with ErrInProgress; the next call takes over once the lease has
// ended, as attempt 2.
func TestOwnerProcessKilled(t *testing.T) {
	const lease = time.Second
	b := newRedis(t, redistest.Config{})
	child := startChildOwner(t, b.addr, "k", lease)
	if got := child.expect(t, "in fn"); got != "attempt=1" {
		t.Fatalf("the child runs fn with %s, want attempt=1", got)
	}
	child.kill(t)
	time.Sleep(20 * time.Millisecond) // a write the child sent before it died lands
	st := faultWantStatus(t, b, "k", idem.StateInProgress, 1)
	if left := time.Until(st.LeaseEnds); left > lease {
		t.Fatalf("the lease ends in %v, longer than the lease", left)
	}

	ctx := context.Background()
	var l ledger
	const budget = 200 * time.Millisecond
	t0 := time.Now()
	_, err := b.idem(t, idem.WithWait(budget), idem.WithLease(lease)).Do(ctx, "k", "fp", l.fn("waiter"))
	d := time.Since(t0)
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("waiter: got %v, want ErrInProgress", err)
	}
	if d < budget || d > budget+500*time.Millisecond {
		t.Fatalf("the waiter returned after %v, want at its deadline of %v", d, budget)
	}
	if time.Now().After(st.LeaseEnds) {
		t.Fatalf("the test was too slow: the lease ended before the waiter's deadline")
	}

	var started time.Time
	res, err := b.idem(t, idem.WithWait(5*lease), idem.WithLease(lease)).Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		started = time.Now()
		a := l.add(ctx)
		return []byte(fmt.Sprint("taker#", a.Number)), nil
	})
	if err != nil || string(res) != "taker#2" {
		t.Fatalf("after the lease: got %q, %v; want taker#2", res, err)
	}
	if early := st.LeaseEnds.Sub(started); early > 20*time.Millisecond {
		t.Fatalf("the takeover started %v before the dead owner's lease ended", early)
	}
	faultRuns(t, &l, "k", "[2]") // and attempt 1 in the child
	faultWantStatus(t, b, "k", idem.StateDone, 2)
	faultReplay(t, b, "k", "taker#2", &l)
}

// Row 7: the owner process is paused (SIGSTOP) inside fn past its lease;
// another call takes over and records its result; the owner resumes
// (SIGCONT) and finishes fn: its completion is refused with ErrLeaseLost,
// and the newer result stays.
func TestOwnerProcessPaused(t *testing.T) {
	const lease = 500 * time.Millisecond
	b := newRedis(t, redistest.Config{})
	child := startChildOwner(t, b.addr, "k", lease)
	if got := child.expect(t, "in fn"); got != "attempt=1" {
		t.Fatalf("the child runs fn with %s, want attempt=1", got)
	}
	child.signal(t, syscall.SIGSTOP, 'T')

	ctx := context.Background()
	var l ledger
	res, err := b.idem(t, idem.WithWait(10*lease), idem.WithLease(lease)).Do(ctx, "k", "fp", l.fn("new"))
	if err != nil || string(res) != "new#2" {
		t.Fatalf("takeover: got %q, %v; want new#2", res, err)
	}

	child.signal(t, syscall.SIGCONT, 0)
	if _, err := io.WriteString(child.stdin, "return\n"); err != nil {
		t.Fatal(err)
	}
	got := child.expect(t, "done")
	if !strings.Contains(got, "leaselost=true") || !strings.Contains(got, `res="child#1"`) {
		t.Fatalf("the resumed owner's Do: %s; want fn's result child#1 with ErrLeaseLost", got)
	}
	for range child.lines {
	}
	<-child.exited
	if child.err != nil {
		t.Fatalf("the child: %v\n%s", child.err, child.stderr.String())
	}
	faultWantStatus(t, b, "k", idem.StateDone, 2)
	faultReplay(t, b, "k", "new#2", &l)
	faultRuns(t, &l, "k", "[2]") // and attempt 1 in the child
}
