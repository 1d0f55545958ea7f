package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/ledgertest/dbtest"
)

// BenchmarkPublish measures a transaction that inserts a business row and
// Publishes one event in it (with-ns/op) beside the same transaction
// without the Publish (bare-ns/op), in turns, on PostgreSQL with its
// durable defaults. It reports bare/with, the share of the bare
// transaction's throughput kept (1 = as fast). Never asserted.
func BenchmarkPublish(b *testing.B) {
	db, _, ctx := outboxBench(b)
	if _, err := db.Exec("CREATE TABLE bench_orders (id bigint NOT NULL, total bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	order := func(i int, publish bool) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.Exec("INSERT INTO bench_orders (id, total) VALUES ($1, $2)", i, 100+i); err != nil {
			b.Fatal(err)
		}
		if publish {
			if _, err := idemsql.Publish(ctx, tx, "orders", map[string]any{"order": i, "total": 100 + i}); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	var with, bare time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		order(2*i, true)
		t1 := time.Now()
		order(2*i+1, false)
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
