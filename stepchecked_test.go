package idem_test

// Row 49 of docs/faults.md: a checked step (StepChecked) against a fake
// provider with no idempotency keys. Its answer is lost; the step settles
// it by asking (check), never by sending again blind: applied, not
// applied after the settle time, or parked for an operator.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// keylessProvider is a payment provider without idempotency keys: every
// request it receives charges, under the caller's reference (the step's
// key), and status queries answer by reference.
type keylessProvider struct {
	mu      sync.Mutex
	charges map[string][]string // reference -> the ids of its charges
	n       int
	late    sync.WaitGroup // charges still to land

	acts, checks, notApplied atomic.Int64
}

// charge makes a charge under ref, now or after delay (the answer lost),
// and returns its id.
func (p *keylessProvider) charge(ref string, delay time.Duration) string {
	p.mu.Lock()
	p.n++
	id := fmt.Sprint("ch_", p.n)
	p.mu.Unlock()
	land := func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.charges == nil {
			p.charges = make(map[string][]string)
		}
		p.charges[ref] = append(p.charges[ref], id)
	}
	if delay == 0 {
		land()
		return id
	}
	p.late.Add(1)
	time.AfterFunc(delay, func() { land(); p.late.Done() })
	return id
}

// lookup answers a status query by reference.
func (p *keylessProvider) lookup(ref string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ids := p.charges[ref]; len(ids) > 0 {
		return ids[0], true
	}
	return "", false
}

// count returns the charges made in all.
func (p *keylessProvider) count() int {
	p.late.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, ids := range p.charges {
		n += len(ids)
	}
	return n
}

// check is a StepChecked check that asks p by the step's key.
func (p *keylessProvider) check(ctx context.Context) (string, idem.Check, error) {
	p.checks.Add(1)
	name, _ := idem.StepFrom(ctx)
	if id, ok := p.lookup(idem.StepKey(ctx, name)); ok {
		return id, idem.CheckApplied, nil
	}
	p.notApplied.Add(1)
	return "", idem.CheckNotApplied, nil
}

// chargeStep is an fn of one checked step "charge" with act and check.
func chargeStep(act func(context.Context) (string, error), check func(context.Context) (string, idem.Check, error), opts ...idem.StepOption) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		return idem.StepChecked(ctx, "charge", act, check, opts...)
	}
}

var errTimeout = errors.New("provider: read timeout")

// act's request lands a second after the answer was lost. A check before
// SettleAfter says not applied: the step does not send again; once the
// charge lands, the check says applied. One charge, and its id is the
// result.
func TestStepCheckedAmbiguousLateCharge(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithLease(2*time.Second))
		var p keylessProvider
		var sent string
		act := func(ctx context.Context) (string, error) {
			p.acts.Add(1)
			sent = p.charge(idem.StepKey(ctx, "charge"), time.Second)
			return "", idem.Ambiguous(errTimeout)
		}
		v, err := idem.Do(context.Background(), c, "k", "", chargeStep(act, p.check,
			idem.SettleAfter(4*time.Second), idem.ReconcileFor(30*time.Second)))
		if err != nil || v != sent {
			t.Fatalf("got %q, %v; want %q (the late charge)", v, err, sent)
		}
		if n := p.notApplied.Load(); n == 0 {
			t.Fatal("no check said not applied before the charge landed: the test did not test the settle time")
		}
		if a, n := p.acts.Load(), p.count(); a != 1 || n != 1 {
			t.Fatalf("act ran %d times, %d charges; want 1 and 1", a, n)
		}
		idemtest.WantStatus(t, b, "k", idem.StateDone, 1)
	})
}

// act's request never reached the provider (the connection broke first,
// but act cannot tell): check says not applied, and once SettleAfter has
// passed act runs again, with the same reference. One charge in all.
func TestStepCheckedNotAppliedAfterSettle(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithLease(2*time.Second))
		var p keylessProvider
		refs := map[string]bool{}
		var first time.Time
		act := func(ctx context.Context) (string, error) {
			ref := idem.StepKey(ctx, "charge")
			refs[ref] = true
			if p.acts.Add(1) == 1 {
				first = time.Now()
				return "", idem.Ambiguous(errTimeout) // lost on the way
			}
			return p.charge(ref, 0), nil
		}
		const settle = time.Second
		v, err := idem.Do(context.Background(), c, "k", "", chargeStep(act, p.check,
			idem.SettleAfter(settle), idem.ReconcileFor(30*time.Second)))
		if err != nil || v != "ch_1" {
			t.Fatalf("got %q, %v; want ch_1", v, err)
		}
		if a, n := p.acts.Load(), p.count(); a != 2 || n != 1 || len(refs) != 1 {
			t.Fatalf("act ran %d times, %d charges, %d references; want 2, 1, 1", a, n, len(refs))
		}
		if since := time.Since(first); since < settle {
			t.Fatalf("act ran again %v after the first, before the settle time %v", since, settle)
		}
	})
}

// A provider that never answers check: after ReconcileFor the operation
// is parked, and every later call gets ErrUnknownOutcome (and ErrParked)
// without running act or check. ResolveNotApplied lets the next attempt
// charge once; Resolve with a value makes the next attempt return it,
// with no charge.
func TestStepCheckedParkedThenResolved(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c := b.Idem(t, idem.WithLease(2*time.Second))
		var p keylessProvider
		var up atomic.Bool // the provider takes requests again
		act := func(ctx context.Context) (string, error) {
			p.acts.Add(1)
			if !up.Load() {
				return "", idem.Ambiguous(errTimeout)
			}
			return p.charge(idem.StepKey(ctx, "charge"), 0), nil
		}
		silent := func(ctx context.Context) (string, idem.Check, error) {
			if p.checks.Add(1)%2 == 0 {
				return "", idem.CheckUnknown, nil
			}
			return "", idem.CheckUnknown, errTimeout
		}
		fn := chargeStep(act, silent, idem.SettleAfter(500*time.Millisecond), idem.ReconcileFor(time.Second))

		for _, key := range []string{"not-applied", "applied"} {
			_, err := idem.Do(ctx, c, key, "", fn)
			if !errors.Is(err, idem.ErrUnknownOutcome) || !errors.Is(err, idem.ErrParked) || !strings.Contains(err.Error(), `step "charge"`) {
				t.Fatalf("%s: attempt 1: %v; want ErrUnknownOutcome and ErrParked naming the step", key, err)
			}
			acts, checks := p.acts.Load(), p.checks.Load()
			for i := range 2 {
				_, err := idem.Do(ctx, c, key, "", fn)
				if !errors.Is(err, idem.ErrUnknownOutcome) || !errors.Is(err, idem.ErrParked) {
					t.Fatalf("%s: call %d after parking: %v; want ErrUnknownOutcome and ErrParked", key, i+2, err)
				}
			}
			if a, ch := p.acts.Load(), p.checks.Load(); a != acts || ch != checks {
				t.Fatalf("%s: calls on the parked operation ran act %d and check %d times more", key, a-acts, ch-checks)
			}
		}
		if err := c.ResolveNotApplied(ctx, "applied", "other"); err == nil || !strings.Contains(err.Error(), "not parked") {
			t.Fatalf("ResolveNotApplied of a step that is not parked: %v", err)
		}
		if err := idem.Resolve(ctx, c, "nobody", "charge", "x"); err == nil || !strings.Contains(err.Error(), "no record") {
			t.Fatalf("Resolve of a key with no record: %v", err)
		}

		up.Store(true)
		acts, checks := p.acts.Load(), p.checks.Load()
		if err := c.ResolveNotApplied(ctx, "not-applied", "charge"); err != nil {
			t.Fatal(err)
		}
		v, err := idem.Do(ctx, c, "not-applied", "", fn)
		if err != nil || v != "ch_1" {
			t.Fatalf("after ResolveNotApplied: got %q, %v; want ch_1", v, err)
		}
		if a, ch, n := p.acts.Load()-acts, p.checks.Load()-checks, p.count(); a != 1 || ch != 0 || n != 1 {
			t.Fatalf("after ResolveNotApplied: act ran %d times, check %d, %d charges; want 1, 0, 1", a, ch, n)
		}

		if err := idem.Resolve(ctx, c, "applied", "charge", "ch_manual"); err != nil {
			t.Fatal(err)
		}
		if err := idem.Resolve(ctx, c, "applied", "charge", "again"); err == nil || !strings.Contains(err.Error(), "not parked") {
			t.Fatalf("a second Resolve: %v; want not parked", err)
		}
		v, err = idem.Do(ctx, c, "applied", "", fn)
		if err != nil || v != "ch_manual" {
			t.Fatalf("after Resolve: got %q, %v; want ch_manual", v, err)
		}
		if a, ch, n := p.acts.Load()-acts, p.checks.Load()-checks, p.count(); a != 1 || ch != 0 || n != 1 {
			t.Fatalf("after Resolve: act ran %d more times, check %d, %d charges; want 1, 0, 1 (the other key's)", a, ch, n)
		}
		if err := c.ResolveNotApplied(ctx, "applied", "charge"); err == nil || !strings.Contains(err.Error(), "finished") {
			t.Fatalf("ResolveNotApplied of a finished operation: %v", err)
		}
	})
}

// act's plain error says the effect did not happen: the intent is
// cleared, and the next attempt runs act, not check. A Permanent error is
// checkpointed and replayed.
func TestStepCheckedActErrors(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c := b.Idem(t)
		var p keylessProvider
		declined := errors.New("card declined")
		act := func(ctx context.Context) (string, error) {
			switch p.acts.Add(1) {
			case 1:
				return "", errors.New("provider: 503 before it took the request")
			case 2:
				return "", idem.Permanent(declined)
			}
			return "", errors.New("act ran after its permanent failure")
		}
		fn := chargeStep(act, p.check, idem.SettleAfter(0))
		if _, err := idem.Do(ctx, c, "k", "", fn); err == nil || !strings.Contains(err.Error(), "503") {
			t.Fatalf("attempt 1: %v", err)
		}
		for i := range 2 {
			_, err := idem.Do(ctx, c, "k", "", fn)
			var se *idem.StoredError
			if !errors.As(err, &se) && !errors.Is(err, declined) || !strings.Contains(err.Error(), "card declined") {
				t.Fatalf("call %d: %v; want the permanent failure", i+2, err)
			}
		}
		if a, ch := p.acts.Load(), p.checks.Load(); a != 2 || ch != 0 {
			t.Fatalf("act ran %d times, check %d; want 2, 0", a, ch)
		}
	})
}

// Bad calls are refused before the intent is stored: act does not run.
func TestStepCheckedBadCalls(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := b.Idem(t)
	var p keylessProvider
	act := func(context.Context) (string, error) { p.acts.Add(1); return "x", nil }
	for _, tc := range []struct {
		name string
		fn   func(context.Context) (string, error)
		want string
	}{
		{"nil check", chargeStep(act, nil), "nil act or check"},
		{"reconcile < settle", chargeStep(act, p.check, idem.SettleAfter(time.Minute), idem.ReconcileFor(time.Second)), "shorter than SettleAfter"},
		{"negative settle", chargeStep(act, p.check, idem.SettleAfter(-1)), "must not be negative"},
	} {
		if _, err := idem.Do(context.Background(), c, tc.name, "", tc.fn); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		}
	}
	if _, err := idem.StepChecked(context.Background(), "charge", act, p.check); err == nil || !strings.Contains(err.Error(), "outside the fn") {
		t.Errorf("outside Do: %v", err)
	}
	if n := p.acts.Load(); n != 0 {
		t.Fatalf("act ran %d times", n)
	}
}
