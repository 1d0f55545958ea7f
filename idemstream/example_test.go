package idemstream_test

import (
	"context"
	"fmt"
	"strconv"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

// A producer that lost the reply to an XADD sent event ev-1 twice; the
// consumer credits it once, and acknowledges both entries.
func Example() {
	mr, _ := miniredis.Run() // any Redis; miniredis keeps the example self-contained
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb, idem.WithLogger(nil))
	defer keys.Close()

	ctx, stop := context.WithCancel(context.Background())
	for _, ev := range []struct{ id, amount string }{{"ev-1", "40"}, {"ev-2", "2"}, {"ev-1", "40"}, {"ev-3", "100"}} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "payments", Values: []any{"event_id", ev.id, "amount", ev.amount}})
	}

	balance := 0
	c := idemstream.New(keys, rdb, "payments", "ledger", "consumer-1",
		idemstream.WithKey(func(m redis.XMessage) string { id, _ := m.Values["event_id"].(string); return id }))
	err := c.Run(ctx, func(ctx context.Context, m redis.XMessage) error {
		amount, err := strconv.Atoi(m.Values["amount"].(string))
		if err != nil {
			return idem.Permanent(err) // no retry makes it a number
		}
		balance += amount
		fmt.Println("credited", m.Values["event_id"], amount)
		if m.Values["event_id"] == "ev-3" {
			stop() // the example ends here; Run returns once this handler has
		}
		return nil
	})
	pending, _ := rdb.XPending(context.Background(), "payments", "ledger").Result()
	fmt.Println("balance", balance, "pending", pending.Count, "error", err)
	// Output:
	// credited ev-1 40
	// credited ev-2 2
	// credited ev-3 100
	// balance 142 pending 0 error <nil>
}
