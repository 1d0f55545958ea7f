package idemsql_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem/idemsql"
	"github.com/redis/go-redis/v9"
)

// An order and its "order paid" event commit together; the relay moves
// the event to its stream.
func ExamplePublish() {
	db, ledger, cleanup := exampleDB()
	defer cleanup()
	ctx := idemsql.NewContext(context.Background(), ledger) // inside idem.Do, fn's ctx will do
	if _, err := db.Exec("CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders VALUES ('o-1', 'paid')"); err != nil {
		log.Fatal(err)
	}
	id, err := idemsql.Publish(ctx, tx, "orders.paid", map[string]any{"order": "o-1", "amount": 1250})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(id), "hex digits")
	// Output: 32 hex digits
}

// Relay runs beside the service, until its context ends.
func ExampleLedger_Relay() {
	db, ledger, cleanup := exampleDB()
	defer cleanup()
	ctx := idemsql.NewContext(context.Background(), ledger)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := idemsql.Publish(ctx, tx, "orders.paid", map[string]any{"order": "o-1"}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	relayCtx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- ledger.Relay(relayCtx, rdb, idemsql.WithRelayBatch(100), idemsql.WithRelayPoll(10*time.Millisecond),
			idemsql.WithRelayObserver(func(s idemsql.RelayStats) {
				if s.Published == 1 {
					stop() // for the example: one event, then done
				}
			}))
	}()
	fmt.Println(<-done)
	msgs, err := rdb.XRange(context.Background(), "orders.paid", "-", "+").Result()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(msgs), msgs[0].Values["order"], len(msgs[0].Values[idemsql.EventIDField].(string)))
	// Output:
	// context canceled
	// 1 o-1 32
}
