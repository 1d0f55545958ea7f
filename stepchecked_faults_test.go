package idem_test

// Row 49 of docs/faults.md on a real redis-server: an owner that charged
// and then lost its lease before the checkpoint (a crash, as far as the
// key can tell: its renewals never reach Redis) is taken over; the next
// attempt asks the provider instead of charging again. The stale owner
// can write neither an intent nor a checkpoint.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

// staleAndFresh returns a Client whose renewals never reach b (its owners
// lose their lease after a second) and a healthy one.
func staleAndFresh(t *testing.T, b *idemtest.Backend) (stale, fresh *idem.Client) {
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "renew"), Action: faultconn.CloseBefore})
	stale = idemtest.Faulty(t, b, in, idemtest.NoRetry, idem.WithLease(time.Second), idem.WithWait(0))
	fresh = b.Idem(t, idem.WithLease(10*time.Second), idem.WithWait(30*time.Second))
	return stale, fresh
}

// The provider charged, and the owner lost its lease before the
// checkpoint. Attempt 2 finds the intent and calls check, not act: one
// charge, and the result is its id. The stale owner's checkpoint is then
// refused with ErrLeaseLost.
func TestStepCheckedTakeoverAfterCharge(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	stale, fresh := staleAndFresh(t, b)
	var p keylessProvider
	charged, release := make(chan struct{}), make(chan struct{})
	act := func(ctx context.Context) (string, error) {
		id := p.charge(idem.StepKey(ctx, "charge"), 0)
		if p.acts.Add(1) == 1 {
			close(charged)
			<-release // paused, its answer not yet checkpointed
		}
		return id, nil
	}
	fn := chargeStep(act, p.check, idem.SettleAfter(time.Second), idem.ReconcileFor(10*time.Second))

	aDone := make(chan stepOutcome, 1)
	go func() {
		v, err := idem.Do(ctx, stale, "k", "fp", fn)
		aDone <- stepOutcome{v, err}
	}()
	<-charged
	idemtest.Eventually(t, 10*time.Second, "the stale owner's lease to end on the server", func() bool {
		return idemtest.LeaseLeft(t, b, "k") < 0
	})
	v, err := idem.Do(ctx, fresh, "k", "fp", fn)
	if err != nil || v != "ch_1" {
		t.Fatalf("attempt 2: got %q, %v; want ch_1, the first attempt's charge", v, err)
	}
	if a, ch, n := p.acts.Load(), p.checks.Load(), p.count(); a != 1 || ch != 1 || n != 1 {
		t.Fatalf("act ran %d times, check %d, %d charges; want 1, 1, 1", a, ch, n)
	}

	close(release)
	a := <-aDone
	if !errors.Is(a.err, idem.ErrLeaseLost) || a.v != "" {
		t.Fatalf("the stale owner: got %q, %v; want ErrLeaseLost", a.v, a.err)
	}
	idemtest.WantStatus(t, b, "k", idem.StateDone, 2)
	v, err = idem.Do(ctx, fresh, "k", "fp", fn)
	if err != nil || v != "ch_1" {
		t.Fatalf("replay: got %q, %v", v, err)
	}
}

// A stale owner that reaches a checked step after another attempt took
// over (its context's end ignored, as a paused process would) cannot
// store an intent: StepChecked returns ErrLeaseLost and act does not run.
// The owner's intent is kept.
func TestStepCheckedStaleOwnerWritesNoIntent(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	stale, fresh := staleAndFresh(t, b)
	var p keylessProvider
	aEntered, aRelease := make(chan struct{}), make(chan struct{})
	bEntered, bRelease := make(chan struct{}), make(chan struct{})
	act := func(ctx context.Context) (string, error) {
		if p.acts.Add(1) == 1 {
			close(bEntered)
			<-bRelease
		}
		return p.charge(idem.StepKey(ctx, "charge"), 0), nil
	}
	aDone := make(chan stepOutcome, 1)
	go func() {
		v, err := idem.Do(ctx, stale, "k", "fp", func(ctx context.Context) (string, error) {
			close(aEntered)
			<-aRelease
			return idem.StepChecked(context.WithoutCancel(ctx), "charge", act, p.check,
				idem.SettleAfter(0), idem.ReconcileFor(5*time.Second))
		})
		aDone <- stepOutcome{v, err}
	}()
	<-aEntered
	idemtest.Eventually(t, 10*time.Second, "the stale owner's lease to end on the server", func() bool {
		return idemtest.LeaseLeft(t, b, "k") < 0
	})
	bDone := make(chan stepOutcome, 1)
	go func() {
		v, err := idem.Do(ctx, fresh, "k", "fp", chargeStep(act, p.check))
		bDone <- stepOutcome{v, err}
	}()
	<-bEntered // attempt 2 owns the key, its intent stored, its act running

	close(aRelease)
	a := <-aDone
	if !errors.Is(a.err, idem.ErrLeaseLost) {
		t.Fatalf("the stale owner: got %q, %v; want ErrLeaseLost", a.v, a.err)
	}
	if n := p.acts.Load(); n != 1 {
		t.Fatalf("act ran %d times; want 1 (attempt 2's)", n)
	}
	stepsKey := idem.RecordKey(fresh, "k") + ":steps"
	if v := b.Client(t).HGet(ctx, stepsKey, "charge").Val(); len(v) == 0 || v[0] != 'i' {
		t.Fatalf("attempt 2's intent: %q", v)
	}
	close(bRelease)
	r := <-bDone
	if r.err != nil || r.v != "ch_1" {
		t.Fatalf("attempt 2: got %q, %v", r.v, r.err)
	}
	if n := p.count(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}
