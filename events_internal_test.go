package idem

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Without an observer, a call takes no notes: the check in Do and the
// notes on the call path allocate nothing.
func TestNoNotesWithoutObserver(t *testing.T) {
	// Not parallel: it counts allocations, which parallel tests would add to.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	c := New(rdb, WithLogger(nil))
	defer c.Close()
	ctx := context.WithValue(context.Background(), struct{ k int }{1}, "a caller's value")
	cl := &call{c: c, key: "k"}
	notes := func() {
		if c.observed() {
			t.Fatal("a call without observer is observed")
		}
		cl.observeClaim(replyBusy, 1, 0)
		cl.observeClaim(replyClaimed, 2, 0)
		cl.observeFollow()
		cl.observeRelease(ctx)
		cl.observeStored(nil, nil)
		cl.observeLedger(true, false, false, 0)
	}
	if n := testing.AllocsPerRun(1000, notes); n != 0 {
		t.Fatalf("%v allocations per call without an observer", n)
	}
}
