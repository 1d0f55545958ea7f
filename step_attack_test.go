package idem_test

// Attacks on steps (idem.Step): the promise is that a step whose
// checkpoint was written does not run again while the record lives.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// pass lets d go by for the server and for the renewals: on miniredis the
// TTLs are moved and the test sleeps as well, so that the renewals, which
// run on the real clock, keep pace.
func pass(t testing.TB, b *backend, d time.Duration) {
	t.Helper()
	for step := 100 * time.Millisecond; d > 0; d -= step {
		if b.mr != nil {
			b.advance(t, min(step, d))
		}
		time.Sleep(min(step, d))
	}
}

// An operation that goes on for longer than the retention after its first
// step (its renewals keep the record alive) fails transiently. The record
// lives on, released, so the next call is attempt 2, which must get the
// checkpoint of the step instead of running it again.
func TestStepAttackCheckpointOutlivesRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const retention, lease = 2 * time.Second, time.Second
		c := b.idem(t, idem.WithRetention(retention), idem.WithLease(lease), idem.WithWait(0))
		ctx := context.Background()
		rdb := b.client(t)
		record := idem.RecordKey(c, "k")
		var runs stepRuns
		fn := func(ctx context.Context) (string, error) {
			v, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				runs.add(ctx, "charge")
				a, _ := idem.AttemptFrom(ctx)
				if a.Number > 1 {
					return "charged-again", nil
				}
				return "charged", nil
			})
			if err != nil {
				return "", err
			}
			a, _ := idem.AttemptFrom(ctx)
			if a.Number == 1 {
				// A long tail after the step: the record is renewed,
				// and outlives the retention it started with.
				pass(t, b, retention+retention/2)
				if err := ctx.Err(); err != nil {
					return "", err
				}
				if rdb.Exists(ctx, record).Val() != 1 {
					return "", errors.New("the record expired under its owner")
				}
				return "", errors.New("the notification failed") // transient
			}
			return v, nil
		}
		if _, err := idem.Do(ctx, c, "k", "", fn); err == nil || err.Error() != "the notification failed" {
			t.Fatalf("attempt 1: %v; want its transient error", err)
		}
		faultWantStatus(t, b, "k", idem.StateReleased, 1)
		got, err := idem.Do(ctx, c, "k", "", fn)
		if err != nil || got != "charged" {
			t.Fatalf("attempt 2: %q, %v; want the checkpoint of attempt 1's step", got, err)
		}
		if n := runs.count("k", "charge"); n != 1 {
			t.Fatalf("the checkpointed step ran %d times while the record lived; want 1", n)
		}
	})
}
