package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// Once a checked step parked the operation, a later Do does not run fn at
// all (not even fn's code before the step): the claim answers parked, and
// the error matches ErrUnknownOutcome and ErrParked. Resolving the step
// lets the next Do take the operation over.
func TestParkedOperationDoesNotRunFn(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c := b.Idem(t, idem.WithLease(2*time.Second), idem.WithLogger(nil))
		var up atomic.Bool
		act := func(ctx context.Context) (string, error) {
			if !up.Load() {
				return "", idem.Ambiguous(errTimeout)
			}
			return "ch", nil
		}
		silent := func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil }
		step := chargeStep(act, silent, idem.SettleAfter(200*time.Millisecond), idem.ReconcileFor(500*time.Millisecond))
		var runs atomic.Int64
		fn := func(ctx context.Context) (string, error) {
			runs.Add(1) // fn's code before the checked step
			return step(ctx)
		}
		if _, err := idem.Do(ctx, c, "k", "", fn); !errors.Is(err, idem.ErrParked) {
			t.Fatalf("first Do: %v, want ErrParked", err)
		}
		for i := range 3 {
			_, err := idem.Do(ctx, c, "k", "", fn)
			if !errors.Is(err, idem.ErrParked) || !errors.Is(err, idem.ErrUnknownOutcome) {
				t.Fatalf("Do %d: %v; want ErrParked and ErrUnknownOutcome", i+2, err)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("fn ran %d times, want 1: a parked operation runs no fn", n)
		}
		up.Store(true)
		if err := c.ResolveNotApplied(ctx, "k", "charge"); err != nil {
			t.Fatal(err)
		}
		if v, err := idem.Do(ctx, c, "k", "", fn); err != nil || v != "ch" {
			t.Fatalf("after ResolveNotApplied: %q, %v", v, err)
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("fn ran %d times, want 2", n)
		}
	})
}
