package pipeline

// Tests that a successful call allocates nothing in this package beyond
// what go-redis allocates to send its script: a lone call costs what
// Script.Run costs, a pipeline what go-redis's own pipeline of the same
// EVALSHAs costs, and the error checks cost nothing on a nil error.

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAllocsOfASuccessfulCall counts allocations with testing.AllocsPerRun
// on a real redis-server (miniredis would allocate in this process too).
func TestAllocsOfASuccessfulCall(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	srv := redistest.Start(t, redistest.Config{})
	if srv == nil {
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := NewScript(`return 1`)
	keys := []string{"k"}
	if err := s.Run(ctx, rdb, keys).Err(); err != nil { // caches the script
		t.Fatal(err)
	}
	var work Work
	t.Cleanup(work.Wait)
	r := NewRunner(rdb, 4, &work)
	const runs = 200

	t.Run("nil error", func(t *testing.T) {
		var err error
		if got := testing.AllocsPerRun(runs, func() { _ = InFlight(err) }); got != 0 {
			t.Errorf("InFlight(nil) allocates %v times, want 0", got)
		}
		if got := testing.AllocsPerRun(runs, func() { _ = NotSent(err) }); got != 0 {
			t.Errorf("NotSent(nil) allocates %v times, want 0", got)
		}
	})

	t.Run("alone", func(t *testing.T) {
		bare := testing.AllocsPerRun(runs, func() {
			if err := s.Run(ctx, rdb, keys).Err(); err != nil {
				t.Fatal(err)
			}
		})
		got := testing.AllocsPerRun(runs, func() {
			if err := r.Run(ctx, s, keys).Err(); err != nil {
				t.Fatal(err)
			}
		})
		if got > bare {
			t.Errorf("a lone call allocates %v times, Script.Run %v: want no more", got, bare)
		}
	})

	t.Run("pipelined", func(t *testing.T) {
		const n = 4
		bare := testing.AllocsPerRun(runs, func() {
			pipe := rdb.Pipeline()
			for range n {
				pipe.EvalSha(ctx, s.Hash(), keys)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		})
		batch := make([]*batchedCall, n)
		for i := range batch {
			batch[i] = &batchedCall{ctx: ctx, s: s, args: s.Args(keys), done: make(chan struct{}, 1)}
		}
		got := testing.AllocsPerRun(runs, func() {
			r.one.send(batch)
			for _, bc := range batch {
				<-bc.done
				if err := bc.cmd.Err(); err != nil {
					t.Fatal(err)
				}
			}
		})
		if got > bare {
			t.Errorf("a pipeline of %d calls allocates %v times, go-redis's own %v: want no more", n, got, bare)
		}
	})

	t.Run("errors still read", func(t *testing.T) {
		// The nil fast paths must not hide the errors they look for.
		done := make(chan struct{})
		in := ErrCmd(ctx, inFlightError{context.Canceled, done}).Err()
		if InFlight(in) != done || NotSent(in) {
			t.Errorf("an in-flight error: InFlight %v, NotSent %v", InFlight(in), NotSent(in))
		}
		ns := ErrCmd(ctx, notSentError{context.Canceled}).Err()
		if !NotSent(ns) || InFlight(ns) != nil || !errors.Is(ns, context.Canceled) {
			t.Errorf("a not-sent error: NotSent %v, InFlight %v", NotSent(ns), InFlight(ns))
		}
	})
}
