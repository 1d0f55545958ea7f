package idem_test

// Attacks on steps (idem.Step): the promise is that a step whose
// checkpoint was written does not run again while the record lives.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// pass lets d go by for the server and for the renewals: on miniredis the
// TTLs are moved and the test sleeps as well, so that the renewals, which
// run on the real clock, keep pace.
func pass(t testing.TB, b *idemtest.Backend, d time.Duration) {
	t.Helper()
	for step := 100 * time.Millisecond; d > 0; d -= step {
		if b.MR != nil {
			b.Advance(t, min(step, d))
		}
		time.Sleep(min(step, d))
	}
}

// An operation that goes on for longer than the retention after its first
// step (its renewals keep the record alive) fails transiently. The record
// lives on, released, so the next call is attempt 2, which must get the
// checkpoint of the step instead of running it again.
func TestStepAttackCheckpointOutlivesRetention(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		// A lease of a second failed on a loaded machine (a renewal late
		// by two thirds of a lease ended fn's context): three seconds.
		const retention, lease = 3 * time.Second, 3 * time.Second
		c := b.Idem(t, idem.WithRetention(retention), idem.WithLease(lease), idem.WithWait(0))
		ctx := context.Background()
		rdb := b.Client(t)
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
		idemtest.WantStatus(t, b, "k", idem.StateReleased, 1)
		got, err := idem.Do(ctx, c, "k", "", fn)
		if err != nil || got != "charged" {
			t.Fatalf("attempt 2: %q, %v; want the checkpoint of attempt 1's step", got, err)
		}
		if n := runs.count("k", "charge"); n != 1 {
			t.Fatalf("the checkpointed step ran %d times while the record lived; want 1", n)
		}
	})
}

// Redis loses everything between two steps of a running attempt, and a
// second caller starts the operation again as attempt 1: two owners with
// one attempt number. The first one's next checkpoint is refused all the
// same (the compare-and-set is on the owner token, not the number), its
// later steps do not run, and with a ledger one commit stands.
func TestStepAttackFlushBetweenSteps(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		a := b.Idem(t, idem.WithLedger(l), idem.WithLogger(nil))
		bc := b.Idem(t, idem.WithLedger(l))
		var runs stepRuns
		record := idem.RecordKey(a, "k")
		flushed, bDone := make(chan struct{}), make(chan struct{})
		fn := func(ctx context.Context) (string, error) {
			first, err := idem.Step(ctx, "reserve", func(ctx context.Context) (string, error) {
				runs.add(ctx, "reserve")
				return "hold", nil
			})
			if err != nil {
				return "", err
			}
			if _, isA := ctx.Value(ownerA{}).(bool); isA {
				close(flushed)
				<-bDone
			}
			second, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				runs.add(ctx, "charge")
				return "charged", nil
			})
			if err != nil {
				return "", err
			}
			_, err = idem.Step(ctx, "notify", func(ctx context.Context) (bool, error) {
				runs.add(ctx, "notify")
				return true, nil
			})
			if err != nil {
				return "", err
			}
			v := first + "/" + second + "/" + idem.StepKey(ctx, "charge")
			return v, commit(ctx, l, v)
		}
		type result struct {
			v   string
			err error
		}
		aDone := make(chan result, 1)
		go func() {
			v, err := idem.Do(context.WithValue(ctx, ownerA{}, true), a, "k", "fp", fn)
			aDone <- result{v, err}
		}()
		<-flushed
		b.Do(t, "FLUSHALL")
		want, err := idem.Do(ctx, bc, "k", "fp", fn)
		if err != nil {
			t.Fatalf("the second caller: %v", err)
		}
		hash := b.Client(t).HGetAll(ctx, record+":steps").Val()
		close(bDone)
		r := <-aDone
		if !errors.Is(r.err, idem.ErrLeaseLost) {
			t.Fatalf("the first owner after the flush: %q, %v; want ErrLeaseLost", r.v, r.err)
		}
		if got := b.Client(t).HGetAll(ctx, record+":steps").Val(); len(got) != len(hash) {
			t.Fatalf("the first owner changed the checkpoints: %v, then %v", hash, got)
		}
		// Both owners ran charge: the first one's context was live (its
		// next renewal would have ended it), and a step of attempt 1 reads
		// no checkpoint first. That is the window StepKey covers.
		if n := runs.count("k", "charge"); n != 2 {
			t.Fatalf("charge ran %d times; want 2", n)
		}
		if n := runs.count("k", "notify"); n != 1 {
			t.Fatalf("notify ran %d times; want 1", n)
		}
		if l.changes("k") != 1 {
			t.Fatalf("%d changes", l.changes("k"))
		}
		if got, err := idem.Do(ctx, a, "k", "fp", fn); err != nil || got != want {
			t.Fatalf("replay: %q, %v; want %q", got, err, want)
		}
	})
}

type ownerA struct{}

// A takeover claimed in the last moments of a released record's life: the
// claim starts the record's retention again, and the checkpoints of the
// attempt before must live on with it, though no step nor renewal of the
// new attempt has come yet (its fn does other work first: a ledger lookup,
// a query). On miniredis, whose clock the test moves while fn runs.
func TestStepAttackTakeoverAtEndOfRetention(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	const retention, lease = 10 * time.Second, 3 * time.Second
	c := b.Idem(t, idem.WithRetention(retention), idem.WithLease(lease), idem.WithWait(0))
	ctx := context.Background()
	var runs stepRuns
	fn := func(ctx context.Context) (string, error) {
		a, _ := idem.AttemptFrom(ctx)
		if a.Number == 2 {
			b.Advance(t, time.Second) // fn's work before its first step
		}
		v, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			runs.add(ctx, "charge")
			return fmt.Sprint("charged#", a.Number), nil
		})
		if err != nil || a.Number == 1 {
			return "", errors.Join(err, errors.New("the notification failed"))
		}
		return v, nil
	}
	if _, err := idem.Do(ctx, c, "k", "", fn); err == nil {
		t.Fatal("attempt 1 succeeded")
	}
	b.Advance(t, retention-500*time.Millisecond)
	idemtest.WantStatus(t, b, "k", idem.StateReleased, 1)
	got, err := idem.Do(ctx, c, "k", "", fn)
	if err != nil || got != "charged#1" {
		t.Fatalf("attempt 2: %q, %v; want attempt 1's checkpoint", got, err)
	}
	if n := runs.count("k", "charge"); n != 1 {
		t.Fatalf("the checkpointed step ran %d times while its record lived", n)
	}
}
