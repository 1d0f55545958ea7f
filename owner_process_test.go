//go:build linux

package idem_test

// Rows 6 and 7 of docs/faults.md: an owner in another process is killed, or paused
// past its lease, inside fn. The owner is this test binary run again as a
// child (TestChildOwner), told what to do by environment variables; it
// reports on its stdout, and inside fn waits for a line on its stdin.
// Linux only: the tests read /proc to see the child stopped.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
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
	t.Parallel()
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

// startChildOwner starts an owner process (TestChildOwner) for key on the
// Redis at addr. It is killed, if still running, when the test ends.
func startChildOwner(t *testing.T, addr, key string, lease time.Duration) *idemtest.Child {
	t.Helper()
	return idemtest.StartChild(t, "TestChildOwner", childTag,
		childEnv+"="+addr, childEnv+"_KEY="+key, childEnv+"_LEASE="+lease.String())
}

// signal sends sig to the child and waits until its state in /proc is
// want: 'T' stopped, or anything else when want is 0.
func signal(t *testing.T, c *idemtest.Child, sig syscall.Signal, want byte) {
	t.Helper()
	if err := c.Signal(sig); err != nil {
		t.Fatal(err)
	}
	stat := "/proc/" + strconv.Itoa(c.Pid()) + "/stat"
	idemtest.Eventually(t, 5*time.Second, fmt.Sprintf("the child's state after %v", sig), func() bool {
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
	t.Parallel()
	const lease = time.Second
	b := idemtest.Redis(t, redistest.Config{})
	child := startChildOwner(t, b.Addr, "k", lease)
	if got := child.Expect(t, "in fn"); got != "attempt=1" {
		t.Fatalf("the child runs fn with %s, want attempt=1", got)
	}
	child.Kill()
	time.Sleep(20 * time.Millisecond) // a write the child sent before it died lands
	st := idemtest.WantStatus(t, b, "k", idem.StateInProgress, 1)
	if left := time.Until(st.LeaseEnds); left > lease {
		t.Fatalf("the lease ends in %v, longer than the lease", left)
	}

	ctx := context.Background()
	var l idemtest.Runs
	const budget = 200 * time.Millisecond
	t0 := time.Now()
	_, err := b.Idem(t, idem.WithWait(budget), idem.WithLease(lease)).Do(ctx, "k", "fp", l.Fn("waiter"))
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
	res, err := b.Idem(t, idem.WithWait(5*lease), idem.WithLease(lease)).Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		started = time.Now()
		a := l.Add(ctx)
		return []byte(fmt.Sprint("taker#", a.Number)), nil
	})
	if err != nil || string(res) != "taker#2" {
		t.Fatalf("after the lease: got %q, %v; want taker#2", res, err)
	}
	if early := st.LeaseEnds.Sub(started); early > 20*time.Millisecond {
		t.Fatalf("the takeover started %v before the dead owner's lease ended", early)
	}
	l.Want(t, "k", "[2]") // and attempt 1 in the child
	idemtest.WantStatus(t, b, "k", idem.StateDone, 2)
	idemtest.Replay(t, b, "k", "taker#2", &l)
}

// Row 7: the owner process is paused (SIGSTOP) inside fn past its lease;
// another call takes over and records its result; the owner resumes
// (SIGCONT) and finishes fn: its completion is refused with ErrLeaseLost,
// and the newer result stays.
func TestOwnerProcessPaused(t *testing.T) {
	t.Parallel()
	const lease = 500 * time.Millisecond
	b := idemtest.Redis(t, redistest.Config{})
	child := startChildOwner(t, b.Addr, "k", lease)
	if got := child.Expect(t, "in fn"); got != "attempt=1" {
		t.Fatalf("the child runs fn with %s, want attempt=1", got)
	}
	signal(t, child, syscall.SIGSTOP, 'T')

	ctx := context.Background()
	var l idemtest.Runs
	res, err := b.Idem(t, idem.WithWait(10*lease), idem.WithLease(lease)).Do(ctx, "k", "fp", l.Fn("new"))
	if err != nil || string(res) != "new#2" {
		t.Fatalf("takeover: got %q, %v; want new#2", res, err)
	}

	signal(t, child, syscall.SIGCONT, 0)
	if _, err := io.WriteString(child.Stdin, "return\n"); err != nil {
		t.Fatal(err)
	}
	got := child.Expect(t, "done")
	if !strings.Contains(got, "leaselost=true") || !strings.Contains(got, `res="child#1"`) {
		t.Fatalf("the resumed owner's Do: %s; want fn's result child#1 with ErrLeaseLost", got)
	}
	if stderr, err := child.Exited(t); err != nil {
		t.Fatalf("the child: %v\n%s", err, stderr)
	}
	idemtest.WantStatus(t, b, "k", idem.StateDone, 2)
	idemtest.Replay(t, b, "k", "new#2", &l)
	l.Want(t, "k", "[2]") // and attempt 1 in the child
}
