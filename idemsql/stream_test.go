package idemsql_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/internal/servertest"
	"github.com/idem-go/idem/idemstream"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/redis/go-redis/v9"
)

// An idemstream consumer whose handler commits through the ledger, on
// every backend: 50 events, each sent twice, Redis flushed of idem's
// records half-way (the stream kept), consumed by two consumers at once.
// Every event is applied once.
func TestIdemstreamThroughTheLedger(t *testing.T) {
	for _, be := range servertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			b := openSuiteBackend(t, be)
			rdb := dbtest.StartRedis(t).Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const events = 50
			send := func(from, to int) {
				for i := from; i < to; i++ {
					for range 2 {
						if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "payments", Values: []any{"event_id", fmt.Sprint("ev-", i)}}).Err(); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			var mu sync.Mutex
			applied := map[string]int{} // events whose handler committed (not rolled back)
			handler := func(ctx context.Context, m redis.XMessage) error {
				id, _ := m.Values["event_id"].(string)
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, rebind(be.Name, "INSERT INTO suite_movements (account) VALUES (?)"), id); err != nil {
					_ = tx.Rollback()
					return err
				}
				err = idemsql.Commit(ctx, tx, []byte(nil))
				if err == nil {
					mu.Lock()
					applied[id]++
					mu.Unlock()
				}
				return err
			}
			run := func(ctx context.Context, name string) *sync.WaitGroup {
				keys := idem.New(rdb, idem.WithLedger(b.l), idem.WithLogger(nil))
				t.Cleanup(func() { keys.Close() })
				c := idemstream.New(keys, rdb, "payments", "debits", name, idemstream.WithLogger(nil),
					idemstream.WithKey(func(m redis.XMessage) string { id, _ := m.Values["event_id"].(string); return id }))
				var wg sync.WaitGroup
				wg.Go(func() { _ = c.Run(ctx, handler) })
				return &wg
			}
			if err := rdb.XGroupCreateMkStream(ctx, "payments", "debits", "0").Err(); err != nil {
				t.Fatal(err)
			}
			send(0, events/2)
			rctx, stop := context.WithCancel(ctx)
			w1, w2 := run(rctx, "c1"), run(rctx, "c2")
			waitFor(t, ctx, func() bool { return pendingAndLag(t, rdb) == 0 })
			// Redis loses idem's records (not the stream), and the first
			// half is sent again with the second.
			keysOfIdem, err := rdb.Keys(ctx, "idem:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(keysOfIdem) > 0 {
				if err := rdb.Del(ctx, keysOfIdem...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			send(0, events)
			waitFor(t, ctx, func() bool { return pendingAndLag(t, rdb) == 0 })
			stop()
			w1.Wait()
			w2.Wait()
			for i := range events {
				id := fmt.Sprint("ev-", i)
				n, err := b.Movements(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if n != 1 || applied[id] != 1 {
					t.Errorf("%s: %d movements, %d commits; want 1", id, n, applied[id])
				}
			}
		})
	}
}

// pendingAndLag returns how many entries of the group are pending or not
// yet delivered.
func pendingAndLag(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	groups, err := rdb.XInfoGroups(context.Background(), "payments").Result()
	if err != nil || len(groups) != 1 {
		t.Fatalf("XINFO GROUPS: %v, %v", groups, err)
	}
	return groups[0].Pending + groups[0].Lag
}

func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("timed out")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The relay writes the field that idemstream keys entries by when
// WithKey is not given.
func TestEventIDFieldIsIdemstreams(t *testing.T) {
	if idemsql.EventIDField != idemstream.EventIDField {
		t.Fatalf("idemsql.EventIDField %q, idemstream.EventIDField %q: relayed events would be keyed by their entry IDs", idemsql.EventIDField, idemstream.EventIDField)
	}
}
