package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

// With WithMaxRecoveries(1), the one recovery that fails parks the
// operation: Pending lists it as parked (no due time) with its one
// recovery. Retry gives it its recoveries again, counted from 0: the
// recovery after Retry runs fn once more before the operation parks again.
func TestRetryGivesBackEveryRecovery(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c := b.Idem(t, idem.WithLease(time.Second), idem.WithRecoverAfter(50*time.Millisecond),
		idem.WithMaxRecoveries(1), idem.WithLogger(nil))
	ctx := context.Background()
	var ran atomic.Int32
	op := idem.Register(c, "failing", func(ctx context.Context, in string) (string, error) {
		ran.Add(1)
		return "", errors.New("transient")
	})
	if _, err := op.Do(ctx, "k", "x"); err == nil {
		t.Fatal("want the transient error")
	}
	recoverFor(t, c)
	waitState(t, c, "k", idem.StateParked)
	if got := ran.Load(); got != 2 {
		t.Fatalf("fn ran %d times before the park, want 2: the caller's and one recovery", got)
	}
	list, err := c.Pending(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Key != "k" || list[0].Name != "failing" || !list[0].Parked || !list[0].Due.IsZero() || list[0].Recoveries != 1 {
		t.Fatalf("Pending of the parked operation: %+v; want k, parked, no due time, 1 recovery", list)
	}

	if err := c.Retry(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, "k", idem.StateParked)
	if got := ran.Load(); got != 3 {
		t.Fatalf("fn ran %d times when the operation parked again after Retry, want 3: Retry gives back its WithMaxRecoveries (1) recoveries", got)
	}
	if _, err := op.Do(ctx, "k", "x"); !errors.Is(err, idem.ErrParked) || ran.Load() != 3 {
		t.Fatalf("Do of the operation parked again: %v, fn ran %d times", err, ran.Load())
	}
}

// The last recovery WithMaxRecoveries allows parks the operation when it
// gives the key back, at once: no further sweep (WithRecoverAfter later)
// is needed to park it, and no later recovery runs it.
func TestLastRecoveryParksAtItsRelease(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	const recoverAfter = 3 * time.Second
	c := b.Idem(t, idem.WithLease(time.Second), idem.WithRecoverAfter(recoverAfter),
		idem.WithMaxRecoveries(1), idem.WithLogger(nil))
	ctx := context.Background()
	var ran atomic.Int32
	returned := make(chan time.Time, 4)
	op := idem.Register(c, "failing", func(ctx context.Context, in string) (string, error) {
		ran.Add(1)
		defer func() { returned <- time.Now() }()
		return "", errors.New("transient")
	})
	if _, err := op.Do(ctx, "k", "x"); err == nil {
		t.Fatal("want the transient error")
	}
	<-returned
	recoverFor(t, c)
	var at time.Time
	select {
	case at = <-returned: // the recovery's fn returned; its release follows
	case <-time.After(30 * time.Second):
		t.Fatal("no recovery in 30 s")
	}
	// Parked by the release itself: well before another WithRecoverAfter
	// (3 s) could bring a sweep to it.
	for {
		st, err := c.Status(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if st.State == idem.StateParked {
			break
		}
		if time.Since(at) > recoverAfter/2 {
			t.Fatalf("state %v %v after the last recovery failed; want parked by its release", st.State, time.Since(at).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := ran.Load(); got != 2 {
		t.Fatalf("fn ran %d times, want 2", got)
	}
}

// A recovery that finds the operation finished runs nothing and reports
// nothing: the key was released by the operation's caller, then finished
// by a plain Do of the same parameters and type before the sweep; the sweep drops
// its index entry without EventRecovered (that event says a recovery
// finished it).
func TestRecoveryOfAFinishedKeyIsNoEvent(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ev := &kindCount{}
	c := b.Idem(t, idem.WithLease(time.Second), idem.WithRecoverAfter(50*time.Millisecond),
		idem.WithLogger(nil), idem.WithObserver(ev))
	ctx := context.Background()
	var ran atomic.Int32
	op := idem.Register(c, "once", func(ctx context.Context, in string) (string, error) {
		ran.Add(1)
		return "", errors.New("transient")
	})
	if _, err := op.Do(ctx, "k", "x"); err == nil {
		t.Fatal("want the transient error")
	}
	if got, err := idem.Do(ctx, c, "k", idem.Fingerprint("x"), func(context.Context) (string, error) { return "plain", nil }); err != nil || got != "plain" {
		t.Fatalf("plain Do over the released operation: %q, %v", got, err)
	}
	if list, err := c.Pending(ctx, 10); err != nil || len(list) != 1 {
		t.Fatalf("Pending before the sweep: %+v, %v; want the index entry the plain Do left", list, err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- c.Recover(rctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := c.Pending(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index still lists %+v after 20 s", list)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-stopped; !errors.Is(err, context.Canceled) { // it waits for the recoveries under way
		t.Fatalf("Recover returned %v", err)
	}
	if n := ev.count(idem.EventRecovered); n != 0 || ran.Load() != 1 {
		t.Fatalf("%d EventRecovered, fn ran %d times; want 0 and 1: no recovery ran", n, ran.Load())
	}
}

// WithRecoverAfter is how long a released operation waits before a
// recovery takes it over: a Recover loop that is running already (its
// first sweep comes at once) leaves it alone until then, and recovers it
// after.
func TestRecoveryWaitsForRecoverAfter(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	const recoverAfter = 3 * time.Second
	c := b.Idem(t, idem.WithLease(time.Second), idem.WithRecoverAfter(recoverAfter), idem.WithLogger(nil))
	ctx := context.Background()
	runs := make(chan time.Time, 4)
	op := idem.Register(c, "later", func(ctx context.Context, in string) (string, error) {
		if a, _ := idem.AttemptFrom(ctx); a.Number == 1 {
			return "", errors.New("transient")
		}
		runs <- time.Now()
		return "ok", nil
	})
	if _, err := op.Do(ctx, "k", "x"); err == nil {
		t.Fatal("want the transient error")
	}
	released := time.Now() // the release came before Do returned
	recoverFor(t, c)
	select {
	case at := <-runs:
		if early := at.Sub(released); early < recoverAfter/2 {
			t.Fatalf("recovered %v after its release; want no sooner than WithRecoverAfter (%v)", early.Round(time.Millisecond), recoverAfter)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("not recovered in 30 s")
	}
	waitState(t, c, "k", idem.StateDone)
}

// An operation under way is due for recovery when its lease and then
// WithRecoverAfter have passed (a dead owner's lease must end first):
// Pending dates it at least lease + WithRecoverAfter after its claim.
func TestRunningOperationDueAfterLeaseAndRecoverAfter(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	const lease, recoverAfter = 3 * time.Second, 10 * time.Second
	c := b.Idem(t, idem.WithLease(lease), idem.WithRecoverAfter(recoverAfter), idem.WithLogger(nil))
	ctx := context.Background()
	var due time.Time
	var read time.Time
	op := idem.Register(c, "slow", func(ctx context.Context, in string) (string, error) {
		list, err := c.Pending(ctx, 10)
		read = time.Now()
		if err != nil || len(list) != 1 || list[0].Parked {
			return "", idem.Permanent(errors.New("Pending while fn runs: unexpected answer"))
		}
		due = list[0].Due
		return "ok", nil
	})
	before := time.Now()
	if got, err := op.Do(ctx, "k", "x"); err != nil || got != "ok" {
		t.Fatalf("Do: %q, %v", got, err)
	}
	// The claim (or a renewal) came after before; the server's clock is
	// this machine's.
	if earliest := before.Add(lease + recoverAfter - 500*time.Millisecond); due.Before(earliest) {
		t.Fatalf("due %v after the claim's start (read %v after it); want at least lease + WithRecoverAfter (%v)",
			due.Sub(before).Round(time.Millisecond), read.Sub(before).Round(time.Millisecond), lease+recoverAfter)
	}
}
