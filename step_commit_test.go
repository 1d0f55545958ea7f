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

// The ledger commit ends the operation: every later call gets the
// committed outcome, and no attempt runs fn again, so a step after the
// commit could never run again. It is refused (its fn does not run), and
// the owner's Do returns the committed outcome with an error that says so;
// replays get the outcome alone.
func TestStepAfterCommitIsRefused(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l), idem.WithLogger(nil))
		var notified, runs atomic.Int64
		fn := func(ctx context.Context) ([]byte, error) {
			runs.Add(1)
			if err := commit(ctx, l, []byte("receipt")); err != nil {
				return nil, err
			}
			_, err := idem.Step(ctx, "notify", func(ctx context.Context) (bool, error) {
				notified.Add(1)
				return false, errors.New("mail server unavailable") // transient
			})
			return []byte("receipt"), err
		}
		got, err := c.Do(ctx, "k", "fp", fn)
		if !errors.Is(err, idem.ErrStepAfterCommit) || !strings.Contains(err.Error(), `"notify"`) || string(got) != "receipt" {
			t.Fatalf("step after the commit: %q, %v; want the committed receipt and ErrStepAfterCommit naming the step", got, err)
		}
		if notified.Load() != 0 {
			t.Fatalf("the step ran %d times after the commit; want it refused", notified.Load())
		}
		idemtest.WantStatus(t, b, "k", idem.StateDone, 1)
		if got, err := c.Do(ctx, "k", "fp", fn); err != nil || string(got) != "receipt" || runs.Load() != 1 {
			t.Fatalf("replay: %q, %v, fn ran %d times", got, err, runs.Load())
		}

		// Do[T], with an fn that drops the step's error: reported all the same.
		v, err := idem.Do(ctx, c, "typed", "fp", func(ctx context.Context) (int, error) {
			if err := commit(ctx, l, 7); err != nil {
				return 0, err
			}
			_, _ = idem.Step(ctx, "notify", func(ctx context.Context) (bool, error) {
				notified.Add(1)
				return true, nil
			})
			return 7, nil
		})
		if !errors.Is(err, idem.ErrStepAfterCommit) || v != 7 || notified.Load() != 0 {
			t.Fatalf("Do[T]: %d, %v, notified %d; want 7, ErrStepAfterCommit, 0", v, err, notified.Load())
		}

		// A step that began before the commit and fails after it did not
		// finish, and will not run again: reported too.
		began, committed := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		got, err = c.Do(ctx, "concurrent", "fp", func(ctx context.Context) ([]byte, error) {
			go func() {
				_, err := idem.Step(ctx, "notify", func(ctx context.Context) (bool, error) {
					close(began)
					<-committed
					return false, errors.New("mail server unavailable")
				})
				done <- err
			}()
			<-began
			err := commit(ctx, l, []byte("receipt"))
			close(committed)
			if serr := <-done; !errors.Is(serr, idem.ErrStepAfterCommit) || !strings.Contains(serr.Error(), "mail server unavailable") {
				t.Errorf("the step's own error: %v; want ErrStepAfterCommit with its cause", serr)
			}
			return []byte("receipt"), err
		})
		if !errors.Is(err, idem.ErrStepAfterCommit) || string(got) != "receipt" {
			t.Fatalf("a step failing after the commit: %q, %v; want the receipt and ErrStepAfterCommit", got, err)
		}
		// Without a failing step, the commit's outcome alone.
		if got, err := c.Do(ctx, "clean", "fp", func(ctx context.Context) ([]byte, error) {
			if _, err := idem.Step(ctx, "reserve", func(ctx context.Context) (bool, error) { return true, nil }); err != nil {
				return nil, err
			}
			return []byte("ok"), commit(ctx, l, []byte("ok"))
		}); err != nil || string(got) != "ok" {
			t.Fatalf("steps before the commit: %q, %v", got, err)
		}
	})
}
