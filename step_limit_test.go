package idem_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// WithMaxResultSize bounds a step's encoded value as it bounds a result: a
// value that encodes to exactly the limit is checkpointed (the next attempt
// gets it without running the step); one byte more is a permanent
// ErrTooLarge.
func TestStepValueAtTheResultLimit(t *testing.T) {
	t.Parallel()
	const limit = 64
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithMaxResultSize(limit), idem.WithLogger(nil))
		ctx := context.Background()
		exact := strings.Repeat("v", limit-2) // msgpack's str 8: 2 bytes of header
		var runs atomic.Int32
		fn := func(ctx context.Context) (string, error) {
			v, err := idem.Step(ctx, "exact", func(ctx context.Context) (string, error) {
				runs.Add(1)
				return exact, nil
			})
			if err != nil || v != exact {
				return "", idem.Permanent(errors.New("step exact: " + errString(err)))
			}
			if _, err := idem.Step(ctx, "over", func(ctx context.Context) (string, error) {
				return exact + "v", nil
			}); !errors.Is(err, idem.ErrTooLarge) || !idem.IsPermanent(err) {
				return "", idem.Permanent(errors.New("step over: want a permanent ErrTooLarge, got " + errString(err)))
			}
			if a, _ := idem.AttemptFrom(ctx); a.Number == 1 {
				return "", errors.New("transient")
			}
			return "ok", nil
		}
		if _, err := idem.Do(ctx, c, "k", "", fn); err == nil || err.Error() != "transient" {
			t.Fatalf("attempt 1: %v", err)
		}
		if got, err := idem.Do(ctx, c, "k", "", fn); err != nil || got != "ok" {
			t.Fatalf("attempt 2: %q, %v", got, err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the step of exactly the limit ran %d times, want 1: attempt 2 reads its checkpoint", n)
		}
	})
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
