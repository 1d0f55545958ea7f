package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// With tombstones and a ledger, a late retry whose outcome the ledger still
// holds gets that outcome, as it would without tombstones: the tombstone
// hit looks the key up first. Only a key the ledger lacks is refused with
// ErrLateRetry, and a failed lookup fails closed.
func TestTombstoneLooksUpTheLedger(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLease(500*time.Millisecond), idem.WithRetention(time.Second),
			idem.WithTombstones(time.Hour), idem.WithLedger(l))
		var runs atomic.Int64
		fn := func(ctx context.Context) ([]byte, error) {
			r := []byte(fmt.Sprint("receipt-", runs.Add(1)))
			return r, commit(ctx, l, r)
		}
		if got, err := c.Do(ctx, "k", "fp", fn); err != nil || string(got) != "receipt-1" {
			t.Fatalf("first call: %q, %v", got, err)
		}
		if _, err := c.Do(ctx, "declined", "fp", func(ctx context.Context) ([]byte, error) {
			runs.Add(1)
			return nil, commitFailure(ctx, l, errors.New("card declined"))
		}); err == nil {
			t.Fatal("the failure was not returned")
		}
		// Not recorded in the ledger: fn returned without a commit.
		if _, err := c.Do(ctx, "plain", "fp", func(context.Context) ([]byte, error) {
			runs.Add(1)
			return []byte("plain"), nil
		}); err != nil {
			t.Fatal(err)
		}
		b.Advance(t, 1200*time.Millisecond)
		if st := idemtest.Status(t, b, "k"); st.State != idem.StateAbsent {
			t.Fatalf("after the retention: %v; want the record gone", st.State)
		}
		before := l.lookups.Load()
		for range 2 {
			if got, err := c.Do(ctx, "k", "fp", fn); err != nil || string(got) != "receipt-1" {
				t.Fatalf("late retry of a recorded key: %q, %v; want the ledger's receipt-1", got, err)
			}
		}
		if n := l.lookups.Load() - before; n != 2 {
			t.Fatalf("%d ledger lookups for 2 late retries; want 2", n)
		}
		var se *idem.StoredError
		if _, err := c.Do(ctx, "declined", "fp", fn); !errors.As(err, &se) || se.Message != "card declined" {
			t.Fatalf("late retry of a recorded failure: %v; want the stored failure", err)
		}
		if _, err := c.Do(ctx, "k", "other", fn); !errors.Is(err, idem.ErrConflict) {
			t.Fatalf("late retry with other parameters: %v; want ErrConflict", err)
		}
		if _, err := c.Do(ctx, "plain", "fp", fn); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("late retry of a key the ledger lacks: %v; want ErrLateRetry", err)
		}
		boom := errors.New("database down")
		l.fail.Store(&boom)
		if _, err := c.Do(ctx, "k", "fp", fn); !errors.Is(err, boom) || errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("late retry while the ledger is down: %v; want the ledger's error", err)
		}
		l.fail.Store(nil)
		if n := runs.Load(); n != 3 || l.changes("k") != 1 {
			t.Fatalf("fn ran %d times, %d changes; want 3 and 1", n, l.changes("k"))
		}
	})
}
