package idem_test

// Attacks on recording an outcome (owner.go): a completion that gives up
// while its pipeline is still under way.

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A completion of a large result (its record built in a pooled buffer)
// shares a pipeline with a claim whose caller has no deadline; the
// connection breaks before they reach Redis, and go-redis re-sends the
// pipeline after a backoff longer than the store timeout. The owner gives
// up first (ErrNotRecorded), and another call of the process records a
// large result of its own meanwhile. When the pipeline is re-sent, the
// first key must get its own record or none: never the other key's.
func TestOwnerAttackCompletionOutlivedByItsPipeline(t *testing.T) {
	// In a process of its own: it sets GOMAXPROCS, which is process-wide.
	if idemtest.RunInChild(t) {
		return
	}
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	idemtest.LoadScripts(t, b)
	// One P: the buffer A's owner puts back in the pool is the one C's
	// owner gets (the race detector's pool still drops some).
	procs := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(procs) })
	claimSHA, completeSHA := idemtest.ScriptSHA(t, "claim"), idemtest.ScriptSHA(t, "complete")
	script := func(sha, key string) func([]string) bool {
		return func(cmd []string) bool {
			return len(cmd) > 3 && cmd[0] == "EVALSHA" && cmd[1] == sha && cmd[3] == key
		}
	}
	in := faultconn.New(
		// Holds the Client's one pipeline place while A's completion and
		// B's claim queue behind it.
		faultconn.Rule{Match: script(claimSHA, "idem:{hold}"), Action: faultconn.DelayReply, Delay: time.Second},
		faultconn.Rule{Match: script(completeSHA, "idem:{A}"), Nth: 1, Action: faultconn.CloseBefore},
	)
	c := idemtest.Faulty(t, b, in, func(o *redis.Options) {
		o.MaxRetries = 2
		o.MinRetryBackoff, o.MaxRetryBackoff = 5*time.Second, 5*time.Second
	}, idem.WithPipelines(1), idem.WithStoreTimeout(3*time.Second), idem.WithWait(0), idem.WithLogger(nil))
	idem.SetSlowPipeline(c, time.Hour)
	clean := b.Idem(t, idem.WithLogger(nil))

	resultA, resultC := bytes.Repeat([]byte("a"), 100<<10), bytes.Repeat([]byte("c"), 100<<10)
	entered, release := make(chan struct{}), make(chan struct{})
	doneA := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, "A", "fp", func(ctx context.Context) ([]byte, error) {
			close(entered)
			<-release
			return resultA, nil
		})
		// On the same goroutine (the pool's buffers are per P): another
		// key's large result, recorded while A's pipeline waits to be
		// re-sent.
		if _, cerr := clean.Do(ctx, "C", "fp", func(ctx context.Context) ([]byte, error) { return resultC, nil }); cerr != nil {
			t.Errorf("C: %v", cerr)
		}
		doneA <- err
	}()
	<-entered
	holdDone := make(chan struct{})
	go func() {
		defer close(holdDone)
		_, _ = c.Do(ctx, "hold", "", func(ctx context.Context) ([]byte, error) { return []byte("h"), nil })
	}()
	idemtest.Eventually(t, 5*time.Second, "the hold's claim to be in flight", func() bool { return in.Hits() == 1 })
	close(release)
	idemtest.Eventually(t, 5*time.Second, "A's completion to queue", func() bool { return idem.Queued(c) == 1 })
	bDone := make(chan struct{})
	go func() {
		defer close(bDone)
		_, _ = c.Do(context.Background(), "B", "", func(ctx context.Context) ([]byte, error) { return []byte("b"), nil })
	}()
	idemtest.Eventually(t, 5*time.Second, "B's claim to queue", func() bool { return idem.Queued(c) == 2 })

	if err := <-doneA; !errors.Is(err, idem.ErrNotRecorded) {
		t.Fatalf("A: %v; want ErrNotRecorded (the store timeout ended first)", err)
	}
	<-bDone
	<-holdDone
	if n := in.Hits(); n != 2 {
		t.Fatalf("the faults acted %d times; want 2 (the hold, the cut pipeline)", n)
	}
	got, err := clean.Do(ctx, "A", "fp", func(ctx context.Context) ([]byte, error) { return []byte("ran again"), nil })
	switch {
	case err == nil && bytes.Equal(got, resultC):
		t.Fatal("A's record holds C's result")
	case err == nil && bytes.Equal(got, resultA):
		// The re-sent completion stored A's own record.
	case errors.Is(err, idem.ErrInProgress), err == nil && string(got) == "ran again":
		// Not stored: the claim stays until its lease ends.
	default:
		t.Fatalf("A after the re-send: %d bytes %.8q..., %v", len(got), got, err)
	}
}
