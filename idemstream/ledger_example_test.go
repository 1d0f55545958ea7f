package idemstream_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

// accounts stands in for the service's database: a balance and the
// ledger's rows, which one transaction (accountsTx) changes together. A
// service uses its own database through idemsql or idempgx instead.
type accounts struct {
	mu      sync.Mutex
	balance int
	rows    map[string]idem.Entry
}

func (a *accounts) Lookup(ctx context.Context, key string) (idem.Entry, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.rows[key]
	return e, ok, nil
}

func (a *accounts) MaxKeyLen() int { return 0 }

// accountsTx is one transaction: its credit commits with the ledger's
// row, or, when the key has a row already, rolls back.
type accountsTx struct {
	a      *accounts
	credit int
}

func (tx *accountsTx) Commit(ctx context.Context, e idem.Entry) (idem.Entry, bool, error) {
	tx.a.mu.Lock()
	defer tx.a.mu.Unlock()
	if old, ok := tx.a.rows[e.Key]; ok {
		return old, true, nil
	}
	tx.a.balance += tx.credit
	tx.a.rows[e.Key] = e
	return idem.Entry{}, false, nil
}

func (tx *accountsTx) Rollback(context.Context) error { return nil }

// The handler commits its change and its (empty) outcome in one
// transaction through the ledger, as idemsql.Commit(ctx, tx, []byte(nil))
// does on a database. Redis then loses the record of ev-1 (here an
// operator's Forget; a restart without persistence does the same) and the
// producer sends ev-1 again: the handler runs, its commit meets the
// ledger's row and rolls back, and the account is credited once.
func Example_ledger() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	acct := &accounts{rows: map[string]idem.Entry{}}
	keys := idem.New(rdb, idem.WithLogger(nil), idem.WithLedger(acct))
	defer keys.Close()

	consume := func(events ...string) {
		ctx, stop := context.WithCancel(context.Background())
		for _, ev := range events {
			rdb.XAdd(ctx, &redis.XAddArgs{Stream: "payments", Values: []any{"event_id", ev, "amount", "40"}})
		}
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "payments", Values: []any{"event_id", "stop"}})
		c := idemstream.New(keys, rdb, "payments", "credits", "consumer-1", idemstream.WithScope("payments:"),
			idemstream.WithKey(func(m redis.XMessage) string { id, _ := m.Values["event_id"].(string); return id }))
		_ = c.Run(ctx, func(ctx context.Context, m redis.XMessage) error {
			id := m.Values["event_id"].(string)
			if id == "stop" {
				stop()
				return nil
			}
			amount, err := strconv.Atoi(m.Values["amount"].(string))
			if err != nil {
				return idem.Permanent(err)
			}
			err = idem.Commit(ctx, &accountsTx{a: acct, credit: amount}, []byte(nil))
			switch {
			case errors.Is(err, idem.ErrRecorded):
				fmt.Println(id, "was applied before: rolled back")
			case err == nil:
				fmt.Println(id, "credited", amount)
			}
			return err
		})
		_ = keys.Forget(context.Background(), door.Key("payments:", "stop"))
	}
	consume("ev-1")
	_ = keys.Forget(context.Background(), door.Key("payments:", "ev-1")) // Redis lost the record
	consume("ev-1")
	fmt.Println("balance", acct.balance)
	// Output:
	// ev-1 credited 40
	// ev-1 was applied before: rolled back
	// balance 40
}
