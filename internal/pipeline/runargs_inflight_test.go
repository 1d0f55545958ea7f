package pipeline_test

// A test that a run never writes into an argument list that an earlier
// run's pipeline may still read.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/pipeline"
)

// stallDeadline is a context whose first Deadline call, which a shared
// pipeline's sender makes before it lays out its commands (see
// batchContext), waits until release is closed.
type stallDeadline struct {
	context.Context
	once    sync.Once
	entered chan struct{} // closed as the first Deadline call waits
	release chan struct{}
}

func (c *stallDeadline) Deadline() (time.Time, bool) {
	c.once.Do(func() {
		close(c.entered)
		<-c.release
	})
	return c.Context.Deadline()
}

// TestRunArgsAgainWhileInFlight guards the claim that a run never writes
// into an argument list that an earlier run's pipeline, which its caller
// gave up on, may still read or write: a caller whose context ended
// after the sender took its call, but before the sender laid out its
// command, runs the same arguments again at once. Under -race it fails if
// the command's first two places were filled by the sender (a write
// racing with the second run's), or rewritten on every run.
func TestRunArgsAgainWhileInFlight(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		rdb := newClient(t, addr, h)
		r := newRunner(t, rdb, 1)
		r.SetSlow(time.Hour)
		alone := newRunner(t, rdb, 0) // runs from its caller's goroutine
		bg := context.Background()
		a := incr.Args([]string{"again"}, "z")

		// The held call takes the place; the stalled call and another
		// queue behind it, the stalled one first (its Deadline is read).
		first, _, release := queueBehindHeld(t, r, h, nil)
		inner, cancel := context.WithCancel(bg)
		defer cancel()
		ctx := &stallDeadline{Context: inner, entered: make(chan struct{}), release: make(chan struct{})}
		gaveUp := make(chan error, 1)
		go func() { gaveUp <- r.RunArgs(ctx, incr, a).Err() }()
		deadline := time.Now().Add(wait)
		for r.Queued() != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%d calls queued, want 1", r.Queued())
			}
			time.Sleep(time.Millisecond)
		}
		other := goRun(r, bg, "other")
		for r.Queued() != 2 {
			if time.Now().After(deadline) {
				t.Fatalf("%d calls queued, want 2", r.Queued())
			}
			time.Sleep(time.Millisecond)
		}
		release()
		recv(t, first)
		select {
		case <-ctx.entered: // the sender took the batch, and has not laid it out
		case <-time.After(wait):
			t.Fatal("the sender did not read the stalled call's deadline")
		}
		cancel()
		var over <-chan struct{}
		select {
		case err := <-gaveUp:
			if over = pipeline.InFlight(err); !errors.Is(err, context.Canceled) || over == nil {
				t.Fatalf("the call that gave up: %v, want context.Canceled, in flight", err)
			}
		case <-time.After(wait):
			t.Fatal("the call did not give up at its context")
		}
		close(ctx.release)
		if v, err := alone.RunArgs(bg, incr, a).Text(); err != nil || (v != "z#1" && v != "z#2") {
			t.Fatalf("the same arguments again: %q, %v", v, err)
		}
		select {
		case <-over:
		case <-time.After(wait):
			t.Fatal("the pipeline was not over")
		}
		if res := recv(t, other); res.err != nil || res.val != "other#1" {
			t.Fatalf("the other queued call: %q, %v", res.val, res.err)
		}
		if n, err := rdb.Get(bg, "again").Int(); err != nil || n != 2 {
			t.Fatalf("the script of the arguments: GET %d, %v; want it run twice", n, err)
		}
	})
}
