package idem

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestRenewalQueue starts and stops renewals in random order, with due
// times mostly in order but some earlier than the tail's (a claim whose
// reply was slow), none of them due yet, and checks the queue after each
// step: linked both ways, in order of due (no renewal waits behind a later
// one), holding exactly the renewals started and not stopped, with the
// timer armed no later than the head's due.
func TestRenewalQueue(t *testing.T) {
	t.Parallel()
	q := &renewals{every: time.Hour}
	t.Cleanup(func() {
		if q.timer != nil {
			q.timer.Stop()
		}
	})
	rng := rand.New(rand.NewPCG(1, 2))
	live := map[*renewal]bool{}
	var all []*renewal
	for step := range 2000 {
		if len(live) == 0 || rng.IntN(3) > 0 {
			due := time.Now().Add(time.Hour)
			if rng.IntN(4) == 0 {
				due = due.Add(-time.Duration(rng.IntN(1000)) * time.Second)
			}
			r := &renewal{due: due}
			q.start(r)
			live[r] = true
			all = append(all, r)
		} else {
			r := all[rng.IntN(len(all))]
			q.stop(r) // stopping twice is allowed, and does nothing
			delete(live, r)
		}
		q.mu.Lock()
		n := 0
		var prev *renewal
		for r := q.head; r != nil; prev, r = r, r.next {
			if r.prev != prev {
				t.Fatalf("step %d: a renewal's prev is not the one before it", step)
			}
			if prev != nil && r.due.Before(prev.due) {
				t.Fatalf("step %d: queue out of order", step)
			}
			if !live[r] || r.state != renewalQueued {
				t.Fatalf("step %d: a stopped renewal is queued", step)
			}
			n++
		}
		if q.head != nil && q.armedAt.After(q.head.due) {
			t.Fatalf("step %d: the timer fires at %v, after the head's due %v", step, q.armedAt, q.head.due)
		}
		if q.tail != prev || n != len(live) || q.armed != true {
			t.Fatalf("step %d: tail %p (want %p), %d queued (want %d), armed %v", step, q.tail, prev, n, len(live), q.armed)
		}
		q.mu.Unlock()
	}
}

// TestBounds checks the contexts that record outcomes: they carry the
// caller's values, outlive its cancellation, share their deadline, which
// lies between the store timeout and a sixteenth more, and end then, with
// the contexts derived from them.
func TestBounds(t *testing.T) {
	t.Parallel()
	const d = 160 * time.Millisecond
	b := &bounds{d: d}
	type key struct{}
	caller, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	cancel(errors.New("the caller gave up"))

	before := time.Now()
	ctx := b.detached(caller)
	after := time.Now()
	if v := ctx.Value(key{}); v != "v" {
		t.Fatalf("Value: got %v, want the caller's value", v)
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("Err after the caller's cancellation: %v, want nil", err)
	}
	if err := context.Cause(ctx); err != nil {
		t.Fatalf("Cause after the caller's cancellation: %v, want nil", err)
	}
	dl, ok := ctx.Deadline()
	if !ok || dl.Before(before.Add(d)) || dl.After(after.Add(d+d/16)) {
		t.Fatalf("deadline %v from now, want between %v and %v", dl.Sub(before), d, d+d/16)
	}
	if other := b.detached(context.Background()); other.Done() != ctx.Done() {
		t.Fatal("two calls at once got different bounds; they should share one")
	}
	child, stop := context.WithCancel(ctx)
	defer stop()
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a context derived from a bound did not end with it")
	}
	if since := time.Since(before); since < d {
		t.Fatalf("the bound ended after %v, before the store timeout of %v", since, d)
	}
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Fatalf("Cause %v, derived Err %v; want DeadlineExceeded", context.Cause(ctx), child.Err())
	}
	if next := b.detached(caller); next.Err() != nil {
		t.Fatalf("a bound handed out after the last one ended: %v", next.Err())
	}
}

// TestAttemptFromDerived finds fn's Attempt through contexts derived from
// fn's.
func TestAttemptFromDerived(t *testing.T) {
	t.Parallel()
	cctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	fctx := &attemptCtx{Context: cctx, a: Attempt{Key: "k", Number: 3}}
	type key struct{}
	derived, stop := context.WithTimeout(context.WithValue(fctx, key{}, 1), time.Hour)
	defer stop()
	if a, ok := AttemptFrom(derived); !ok || a != (Attempt{Key: "k", Number: 3}) {
		t.Fatalf("got %+v, %v; want attempt 3 of k", a, ok)
	}
	if _, ok := AttemptFrom(cctx); ok {
		t.Fatal("an Attempt outside fn's context")
	}
	cause := errors.New("lease lost")
	cancel(cause)
	if !errors.Is(context.Cause(derived), cause) {
		t.Fatalf("derived context's cause: %v, want %v", context.Cause(derived), cause)
	}
}

// TestFirstPollAtMostTheInterval: a waiter's first pause is no longer than
// WithPollInterval.
func TestFirstPollAtMostTheInterval(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{time.Millisecond, 10 * time.Millisecond, time.Second} {
		c := New(nil, WithPollInterval(d))
		if c.firstPoll > d || c.firstPoll <= 0 {
			t.Errorf("WithPollInterval(%v): first poll %v", d, c.firstPoll)
		}
		_ = c.Close()
	}
}
