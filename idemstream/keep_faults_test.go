package idemstream_test

// The entry is kept when a write it depends on fails, and let go when it
// is no longer this consumer's (FAULTS.md row 52).

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

// pendingOf returns the group's pending entries.
func pendingOf(t *testing.T, rdb *redis.Client, stream, group string) []redis.XPendingExt {
	t.Helper()
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: group, Start: "-", End: "+", Count: 100}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A dead letter that cannot be written (the dead-letter key holds a
// string: XADD fails) is not acknowledged: the entry stays pending, and
// once the dead-letter stream can be written, it is dead-lettered and
// acknowledged. Nothing is lost.
func TestDeadLetterWriteFailsKeepsTheEntry(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	if err := rdb.Set(ctx, "orders:dead", "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: []any{"no-event-field", "x"}}).Val()
	c := idemstream.New(newIdem(t, addr), rdb, "orders", "g", "c1", quiet, idemstream.WithKey(eventKey),
		idemstream.WithClaimIdle(300*time.Millisecond), idemstream.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	start(t, c, func(context.Context, redis.XMessage) error { return nil })

	time.Sleep(time.Second) // several tries of the dead letter
	if p := pendingOf(t, rdb, "orders", "g"); len(p) != 1 || p[0].ID != id {
		t.Fatalf("pending after the dead letter failed: %+v; want entry %s kept", p, id)
	}
	if err := rdb.Del(ctx, "orders:dead").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, _ := rdb.XLen(ctx, "orders:dead").Result()
		if n == 1 && len(pendingOf(t, rdb, "orders", "g")) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the dead-letter stream became writable: %d dead letters, pending %+v; want the entry dead-lettered and acknowledged", n, pendingOf(t, rdb, "orders", "g"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An entry acknowledged elsewhere (another consumer, an operator) while
// its handler failed is not this consumer's any more: the redelivery
// finds it gone, and the handler does not run again.
func TestRedeliveryOfAnEntryNoLongerPending(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	produce(t, rdb, "orders", []int{1})
	var runs atomic.Int64
	c := idemstream.New(newIdem(t, addr), rdb, "orders", "g", "c1", quiet, idemstream.WithKey(eventKey),
		idemstream.WithBackoff(10*time.Millisecond, 10*time.Millisecond))
	start(t, c, func(ctx context.Context, m redis.XMessage) error {
		if runs.Add(1) == 1 {
			if err := rdb.XAck(ctx, "orders", "g", m.ID).Err(); err != nil {
				t.Error(err)
			}
			return errors.New("transient: the database blinked")
		}
		return nil
	})
	time.Sleep(time.Second)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times; want once: the entry was acknowledged elsewhere before its redelivery", n)
	}
}

// A consumer that is still working on an entry keeps it from the others:
// its heartbeat comes well within the claim-idle time, so another
// consumer's XAUTOCLAIM does not take it while the handler runs.
func TestHeartbeatKeepsTheEntry(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	produce(t, rdb, "orders", []int{1})
	const idle = time.Second
	opts := []idemstream.Option{quiet, idemstream.WithKey(eventKey), idemstream.WithClaimIdle(idle)}
	seen := make(chan []redis.XPendingExt, 1)
	entered := make(chan struct{})
	a := idemstream.New(newIdem(t, addr), rdb, "orders", "g", "a", opts...)
	start(t, a, func(ctx context.Context, m redis.XMessage) error {
		close(entered)
		time.Sleep(4 * idle) // a long handler, with the entry pending to a
		seen <- pendingOf(t, rdb, "orders", "g")
		return nil
	})
	<-entered
	b := idemstream.New(newIdem(t, addr), rdb, "orders", "g", "b", append(opts, idemstream.WithBlock(20*time.Millisecond))...) // b looks for idle entries often
	start(t, b, func(ctx context.Context, m redis.XMessage) error { return nil })
	var p []redis.XPendingExt
	select {
	case p = <-seen:
	case <-time.After(30 * time.Second):
		t.Fatal("a's handler did not end")
	}
	if len(p) != 1 || p[0].Consumer != "a" || p[0].RetryCount != 1 {
		t.Fatalf("pending while a's handler ran for 4 claim-idle times: %+v; want it still a's, delivered once", p)
	}
}
