package idemstream_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

// WithMaxDeliveries is the most deliveries an entry gets handled in: with
// 3, an entry that consumers crashed on twice (its takeover is its third
// delivery) runs, and one they crashed on three times (its fourth) is
// dead-lettered without running.
func TestMaxDeliveriesIsExact(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	keys := newIdem(t, addr)
	ids := produce(t, rdb, "s", []int{0, 1})
	if err := rdb.XGroupCreate(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// Delivery 1 of both, to a consumer that crashed.
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "crashed", Streams: []string{"s", ">"}, Count: 2, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	// Deliveries 2 (both) and 3 (ev-0 only), to consumers that crashed.
	for _, msgs := range [][]string{ids, ids[:1]} {
		if err := rdb.XClaim(ctx, &redis.XClaimArgs{Stream: "s", Group: "g", Consumer: "crashed", Messages: msgs}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	ran := map[string]int{}
	c := idemstream.New(keys, rdb, "s", "g", "c1", idemstream.WithKey(eventKey),
		idemstream.WithMaxDeliveries(3), idemstream.WithClaimIdle(100*time.Millisecond), quiet)
	r := start(t, c, func(_ context.Context, m redis.XMessage) error {
		mu.Lock()
		ran[eventKey(m)]++
		mu.Unlock()
		return nil
	})
	drained(t, rdb, "s", "g", ids[1], time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ran["ev-0"] != 0 || ran["ev-1"] != 1 {
		t.Errorf("the handler ran %v; want ev-1 once (its 3rd delivery), ev-0 never (its 4th)", ran)
	}
	dl := deadLetters(t, rdb, "s:dead")
	if len(dl) != 1 || dl[0].Values[idemstream.FieldID] != ids[0] || dl[0].Values[idemstream.FieldDeliveries] != "4" ||
		!strings.Contains(dl[0].Values[idemstream.FieldError].(string), idemstream.ErrTooManyDeliveries.Error()) {
		t.Errorf("dead letters %v, want ev-0's, delivered 4 times, ErrTooManyDeliveries", dl)
	}
}

// A dead consumer's entry is taken over once it has been idle for
// WithClaimIdle, not sooner, however often the live consumer looks (a
// short WithBlock makes it look every half claim-idle time).
func TestTakeoverWaitsForClaimIdle(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	const idle = 2 * time.Second
	keys := newIdem(t, addr)
	ids := produce(t, rdb, "s", []int{0})
	if err := rdb.XGroupCreate(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	readAt := time.Now() // before the delivery: the entry's idle time is shorter than time.Since(readAt)
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{"s", ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	took := make(chan time.Duration, 1)
	c := idemstream.New(keys, rdb, "s", "g", "alive", idemstream.WithKey(eventKey), idemstream.WithClaimIdle(idle),
		idemstream.WithBlock(50*time.Millisecond), quiet)
	r := start(t, c, func(context.Context, redis.XMessage) error {
		select {
		case took <- time.Since(readAt):
		default:
		}
		return nil
	})
	drained(t, rdb, "s", "g", ids[0], time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := <-took; d < idle {
		t.Fatalf("the dead consumer's entry was taken over %v after its delivery; want no sooner than WithClaimIdle (%v)", d.Round(time.Millisecond), idle)
	}
}
