package idemtest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The helpers against both backends: a Client on the backend runs fn once
// per key and replays; Runs counts; Advance moves miniredis's clock.
func TestBackendAndRuns(t *testing.T) {
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		var l idemtest.Runs
		for range 2 {
			res, err := c.Do(context.Background(), "k", "fp", l.Fn("r"))
			if err != nil || string(res) != "r#1" {
				t.Fatalf("Do = %q, %v", res, err)
			}
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("Count = %d, want 1", n)
		}
		l.Want(t, "k", "[1]")
		idemtest.WantStatus(t, b, "k", idem.StateDone, 1)
		if got := b.Do(t, "SET", "x", "1", "PX", 1000); got != "OK" {
			t.Fatalf("SET: %v", got)
		}
		b.Advance(t, 1100*time.Millisecond)
		if got := b.Do(t, "EXISTS", "x"); got != int64(0) {
			t.Fatalf("a 1s key exists after Advance(1.1s): %v", got)
		}
	})
}

// InProgress builds a record that Status reads as in progress, with the
// lease left as given.
func TestInProgress(t *testing.T) {
	b := idemtest.Miniredis(t)
	key := "k"
	rec := idemtest.InProgress("owner", 3, time.Minute, 20*time.Second)
	rk := "idem:{" + key + "}"
	b.Do(t, "SET", rk, rec, "PX", time.Minute.Milliseconds())
	st := idemtest.WantStatus(t, b, key, idem.StateInProgress, 3)
	if left := time.Until(st.LeaseEnds); left < 15*time.Second || left > 25*time.Second {
		t.Fatalf("lease ends in %v, want about 20s", left)
	}
}

func TestHashTag(t *testing.T) {
	for in, want := range map[string]string{"p:{k}": "k", "p:{k}:done": "k", "plain": "plain", "p:{}x": "p:{}x"} {
		if got := idemtest.HashTag(in); got != want {
			t.Errorf("HashTag(%q) = %q, want %q", in, got, want)
		}
	}
}

// Owners notes two fns of one key with live contexts, and not two that
// follow each other.
func TestOwners(t *testing.T) {
	var o idemtest.Owners
	b := idemtest.Miniredis(t)
	c := b.Idem(t, idem.WithWait(0))
	ctx := context.Background()
	_, err := c.Do(ctx, "k", "", func(ctx context.Context) ([]byte, error) {
		leave := o.Enter(ctx)
		defer leave()
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Do(ctx, "other", "", func(fctx context.Context) ([]byte, error) {
		leave := o.Enter(fctx)
		defer leave()
		// A second fn of the key "other" while this one's context is live.
		_, err := b.Idem(t, idem.WithWait(0)).Do(ctx, "other", "", func(inner context.Context) ([]byte, error) {
			t.Error("a second owner ran while the first held the key")
			return nil, nil
		})
		if err == nil {
			t.Error("a second Do of a busy key succeeded")
		}
		o.Enter(fctx)() // what a second live owner would look like
		return nil, nil
	})
	if got := o.Started("other"); got != 2 {
		t.Fatalf("Started = %d, want 2", got)
	}
	if got := o.Overlaps(); len(got) != 1 {
		t.Fatalf("Overlaps = %q, want one", got)
	}
}

const childEnv = "IDEMTEST_CHILD"

// TestChildProcess is the child of TestChild: it reports, reads a line,
// and reports it back.
func TestChildProcess(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs only as TestChild's child")
	}
	fmt.Printf("tag: hello %s\n", os.Getenv(childEnv))
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("tag: got %s", line)
}

func TestChild(t *testing.T) {
	c := idemtest.StartChild(t, "TestChildProcess", "tag:", childEnv+"=world")
	if got := c.Expect(t, "hello"); got != "world" {
		t.Fatalf("the child said hello %q, want world", got)
	}
	if _, err := io.WriteString(c.Stdin, "line\n"); err != nil {
		t.Fatal(err)
	}
	if got := c.Expect(t, "got"); got != "line" {
		t.Fatalf("the child got %q, want line", got)
	}
	if stderr, err := c.Exited(t); err != nil {
		t.Fatalf("the child: %v\n%s", err, stderr)
	}

	// A child killed while it waits.
	k := idemtest.StartChild(t, "TestChildProcess", "tag:", childEnv+"=again")
	k.Expect(t, "hello")
	if k.Pid() <= 0 {
		t.Fatal("no pid")
	}
	k.Kill()
	if _, err := k.Exited(t); err == nil || k.State() == nil || k.State().Success() {
		t.Fatal("a killed child exited without an error")
	}
	for line := range k.Reports() {
		t.Fatalf("a report after the exit: %q", line)
	}
}

// TestRunInChild: the body runs in a child process, never in the parent,
// and the parent passes as the child did.
func TestRunInChild(t *testing.T) {
	if idemtest.RunInChild(t) {
		return
	}
	if os.Getenv("IDEMTEST_IN_CHILD") != t.Name() {
		t.Fatal("the body ran in the parent process")
	}
}

// UntilHeld runs its function again on another backend of the same kind
// while the function reports that Down did not hold the port, and stops
// at the first that did.
func TestUntilHeld(t *testing.T) {
	first := idemtest.Miniredis(t)
	var seen []*idemtest.Backend
	idemtest.UntilHeld(t, first, redistest.Config{}, func(b *idemtest.Backend) bool {
		seen = append(seen, b)
		return len(seen) == 2
	})
	if len(seen) != 2 || seen[0] != first || seen[1] == first || seen[1].MR == nil {
		t.Fatalf("ran on %v, want the first backend, then another miniredis", seen)
	}
}
