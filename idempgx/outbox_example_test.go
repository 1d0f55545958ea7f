package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem/idempgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// examplePool opens the examples' database (TestMain made it) and a
// migrated ledger in a table of its own.
func examplePool(table string) (*pgxpool.Pool, *idempgx.Ledger) {
	pool, err := pgxpool.New(context.Background(), exampleDSN) // postgres://…
	if err != nil {
		log.Fatal(err)
	}
	ledger := idempgx.New(pool, idempgx.WithTable(table))
	if err := ledger.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	return pool, ledger
}

// An order and its "order paid" event commit together; the relay moves
// the event to its stream.
func ExamplePublish() {
	pool, ledger := examplePool("example_publish")
	defer pool.Close()
	ctx := idempgx.NewContext(context.Background(), ledger) // inside idem.Do, fn's ctx will do
	if _, err := pool.Exec(ctx, "CREATE TABLE example_orders (id text PRIMARY KEY, status text NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO example_orders VALUES ('o-1', 'paid')"); err != nil {
		log.Fatal(err)
	}
	id, err := idempgx.Publish(ctx, tx, "orders.paid", map[string]any{"order": "o-1", "amount": 1250})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(id), "hex digits")
	// Output: 32 hex digits
}

// Relay runs beside the service, until its context ends.
func ExampleLedger_Relay() {
	pool, ledger := examplePool("example_relay")
	defer pool.Close()
	ctx := idempgx.NewContext(context.Background(), ledger)
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := idempgx.Publish(ctx, tx, "orders.paid", map[string]any{"order": "o-1"}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
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
		done <- ledger.Relay(relayCtx, rdb, idempgx.WithRelayBatch(100), idempgx.WithRelayPoll(10*time.Millisecond),
			idempgx.WithRelayObserver(func(s idempgx.RelayStats) {
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
	fmt.Println(len(msgs), msgs[0].Values["order"])
	// Output:
	// context canceled
	// 1 o-1
}

// A consumer applies each order's events in version order: a version
// already applied is stale, one past the next is a gap (tried later).
func ExampleAdvanceInOrder() {
	pool, ledger := examplePool("example_advance")
	defer pool.Close()
	ctx := idempgx.NewContext(context.Background(), ledger)
	apply := func(version int64) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if err := idempgx.AdvanceInOrder(ctx, tx, "order-1", version); err != nil {
			return err
		}
		// ... the event's change, in tx ...
		return tx.Commit(ctx)
	}
	for _, v := range []int64{1, 3, 2, 2, 3} {
		err := apply(v)
		switch {
		case err == nil:
			fmt.Println(v, "applied")
		case errors.Is(err, idempgx.ErrStale):
			fmt.Println(v, "stale")
		case errors.Is(err, idempgx.ErrGap):
			fmt.Println(v, "gap")
		default:
			log.Fatal(err)
		}
	}
	// Output:
	// 1 applied
	// 3 gap
	// 2 applied
	// 2 stale
	// 3 applied
}

// Advance applies an entity's latest state: an event older than the one
// applied is stale, and gaps are allowed.
func ExampleAdvance() {
	pool, ledger := examplePool("example_advance_latest")
	defer pool.Close()
	ctx := idempgx.NewContext(context.Background(), ledger)
	for _, v := range []int64{2, 1, 5} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			log.Fatal(err)
		}
		err = idempgx.Advance(ctx, tx, "price-of-sku-7", v)
		if err == nil {
			err = tx.Commit(ctx) // with the new price, in tx
		} else {
			_ = tx.Rollback(ctx)
		}
		fmt.Println(v, errors.Is(err, idempgx.ErrStale))
	}
	// Output:
	// 2 false
	// 1 true
	// 5 false
}
