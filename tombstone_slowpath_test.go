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

// A call with no fingerprint that takes over a key an earlier attempt
// claimed with one (its record keeps that fingerprint, so it is not the
// bytes of this caller's claim: complete.lua's slow path) leaves its
// tombstone too: a retry after the retention is refused, fn not run.
func TestTombstoneAfterATakeoverWithoutFingerprint(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	const retention = 2 * time.Second
	c := b.Idem(t, idem.WithRetention(retention), idem.WithLease(time.Second), idem.WithTombstones(time.Hour), idem.WithLogger(nil))
	ctx := context.Background()
	if _, err := c.Do(ctx, "k", "debit 100", func(context.Context) ([]byte, error) {
		return nil, errors.New("transient: the provider blinked")
	}); err == nil {
		t.Fatal("want the transient error")
	}
	runs := 0
	fn := func(context.Context) ([]byte, error) {
		runs++
		return []byte("charged"), nil
	}
	if _, err := c.Do(ctx, "k", "", fn); err != nil || runs != 1 {
		t.Fatalf("the takeover without a fingerprint: %v, %d runs", err, runs)
	}
	b.Advance(t, retention+time.Second)
	if _, err := c.Do(ctx, "k", "", fn); !errors.Is(err, idem.ErrLateRetry) || runs != 1 {
		t.Fatalf("a retry after the retention: %v, fn ran %d times; want ErrLateRetry, once", err, runs)
	}
}

// A tombstone lasts its whole span (retention + WithTombstones time) from
// the completion: a retry a moment before the span ends is still refused,
// whatever window its bucket falls in.
func TestTombstoneLastsItsWholeSpan(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	const retention, tomb = 2 * time.Second, 10 * time.Minute
	c := b.Idem(t, idem.WithRetention(retention), idem.WithLease(time.Second), idem.WithTombstones(tomb), idem.WithLogger(nil))
	ctx := context.Background()
	runs := 0
	fn := func(context.Context) ([]byte, error) { runs++; return []byte("charged"), nil }
	for i := range 5 {
		key := fmt.Sprint("k", i)
		if _, err := c.Do(ctx, key, "fp", fn); err != nil {
			t.Fatal(err)
		}
		b.Advance(t, retention+tomb-5*time.Millisecond)
		if _, err := c.Do(ctx, key, "fp", fn); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("%s: a retry 5 ms before the tombstone's span ends: %v; want ErrLateRetry", key, err)
		}
		b.Advance(t, time.Duration(i+1)*7*time.Second) // the next key completes elsewhere in its window
	}
	if runs != 5 {
		t.Fatalf("fn ran %d times for 5 keys; want 5", runs)
	}
}
