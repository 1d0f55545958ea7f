package idem_test

import (
	"context"
	"errors"
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
