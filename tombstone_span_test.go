package idem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// Row 43 of docs/faults.md: a deploy changes WithRetention or
// WithTombstones, or two versions share Redis in a rolling deploy. The
// tombstones that either wrote are found by both, and Forget by either
// reaches them.
func TestTombstoneSpanChange(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		lease := 500 * time.Millisecond
		// Spans of 1s + 1h (windows of 15m) and 2s + 10m (windows of
		// 150.5s): no bucket name, no window count in common.
		old := b.Idem(t, idem.WithLease(lease), idem.WithRetention(time.Second), idem.WithTombstones(time.Hour))
		next := b.Idem(t, idem.WithLease(lease), idem.WithRetention(2*time.Second), idem.WithTombstones(10*time.Minute))
		var l idemtest.Runs
		keys := func(prefix string) []string {
			var ks []string
			for i := range 10 {
				ks = append(ks, fmt.Sprint(prefix, i))
			}
			return ks
		}
		for _, k := range keys("old-") {
			if _, err := old.Do(ctx, k, "fp", l.Fn("r")); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys("next-") {
			if _, err := next.Do(ctx, k, "fp", l.Fn("r")); err != nil {
				t.Fatal(err)
			}
		}
		b.Advance(t, 2200*time.Millisecond) // past both retentions
		late := 0
		for _, c := range []*idem.Client{old, next} {
			for _, k := range append(keys("old-"), keys("next-")...) {
				_, err := c.Do(ctx, k, "fp", l.Fn("r"))
				if errors.Is(err, idem.ErrLateRetry) {
					late++
				} else {
					t.Errorf("%s: late retry: %v; want ErrLateRetry", k, err)
				}
				if _, err := c.Do(ctx, k, "other", l.Fn("r")); !errors.Is(err, idem.ErrConflict) {
					t.Errorf("%s: late retry with other parameters: %v; want ErrConflict", k, err)
				}
			}
		}
		if late != 40 {
			t.Fatalf("%d of 40 late retries refused", late)
		}
		for _, k := range append(keys("old-"), keys("next-")...) {
			if n := l.Count(k); n != 1 {
				t.Fatalf("%s: fn ran %d times; want 1", k, n)
			}
		}
		// Forget by either version reaches the tombstone the other wrote:
		// the next call, by either, runs fn again.
		for i, k := range []string{"old-0", "next-0"} {
			by, then := next, old
			if i == 1 {
				by, then = old, next
			}
			if err := by.Forget(ctx, k); err != nil {
				t.Fatal(err)
			}
			if got, err := then.Do(ctx, k, "fp", l.Fn("r")); err != nil || string(got) != "r#1" || l.Count(k) != 2 {
				t.Fatalf("%s after Forget by the other version: %q, %v, %d runs; want a new run", k, got, err, l.Count(k))
			}
		}
	})
}
