package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// retryUntilDone is the newcomer's client: a request with a 150 ms timeout,
// retried with one key every 50 ms, against a handler whose provider call
// takes 600 ms (200 ms left too little margin over the deadline beside
// busy loops). It returns how many retries succeeded, the first success's
// index, and how many charges the provider took.
func retryUntilDone(t *testing.T, c *idem.Client, key string) (successes, first int, charges int64) {
	t.Helper()
	var n atomic.Int64
	fn := func(ctx context.Context) ([]byte, error) {
		select {
		case <-time.After(600 * time.Millisecond): // the provider's charge
			if err := ctx.Err(); err != nil {
				// Both ready at once (a loaded machine woke this late): a
				// cancelled call does not charge.
				return nil, err
			}
			n.Add(1)
			return []byte("charged"), nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	first = -1
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		res, err := c.Do(ctx, key, "debit 100", fn)
		cancel()
		switch {
		case err == nil:
			if string(res) != "charged" {
				t.Fatalf("retry %d: %q", i, res)
			}
			successes++
			if first < 0 {
				first = i
			}
		case !errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("retry %d: %v; want the caller's deadline", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return successes, first, n.Load()
}

// The newcomer's case (issue 34): with WithDetach, the work outlives the
// request that started it, and a retry gets its outcome; without it,
// every retry cancels the attempt before it ends.
func TestDetachOutlivesTheCaller(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithDetach(10*time.Second), idem.WithLogger(nil))
		successes, first, charges := retryUntilDone(t, c, "detached")
		if successes == 0 || charges != 1 {
			t.Fatalf("with WithDetach: %d successes in 10 retries, %d charges; want a success and one charge", successes, charges)
		}
		t.Logf("with WithDetach: first success at retry %d, %d charge", first, charges)

		plain := b.Idem(t, idem.WithLogger(nil))
		if successes, _, charges := retryUntilDone(t, plain, "attached"); successes != 0 || charges != 0 {
			t.Fatalf("without WithDetach: %d successes, %d charges; the caller's deadline should cancel every attempt", successes, charges)
		}
	})
}

type ctxKey struct{}

// A detached fn keeps the caller's values, loses its cancellation, and is
// bounded by WithDetach's max.
func TestDetachBoundedByMax(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	// max bounds the claim too: with 300ms, a loaded machine (load 14)
	// ended the claim before fn started.
	const max = 2 * time.Second
	c := b.Idem(t, idem.WithDetach(max), idem.WithLogger(nil))
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	type seen struct {
		value    any
		deadline time.Duration
		ended    error
		after    time.Duration
	}
	got := make(chan seen, 1)
	start := time.Now()
	_, err := c.Do(ctx, "k", "", func(fctx context.Context) ([]byte, error) {
		cancel() // the caller gives up at once
		s := seen{value: fctx.Value(ctxKey{})}
		if d, ok := fctx.Deadline(); ok {
			s.deadline = time.Until(d)
		}
		<-fctx.Done()
		s.ended, s.after = fctx.Err(), time.Since(start)
		got <- s
		return nil, fctx.Err()
	})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "WithDetach") {
		t.Fatalf("the caller's Do: %v; want its context's error, saying fn goes on", err)
	}
	s := <-got
	if s.value != "v" {
		t.Errorf("fn's context value %v; want the caller's", s.value)
	}
	if s.deadline <= 0 || s.deadline > max {
		t.Errorf("fn's deadline %v away; want within WithDetach's %v", s.deadline, max)
	}
	if !errors.Is(s.ended, context.DeadlineExceeded) || s.after < max-50*time.Millisecond {
		t.Errorf("fn's context ended with %v after %v; want its deadline, after %v, not the caller's cancellation", s.ended, s.after, max)
	}
}

// A detached fn's outcome is recorded after its caller has gone, and Close
// waits for it.
func TestDetachCloseWaits(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := idem.New(b.Client(t), idem.WithDetach(10*time.Second), idem.WithLogger(nil))
	ctx, cancel := context.WithCancel(context.Background())
	var finished atomic.Bool
	_, err := c.Do(ctx, "k", "", func(context.Context) ([]byte, error) {
		cancel()
		time.Sleep(300 * time.Millisecond)
		finished.Store(true)
		return []byte("done"), nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do: %v", err)
	}
	if finished.Load() {
		t.Fatal("Do waited for the detached fn")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !finished.Load() {
		t.Fatal("Close returned before the detached fn ended")
	}
	if st := idemtest.Status(t, b, "k"); st.State != idem.StateDone {
		t.Fatalf("after Close: %v; want the detached outcome recorded", st.State)
	}
	other := b.Idem(t)
	if res, err := other.Do(context.Background(), "k", "", func(context.Context) ([]byte, error) {
		t.Error("fn ran again")
		return nil, nil
	}); err != nil || string(res) != "done" {
		t.Fatalf("a retry: %q, %v", res, err)
	}
}

// A typed Do whose caller has gone does not race with the detached fn
// that sets its result (run with -race).
func TestDetachTyped(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := b.Idem(t, idem.WithDetach(10*time.Second), idem.WithLogger(nil))
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*time.Millisecond)
			defer cancel()
			_, _ = idem.Do(ctx, c, "typed", "", func(context.Context) (int, error) {
				time.Sleep(10 * time.Millisecond)
				return 42, nil
			})
		})
	}
	wg.Wait()
	if v, err := idem.Do(context.Background(), c, "typed", "", func(context.Context) (int, error) { return 0, errors.New("ran again") }); err != nil || v != 42 {
		t.Fatalf("the outcome: %v, %v", v, err)
	}
}

// A panic in a detached fn reaches a caller that still waits; after the
// caller has gone it is logged, the claim is released, and the process
// goes on.
func TestDetachPanic(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	c := b.Idem(t, idem.WithDetach(10*time.Second), idem.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))))
	func() {
		defer func() {
			if p := recover(); p != "kaboom" {
				t.Fatalf("recovered %v; want the detached fn's panic", p)
			}
		}()
		_, _ = c.Do(context.Background(), "waiting", "", func(context.Context) ([]byte, error) { panic("kaboom") })
		t.Fatal("Do returned")
	}()

	ctx, cancel := context.WithCancel(context.Background())
	released := make(chan struct{})
	_, err := c.Do(ctx, "gone", "", func(context.Context) ([]byte, error) {
		cancel()
		defer close(released)
		time.Sleep(100 * time.Millisecond)
		panic("kaboom after the caller left")
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do: %v", err)
	}
	<-released
	deadline := time.Now().Add(10 * time.Second)
	for idemtest.Status(t, b, "gone").State != idem.StateReleased {
		if time.Now().After(deadline) {
			t.Fatalf("the claim of a panicked detached fn: %v; want released", idemtest.Status(t, b, "gone").State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var attempt int64
	if _, err := c.Do(context.Background(), "gone", "", func(ctx context.Context) ([]byte, error) {
		a, _ := idem.AttemptFrom(ctx)
		attempt = a.Number
		return []byte("ok"), nil
	}); err != nil || attempt != 2 {
		t.Fatalf("the next call: %v, attempt %d; want attempt 2", err, attempt)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "panicked after its caller had gone") || !strings.Contains(logs.String(), "kaboom after the caller left") {
		t.Fatalf("logs: %s; want the panic logged", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
