package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// Result tells a client what became of its key without running fn or
// waiting: each state, and the stored outcome of finished keys.
func TestResult(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c := b.Idem(t, idem.WithLease(time.Minute), idem.WithLogger(nil))

		if res, st, err := c.Result(ctx, "absent"); err != nil || res != nil || st.State != idem.StateAbsent {
			t.Fatalf("absent: %q, %+v, %v", res, st, err)
		}

		if _, err := c.Do(ctx, "done", "fp", func(context.Context) ([]byte, error) { return []byte("receipt"), nil }); err != nil {
			t.Fatal(err)
		}
		res, st, err := c.Result(ctx, "done")
		if err != nil || string(res) != "receipt" || st.State != idem.StateDone || st.Attempt != 1 || st.Expires.IsZero() {
			t.Fatalf("done: %q, %+v, %v", res, st, err)
		}

		declined := idem.Permanent(errors.New("declined"))
		if _, err := c.Do(ctx, "failed", "fp", func(context.Context) ([]byte, error) { return nil, declined }); err == nil {
			t.Fatal("want the failure")
		}
		res, st, err = c.Result(ctx, "failed")
		var se *idem.StoredError
		if !errors.As(err, &se) || se.Message != "declined" || res != nil || st.State != idem.StateFailed {
			t.Fatalf("failed: %q, %+v, %v", res, st, err)
		}

		if _, err := c.Do(ctx, "released", "fp", func(context.Context) ([]byte, error) { return nil, errors.New("transient") }); err == nil {
			t.Fatal("want the transient error")
		}
		if res, st, err := c.Result(ctx, "released"); err != nil || res != nil || st.State != idem.StateReleased || st.Attempt != 1 {
			t.Fatalf("released: %q, %+v, %v", res, st, err)
		}

		running := make(chan struct{})
		release := make(chan struct{})
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			_, _ = c.Do(ctx, "running", "fp", func(context.Context) ([]byte, error) {
				close(running)
				<-release
				return []byte("late"), nil
			})
		}()
		<-running
		res, st, err = c.Result(ctx, "running")
		close(release)
		// The call ends before the test and its server do: left running,
		// it would retry its completion against a closed server past the
		// test (goleak at the package's end).
		<-finished
		if err != nil || res != nil || st.State != idem.StateInProgress || st.LeaseEnds.IsZero() {
			t.Fatalf("in progress: %q, %+v, %v", res, st, err)
		}

		// The typed form decodes a Do[T]'s result.
		type receipt struct{ ID string }
		if _, err := idem.Do(ctx, c, "typed", "", func(context.Context) (receipt, error) { return receipt{"r-1"}, nil }); err != nil {
			t.Fatal(err)
		}
		if v, st, err := idem.Result[receipt](ctx, c, "typed"); err != nil || v.ID != "r-1" || st.State != idem.StateDone {
			t.Fatalf("typed: %+v, %+v, %v", v, st, err)
		}
		if _, _, err := idem.Result[receipt](ctx, c, "done"); !errors.Is(err, idem.ErrDecode) {
			t.Fatalf("typed Result of raw bytes: %v; want ErrDecode", err)
		}
		if _, _, err := c.Result(ctx, ""); !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("empty key: %v", err)
		}
	})
}
