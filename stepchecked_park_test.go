package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
)

// A parked step parks the operation whatever fn makes of its error: an fn
// that swallows it and returns success, or wraps it in a Permanent
// failure, stores nothing; its Do and every later one return
// ErrUnknownOutcome, Status and Result say StateParked naming the step,
// and after ResolveNotApplied the next attempt finishes.
func TestStepCheckedParkedWhateverFnReturns(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c := b.Idem(t, idem.WithLease(2*time.Second))
		var up atomic.Bool
		var acts atomic.Int64
		act := func(ctx context.Context) (string, error) {
			acts.Add(1)
			if !up.Load() {
				return "", idem.Ambiguous(errTimeout)
			}
			return "ch_" + idem.StepKey(ctx, "charge")[:4], nil
		}
		silent := func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil }
		step := chargeStep(act, silent, idem.SettleAfter(200*time.Millisecond), idem.ReconcileFor(500*time.Millisecond))
		for name, fn := range map[string]func(context.Context) (string, error){
			"swallowed": func(ctx context.Context) (string, error) {
				if _, err := step(ctx); err != nil {
					return "charged, I think", nil // the step's error dropped
				}
				return "charged", nil
			},
			"permanent": func(ctx context.Context) (string, error) {
				if _, err := step(ctx); err != nil {
					return "", idem.Permanent(errors.New("declined: " + err.Error()))
				}
				return "charged", nil
			},
		} {
			up.Store(false)
			for i := range 3 {
				v, err := idem.Do(ctx, c, name, "", fn)
				if !errors.Is(err, idem.ErrUnknownOutcome) || !errors.Is(err, idem.ErrParked) || v != "" {
					t.Fatalf("%s: call %d: %q, %v; want no result and ErrUnknownOutcome, ErrParked", name, i+1, v, err)
				}
			}
			if n := acts.Load(); n != 1 {
				t.Fatalf("%s: act ran %d times, want 1 (the parked step never runs act again)", name, n)
			}
			st, err := c.Status(ctx, name)
			if err != nil || st.State != idem.StateParked || st.Step != "charge" {
				t.Fatalf("%s: Status = %+v, %v; want parked at step charge", name, st, err)
			}
			res, st, err := c.Result(ctx, name)
			if err != nil || res != nil || st.State != idem.StateParked || st.Step != "charge" {
				t.Fatalf("%s: Result = %q, %+v, %v; want no result, parked at step charge", name, res, st, err)
			}
			up.Store(true)
			if err := c.ResolveNotApplied(ctx, name, "charge"); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Status(ctx, name); err != nil || st.State != idem.StateReleased || st.Step != "" {
				t.Fatalf("%s: Status after ResolveNotApplied = %+v, %v; want released", name, st, err)
			}
			if v, err := idem.Do(ctx, c, name, "", fn); err != nil || v != "charged" {
				t.Fatalf("%s: after ResolveNotApplied: %q, %v; want charged", name, v, err)
			}
			if n := acts.Load(); n != 2 {
				t.Fatalf("%s: act ran %d times, want 2", name, n)
			}
			acts.Store(0)
		}
	})
}

// An attempt that ends with a parked step is an EventParked outcome (fn
// ran, nothing stored), after the step's EventReconciled, logged at Error
// by LogObserver.
func TestStepCheckedParkedEvent(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	r := &recorder{}
	var buf syncBuffer
	l := slog.New(slog.NewTextHandler(&buf, nil))
	c := idem.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}), idem.WithLogger(nil),
		idem.WithObserver(r), idem.WithObserver(idem.LogObserver(l)))
	t.Cleanup(func() { _ = c.Close() })
	act := func(context.Context) (string, error) { return "", idem.Ambiguous(errTimeout) }
	silent := func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil }
	fn := chargeStep(act, silent, idem.SettleAfter(100*time.Millisecond), idem.ReconcileFor(200*time.Millisecond))
	if _, err := idem.Do(context.Background(), c, "k", "", fn); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("Do: %v, want ErrUnknownOutcome", err)
	}
	var kinds []idem.EventKind
	for _, e := range r.take() {
		kinds = append(kinds, e.Kind)
	}
	if len(kinds) != 2 || kinds[0] != idem.EventReconciled || kinds[1] != idem.EventParked || !kinds[1].Outcome() || !kinds[1].Ran() || kinds[1].String() != "parked" {
		t.Fatalf("events %v, want the reconciliation, then one parked outcome that ran fn", kinds)
	}
	if !strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "parked") {
		t.Errorf("LogObserver: %q, want the parked outcome at Error", buf.String())
	}
}
