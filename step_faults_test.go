package idem_test

// Row 39 of docs/faults.md, in one process on a real redis-server: a
// takeover after a lost lease resumes after the last checkpointed step,
// and the stale owner cannot write a checkpoint; a checkpoint whose reply
// is lost is stored once; one that cannot be stored says so, and the next
// attempt runs the step again.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

type stepOutcome struct {
	v   string
	err error
}

// reserveAndCharge is a two-step fn whose step charge signals entered and
// then waits for release, ignoring its context as a paused process would.
func reserveAndCharge(runs *stepRuns, own *idemtest.Owners, entered, release chan struct{}) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		leave := own.Enter(ctx)
		defer leave()
		a, _ := idem.AttemptFrom(ctx)
		r, err := idem.Step(ctx, "reserve", func(ctx context.Context) (string, error) {
			runs.add(ctx, "reserve")
			return fmt.Sprint("res#", a.Number), nil
		})
		if err != nil {
			return "", err
		}
		c, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			runs.add(ctx, "charge")
			close(entered)
			<-release
			return fmt.Sprint("ch#", a.Number), nil
		})
		if err != nil {
			// A step after a lost lease does not start.
			_, nerr := idem.Step(ctx, "notify", func(ctx context.Context) (bool, error) {
				runs.add(ctx, "notify")
				return true, nil
			})
			if !errors.Is(nerr, idem.ErrLeaseLost) || !strings.Contains(nerr.Error(), `"notify" not run`) {
				return "", fmt.Errorf("a step after the lease was lost: %v, want ErrLeaseLost, not run", nerr)
			}
			return "", err
		}
		return r + " " + c, nil
	}
}

// A stale owner loses its lease inside step 2 (its renewals never reach
// Redis) and goes on as if it had not. The next caller takes over as
// attempt 2: it gets step 1's checkpoint and runs step 2. The stale owner
// then finishes step 2: its checkpoint is refused with ErrLeaseLost, and
// attempt 2's checkpoint and result stand.
func TestStepTakeoverAfterLostLease(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	// Two seconds: the stale owner's claim must come back with time to
	// start fn, also on a loaded machine (load 20 and 4 busy loops).
	const lease = 2 * time.Second
	ctx := context.Background()
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "renew"), Action: faultconn.CloseBefore})
	stale := idemtest.Faulty(t, b, in, idemtest.NoRetry, idem.WithLease(lease), idem.WithWait(0))
	fresh := b.Idem(t, idem.WithLease(10*time.Second), idem.WithWait(30*time.Second))
	var runs stepRuns
	var own idemtest.Owners

	aEntered, aRelease := make(chan struct{}), make(chan struct{})
	aDone := make(chan stepOutcome, 1)
	go func() {
		v, err := idem.Do(ctx, stale, "k", "fp", reserveAndCharge(&runs, &own, aEntered, aRelease))
		aDone <- stepOutcome{v, err}
	}()
	select {
	case <-aEntered:
	case r := <-aDone:
		t.Fatalf("the first owner returned %q, %v before step charge", r.v, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first owner did not reach step charge in 30s")
	}
	idemtest.Eventually(t, 10*time.Second, "the stale owner's lease to end on the server", func() bool {
		return idemtest.LeaseLeft(t, b, "k") < 0
	})

	bEntered, bRelease := make(chan struct{}), make(chan struct{})
	bDone := make(chan stepOutcome, 1)
	go func() {
		v, err := idem.Do(ctx, fresh, "k", "fp", reserveAndCharge(&runs, &own, bEntered, bRelease))
		bDone <- stepOutcome{v, err}
	}()
	select {
	case <-bEntered:
	case r := <-bDone:
		t.Fatalf("the takeover returned %q, %v before step charge", r.v, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the takeover did not reach step charge")
	}

	// Attempt 2 owns the key and runs step charge: the stale owner's
	// checkpoint of it is refused.
	close(aRelease)
	a := <-aDone
	if !errors.Is(a.err, idem.ErrLeaseLost) || a.v != "" {
		t.Fatalf("the stale owner: got %q, %v; want ErrLeaseLost", a.v, a.err)
	}
	if !strings.Contains(a.err.Error(), `step "charge"`) {
		t.Fatalf("the stale owner's error does not name the step: %v", a.err)
	}
	stepsKey := idem.RecordKey(fresh, "k") + ":steps"
	if n := b.Client(t).HExists(ctx, stepsKey, "charge").Val(); n {
		t.Fatal("the stale owner's checkpoint of step charge was stored")
	}

	close(bRelease)
	r := <-bDone
	if r.err != nil || r.v != "res#1 ch#2" {
		t.Fatalf("attempt 2: got %q, %v; want step 1 from attempt 1, step 2 from attempt 2", r.v, r.err)
	}
	if n := runs.count("k", "reserve"); n != 1 {
		t.Fatalf("step reserve ran %d times, want 1", n)
	}
	if n := runs.count("k", "notify"); n != 0 {
		t.Fatalf("step notify ran %d times after the lease was lost", n)
	}
	if n := runs.count("k", "charge"); n != 2 {
		t.Fatalf("step charge ran %d times, want 2 (the stale owner's and attempt 2's)", n)
	}
	own.Check(t)
	idemtest.WantStatus(t, b, "k", idem.StateDone, 2)
	v, err := idem.Do(ctx, b.Idem(t), "k", "fp", func(context.Context) (string, error) {
		return "", errors.New("a replay ran fn")
	})
	if err != nil || v != "res#1 ch#2" {
		t.Fatalf("replay: got %q, %v", v, err)
	}
}

// A checkpoint whose reply is lost is re-sent by go-redis: the script
// finds the same bytes stored and answers stored. The step ran once, and
// the next attempt gets its checkpoint.
func TestStepCheckpointReplyLost(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	idemtest.LoadScripts(t, b)
	if got := b.Do(t, "SCRIPT", "LOAD", idem.ScriptSource("step")); got != idemtest.ScriptSHA(t, "step") {
		t.Fatalf("SCRIPT LOAD step: %v", got)
	}
	count, sent := idemtest.Count(idemtest.IsScript(t, "step"))
	in := faultconn.New(count, faultconn.Rule{Match: idemtest.IsScript(t, "step"), Nth: 1, Action: faultconn.DropReply})
	c := idemtest.Faulty(t, b, in, nil)
	var runs stepRuns
	fn := func(ctx context.Context) (string, error) {
		v, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			runs.add(ctx, "charge")
			return "ch-1", nil
		})
		if err != nil {
			return "", err
		}
		if a, _ := idem.AttemptFrom(ctx); a.Number == 1 {
			return "", errors.New("transient")
		}
		return v, nil
	}
	if _, err := idem.Do(ctx, c, "k", "", fn); err == nil || err.Error() != "transient" {
		t.Fatalf("attempt 1: %v", err)
	}
	if n := sent.Load(); n < 2 {
		t.Fatalf("the checkpoint was sent %d times: the lost reply was not re-sent", n)
	}
	v, err := idem.Do(ctx, b.Idem(t), "k", "", fn)
	if err != nil || v != "ch-1" {
		t.Fatalf("attempt 2: got %q, %v", v, err)
	}
	if n := runs.count("k", "charge"); n != 1 {
		t.Fatalf("step charge ran %d times, want 1", n)
	}
}

// A checkpoint that cannot be stored (Redis never gets it) is retried
// until the store timeout; then Step returns the step's value with
// ErrNotRecorded, and the next attempt runs the step again: the window
// that only the downstream's own idempotency covers.
func TestStepCheckpointNotStored(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "step"), Action: faultconn.CloseBefore})
	// The store timeout also bounds the release after the step's
	// failure, which must redial: with 300ms, a loaded machine (load 15)
	// left the claim in progress.
	c := idemtest.Faulty(t, b, in, idemtest.NoRetry, idem.WithStoreTimeout(2*time.Second))
	var runs stepRuns
	fn := func(ctx context.Context) (string, error) {
		v, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			runs.add(ctx, "charge")
			return "ch", nil
		})
		if a, _ := idem.AttemptFrom(ctx); a.Number == 1 && (v != "ch" || !errors.Is(err, idem.ErrNotRecorded)) {
			return "", fmt.Errorf("attempt 1's step: got %q, %v; want its value and ErrNotRecorded", v, err)
		}
		return v, err
	}
	_, err := idem.Do(ctx, c, "k", "", fn)
	if !errors.Is(err, idem.ErrNotRecorded) || !strings.Contains(err.Error(), `step "charge"`) {
		t.Fatalf("attempt 1: got %v, want ErrNotRecorded naming the step", err)
	}
	idemtest.WantStatus(t, b, "k", idem.StateReleased, 1)
	v, err := idem.Do(ctx, b.Idem(t), "k", "", fn)
	if err != nil || v != "ch" {
		t.Fatalf("attempt 2: got %q, %v", v, err)
	}
	if n := runs.count("k", "notify"); n != 0 {
		t.Fatalf("step notify ran %d times after the lease was lost", n)
	}
	if n := runs.count("k", "charge"); n != 2 {
		t.Fatalf("step charge ran %d times, want 2", n)
	}
}
