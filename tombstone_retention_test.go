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

// A tombstone outlives its record by WithTombstones: its span counts from
// the completion over the retention and then WithTombstones, so a
// WithTombstones shorter than the retention still refuses a late retry
// that comes just after the record expired, and one that comes just
// before the span ends.
func TestTombstoneOutlivesTheRetention(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	const retention, tomb = 10 * time.Minute, time.Minute
	c := b.Idem(t, idem.WithRetention(retention), idem.WithLease(time.Second), idem.WithTombstones(tomb), idem.WithLogger(nil))
	ctx := context.Background()
	runs := 0
	fn := func(context.Context) ([]byte, error) { runs++; return []byte("charged"), nil }
	for i, late := range []time.Duration{retention + time.Second, retention + tomb - 5*time.Millisecond} {
		key := fmt.Sprint("k", i)
		if _, err := c.Do(ctx, key, "fp", fn); err != nil {
			t.Fatal(err)
		}
		b.Advance(t, late)
		if st, err := c.Status(ctx, key); err != nil || st.State != idem.StateAbsent {
			t.Fatalf("%s: the record %v after its retention: %+v, %v; want it expired", key, late, st, err)
		}
		if _, err := c.Do(ctx, key, "fp", fn); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("%s: a retry %v after the completion (retention %v, tombstones %v): %v; want ErrLateRetry", key, late, retention, tomb, err)
		}
	}
	if runs != 2 {
		t.Fatalf("fn ran %d times for 2 keys; want 2", runs)
	}
}
