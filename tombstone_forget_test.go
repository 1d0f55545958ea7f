package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// Issue 38, item 2: a Client without WithTombstones (idemctl's, an
// operator's script) sees and forgets the tombstones that the service's
// Clients left: Status reports one, and after Forget the service's next
// call runs fn instead of getting ErrLateRetry.
func TestTombstoneForgetByAnyClient(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		svc := b.Idem(t, idem.WithLease(500*time.Millisecond), idem.WithRetention(time.Second), idem.WithTombstones(time.Hour))
		ops := b.Idem(t) // no tombstones of its own, the default retention
		var l idemtest.Runs
		for _, k := range []string{"k", "other"} {
			if _, err := svc.Do(ctx, k, "fp", l.Fn("r")); err != nil {
				t.Fatal(err)
			}
		}
		b.Advance(t, 1200*time.Millisecond)
		if _, err := svc.Do(ctx, "k", "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("late retry: %v; want ErrLateRetry", err)
		}
		for _, c := range []*idem.Client{svc, ops} {
			st, err := c.Status(ctx, "k")
			if err != nil || st.State != idem.StateAbsent || !st.Tombstone {
				t.Fatalf("status of a tombstoned key: %+v, %v; want absent with a tombstone", st, err)
			}
			if st, err := c.Status(ctx, "never-used"); err != nil || st.Tombstone {
				t.Fatalf("status of a key never used: %+v, %v; want no tombstone", st, err)
			}
		}
		if err := ops.Forget(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if st, err := ops.Status(ctx, "k"); err != nil || st.Tombstone {
			t.Fatalf("status after Forget: %+v, %v; want no tombstone", st, err)
		}
		if got, err := svc.Do(ctx, "k", "fp", l.Fn("r")); err != nil || string(got) != "r#1" {
			t.Fatalf("after Forget by a Client without tombstones: %q, %v; want a new run", got, err)
		}
		// Only the forgotten key: the other is still refused.
		if _, err := svc.Do(ctx, "other", "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("another key after Forget: %v; want ErrLateRetry", err)
		}
		// A live record has no tombstone to report.
		if st, err := ops.Status(ctx, "k"); err != nil || st.State != idem.StateDone || st.Tombstone {
			t.Fatalf("status of the new record: %+v, %v", st, err)
		}
	})
}
