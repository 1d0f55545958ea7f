package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/ledgertest/dbtest"
)

// BenchmarkPublish measures a transaction that inserts a business row and
// Publishes one event in it (with-ns/op) beside the same transaction
// without the Publish (bare-ns/op), in turns, on PostgreSQL with its
// durable defaults: tx is a plain transaction; Do is the transaction of an
// idem.Do with the ledger (a new key each time, on a local redis-server),
// committed by idemsql.Commit with the ledger's row. It reports bare/with,
// the share of the bare transaction's throughput kept (1 = as fast).
// Never asserted.
func BenchmarkPublish(b *testing.B) {
	db, l, ctx := outboxBench(b)
	if _, err := db.Exec("CREATE TABLE bench_orders (id bigint NOT NULL, total bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	// change inserts order i in tx, and with publish its event.
	change := func(ctx context.Context, tx *sql.Tx, i int, publish bool) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO bench_orders (id, total) VALUES ($1, $2)", i, 100+i); err != nil {
			return err
		}
		if publish {
			_, err := idemsql.Publish(ctx, tx, "orders", map[string]any{"order": i, "total": 100 + i})
			return err
		}
		return nil
	}
	b.Run("tx", func(b *testing.B) {
		publishInTurns(b, func(i int, publish bool) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := change(ctx, tx, i, publish); err != nil {
				return err
			}
			return tx.Commit()
		})
	})
	b.Run("Do", func(b *testing.B) {
		c := idem.New(dbtest.StartRedis(b).Client(b), idem.WithLedger(l), idem.WithLogger(nil))
		b.Cleanup(func() { _ = c.Close() })
		run := strconv.FormatInt(time.Now().UnixNano(), 36)
		publishInTurns(b, func(i int, publish bool) error {
			_, err := idem.Do(ctx, c, "bench-"+run+"-"+strconv.Itoa(i), "", func(ctx context.Context) (int, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return 0, err
				}
				defer tx.Rollback()
				if err := change(ctx, tx, i, publish); err != nil {
					return 0, err
				}
				return i, idemsql.Commit(ctx, tx, i)
			})
			return err
		})
	})
}

// publishInTurns runs op with and without a Publish in turns, with order
// numbers of their own, and reports their times and bare/with.
func publishInTurns(b *testing.B, op func(i int, publish bool) error) {
	var with, bare time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		if err := op(2*i, true); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := op(2*i+1, false); err != nil {
			b.Fatal(err)
		}
		with += t1.Sub(t0)
		bare += time.Since(t1)
	}
	b.ReportMetric(float64(with.Nanoseconds())/float64(b.N), "with-ns/op")
	b.ReportMetric(float64(bare.Nanoseconds())/float64(b.N), "bare-ns/op")
	b.ReportMetric(float64(bare)/float64(with), "bare/with")
}

// BenchmarkRelay measures Relay's throughput, events/s from a PostgreSQL
// outbox (durable defaults) to a local redis-server (no persistence), at
// batch sizes 1, 100 and 1000: each op relays 2000 events, published
// before the timer starts. It reports events/s over all ops. Never
// asserted.
func BenchmarkRelay(b *testing.B) {
	db, l, ctx := outboxBench(b)
	rdb := dbtest.StartRedis(b).Client(b)
	for _, batch := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch%d", batch), func(b *testing.B) {
			const n = 2000
			var relaying time.Duration
			for b.Loop() {
				b.StopTimer()
				for i := 0; i < n; i += 100 {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					for j := i; j < i+100; j++ {
						if _, err := idemsql.Publish(ctx, tx, "orders", map[string]any{"order": j}); err != nil {
							b.Fatal(err)
						}
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
				rctx, cancel := context.WithCancel(ctx)
				b.StartTimer()
				start := time.Now()
				_ = l.Relay(rctx, rdb, idemsql.WithRelayBatch(batch), idemsql.WithRelayPoll(time.Millisecond),
					idemsql.WithRelayObserver(func(s idemsql.RelayStats) {
						if s.Published >= n {
							cancel()
						}
					}))
				relaying += time.Since(start)
				cancel()
			}
			b.ReportMetric(float64(n*b.N)/relaying.Seconds(), "events/s")
		})
	}
}

// outboxBench opens a migrated ledger on PostgreSQL with its durable
// defaults, for the outbox's benchmarks, and a context that carries it.
func outboxBench(b *testing.B) (*sql.DB, *idemsql.Ledger, context.Context) {
	db, _ := durablePostgres().Open(b)
	l := idemsql.New(db, idemsql.Postgres)
	ctx := idemsql.NewContext(context.Background(), l)
	if err := l.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	return db, l, ctx
}
