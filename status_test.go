package idem_test

// Tests of status.go: Status and Forget.

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

func TestStatusAndForget(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithRetention(time.Hour))
		ctx := context.Background()
		var l idemtest.Runs
		st, err := c.Status(ctx, "k")
		if err != nil || st.State != idem.StateAbsent || st.Attempt != 0 {
			t.Fatalf("absent: %+v, %v", st, err)
		}
		var inFn Status
		_, err = c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			inFn, err = c.Status(ctx, "k")
			return []byte("r"), err
		})
		if err != nil {
			t.Fatal(err)
		}
		if inFn.State != idem.StateInProgress || inFn.Attempt != 1 || inFn.LeaseEnds.IsZero() {
			t.Fatalf("in fn: %+v", inFn)
		}
		st, err = c.Status(ctx, "k")
		if err != nil || st.State != idem.StateDone || st.Attempt != 1 {
			t.Fatalf("done: %+v, %v", st, err)
		}
		if left := time.Until(st.Expires); left < 59*time.Minute || left > 61*time.Minute {
			t.Fatalf("expires in %v, want about an hour", left)
		}
		if err := c.Forget(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if st, _ := c.Status(ctx, "k"); st.State != idem.StateAbsent {
			t.Fatalf("after Forget: %v", st.State)
		}
		if got, _ := c.Do(ctx, "k", "fp", l.Fn("again")); string(got) != "again#1" {
			t.Fatalf("after Forget: got %q, want again#1", got)
		}
	})
}

// Status is shorthand in tests.
type Status = idem.Status
