package idem_test

// Row 49 of docs/faults.md, the settle time's start: a request that act
// sent late (a slow dial inside act, or an earlier attempt's act that sent
// just before its lease ended) is still on its way when the intent's own
// time is more than SettleAfter old. "Not applied" must not count until
// SettleAfter has passed since the last moment the request could have been
// sent; found by the spin model's mutant MC5 (model/README.md).

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

// act spends longer than SettleAfter before it sends (a slow dial), and
// the answer is lost: the charge lands a second later. The settle time
// counts from act's return, so the check after it finds the charge.
func TestStepCheckedLateSendInAct(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithLease(20*time.Second))
		var p keylessProvider
		const settle = 3 * time.Second
		act := func(ctx context.Context) (string, error) {
			ref := idem.StepKey(ctx, "charge")
			if p.acts.Add(1) == 1 {
				time.Sleep(settle + 500*time.Millisecond) // dialling
				p.charge(ref, time.Second)                // sent; its answer lost
				return "", idem.Ambiguous(errTimeout)
			}
			return p.charge(ref, 0), nil
		}
		v, err := idem.Do(context.Background(), c, "k", "", chargeStep(act, p.check,
			idem.SettleAfter(settle), idem.ReconcileFor(60*time.Second)))
		if err != nil || v != "ch_1" {
			t.Fatalf("got %q, %v; want ch_1 (the late charge)", v, err)
		}
		if n := p.notApplied.Load(); n == 0 {
			t.Fatal("no check said not applied before the charge landed: the test did not test the settle time")
		}
		if a, n := p.acts.Load(), p.count(); a != 1 || n != 1 {
			t.Fatalf("act ran %d times, %d charges; want 1 and 1", a, n)
		}
	})
}

// The first attempt's act sends late in its lease, and the owner then
// stops (its renewals never reach Redis): the intent is older than
// SettleAfter when attempt 2 takes over, while the request is still on
// its way. Attempt 2's "not applied" counts only SettleAfter after its
// own first check: the charge lands meanwhile, and act does not run.
func TestStepCheckedTakeoverWhileSendInFlight(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	stale, fresh := staleAndFresh(t, b) // the stale owner's lease: 1 s
	var p keylessProvider
	const settle = 3 * time.Second
	land, release := make(chan struct{}), make(chan struct{})
	var landed sync.WaitGroup
	sent := make(chan struct{})
	act := func(ctx context.Context) (string, error) {
		ref := idem.StepKey(ctx, "charge")
		if p.acts.Add(1) > 1 {
			return p.charge(ref, 0), nil
		}
		// Sent at once, but it lands only when the test says (after
		// attempt 2 has said not applied).
		landed.Add(1)
		go func() { defer landed.Done(); <-land; p.charge(ref, 0) }()
		close(sent)
		<-release // paused, its answer not yet checkpointed
		return "", idem.Ambiguous(errTimeout)
	}
	fn := chargeStep(act, p.check, idem.SettleAfter(settle), idem.ReconcileFor(60*time.Second))
	aDone := make(chan error, 1)
	go func() {
		_, err := idem.Do(ctx, stale, "k", "fp", fn)
		aDone <- err
	}()
	<-sent
	idemtest.Eventually(t, 10*time.Second, "the stale owner's lease to end on the server", func() bool {
		return idemtest.LeaseLeft(t, b, "k") < 0
	})
	// The intent is now older than SettleAfter.
	time.Sleep(settle + 200*time.Millisecond)
	go func() {
		idemtest.Eventually(t, 30*time.Second, "attempt 2's first check", func() bool {
			return p.notApplied.Load() > 0
		})
		time.Sleep(settle / 3)
		close(land)
	}()
	v, err := idem.Do(ctx, fresh, "k", "fp", fn)
	landed.Wait()
	if err != nil || v != "ch_1" {
		t.Fatalf("attempt 2: got %q, %v; want ch_1, the first attempt's charge", v, err)
	}
	if a, n := p.acts.Load(), p.count(); a != 1 || n != 1 {
		t.Fatalf("act ran %d times, %d charges; want 1 and 1", a, n)
	}
	close(release)
	<-aDone
	idemtest.WantStatus(t, b, "k", idem.StateDone, 2)
}
