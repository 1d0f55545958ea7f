package idempgx_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// BenchmarkLedger measures a debit on a new key through idem with
// idempgx's ledger (claim, the transaction whose last round trip carries
// the ledger's row with its COMMIT, completion) beside the same pgx
// transaction without idem (BEGIN, UPDATE, INSERT, COMMIT), run in turns
// in phases of 20ms, with 1 and 16 goroutines, each goroutine debiting an
// account of its own through a pool of 16 connections. It reports
// idem-ns/op and bare-ns/op (wall time per debit of each), bare/idem (the
// share of the bare transaction's throughput that idem keeps: 1 = as
// fast), and the round trips per debit: idem-pg-rt/op and bare-pg-rt/op
// to PostgreSQL, idem-redis-rt/op to Redis. Two more pairs split the
// cost: Redis, idem without a ledger around the bare transaction; Row, the
// bare transaction with the ledger's row as a statement of its own (one
// more round trip). PostgreSQL runs with its
// durable defaults (fsync and synchronous_commit on); Redis without
// persistence. Never asserted.
func BenchmarkLedger(b *testing.B) {
	dsn := dbtest.DurablePostgres(b).NewDatabase(b)
	pool, pgWrites := openPool(b, dsn, 16)
	ctx := context.Background()
	ledger := idempgx.New(pool)
	if err := ledger.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if err := createBusiness(ctx, pool); err != nil {
		b.Fatal(err)
	}
	for w := range 16 {
		if _, err := pool.Exec(ctx, "INSERT INTO accounts (id, balance) VALUES ($1, $2)", benchAccount(w), opening); err != nil {
			b.Fatal(err)
		}
	}
	rdb := dbtest.StartRedis(b).Client(b)
	redisTrips := new(atomic.Int64)
	rdb.AddHook(tripHook{redisTrips})
	c := idem.New(rdb, idem.WithLedger(ledger), idem.WithLogger(nil))
	b.Cleanup(func() { _ = c.Close() })

	var keys atomic.Int64
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	idemOp := func(w int) error {
		key := fmt.Sprintf("bench-%s-%d", run, keys.Add(1))
		_, err := idem.Do(ctx, c, key, "", func(ctx context.Context) (Receipt, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return Receipt{}, err
			}
			defer tx.Rollback(ctx)
			r, err := benchChange(ctx, tx, w, key)
			if err != nil {
				return Receipt{}, err
			}
			return r, idempgx.Commit(ctx, tx, r)
		})
		return err
	}
	bareOp := func(w int) error {
		key := fmt.Sprintf("bare-%s-%d", run, keys.Add(1))
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := benchChange(ctx, tx, w, key); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	plain := idem.New(rdb, idem.WithLogger(nil))
	b.Cleanup(func() { _ = plain.Close() })
	redisOp := func(w int) error {
		key := fmt.Sprintf("redis-%s-%d", run, keys.Add(1))
		_, err := plain.Do(ctx, key, "", func(ctx context.Context) ([]byte, error) { return nil, bareOp(w) })
		return err
	}
	rowOp := func(w int) error {
		key := fmt.Sprintf("row-%s-%d", run, keys.Add(1))
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := benchChange(ctx, tx, w, key); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO idem_ledger VALUES ($1, $2, 1, false, $3, statement_timestamp())", []byte(key), make([]byte, 16), make([]byte, 40)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("%dgoroutines", g), func(b *testing.B) {
			inTurns(b, g, idemOp, bareOp, pgWrites, redisTrips)
		})
		b.Run(fmt.Sprintf("%dgoroutines/Redis", g), func(b *testing.B) {
			inTurns(b, g, redisOp, bareOp, pgWrites, redisTrips)
		})
		b.Run(fmt.Sprintf("%dgoroutines/Row", g), func(b *testing.B) {
			inTurns(b, g, rowOp, bareOp, pgWrites, redisTrips)
		})
	}
}

func benchAccount(w int) string { return "bench-" + strconv.Itoa(w) }

// benchChange is the business change of a benchmark's debit: w's account
// and a movement.
func benchChange(ctx context.Context, tx pgx.Tx, w int, op string) (Receipt, error) {
	r := Receipt{Op: op, Amount: 1}
	if err := tx.QueryRow(ctx, "UPDATE accounts SET balance = balance - 1 WHERE id = $1 RETURNING balance", benchAccount(w)).Scan(&r.Balance); err != nil {
		return Receipt{}, err
	}
	_, err := tx.Exec(ctx, "INSERT INTO movements (op, amount, attempt, kind) VALUES ($1, 1, 1, 'bench')", op)
	return r, err
}

// inTurns runs b.N calls of idemOp and b.N of bareOp from g goroutines
// (worker w calls op(w)), in alternating phases of 20ms, so that load on a
// shared machine weighs on both alike, and reports the wall time per call
// of each, their ratio, and the round trips per call that pg and redis
// count during each side's phases.
func inTurns(b *testing.B, g int, idemOp, bareOp func(w int) error, pg, redis *atomic.Int64) {
	const phase = 20 * time.Millisecond
	var times [2]time.Duration
	var pgTrips, redisTrips [2]int64
	left := [2]int64{int64(b.N), int64(b.N)}
	ops := [2]func(int) error{idemOp, bareOp}
	b.ResetTimer()
	for turn := 0; left[0] > 0 || left[1] > 0; turn++ {
		side := turn % 2
		if (turn/2)%2 == 1 {
			side = 1 - side // idem first, then bare first, then idem first...
		}
		if left[side] <= 0 {
			continue
		}
		var (
			remaining atomic.Int64
			done      atomic.Int64
			failed    atomic.Pointer[error]
			wg        sync.WaitGroup
		)
		remaining.Store(left[side])
		pg0, redis0 := pg.Load(), redis.Load()
		end := time.Now().Add(phase)
		t0 := time.Now()
		for w := range g {
			wg.Go(func() {
				for time.Now().Before(end) && remaining.Add(-1) >= 0 {
					if err := ops[side](w); err != nil {
						failed.CompareAndSwap(nil, &err)
						return
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		times[side] += time.Since(t0)
		pgTrips[side] += pg.Load() - pg0
		redisTrips[side] += redis.Load() - redis0
		if err := failed.Load(); err != nil {
			b.Fatal(*err)
		}
		left[side] -= done.Load()
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(times[0].Nanoseconds())/n, "idem-ns/op")
	b.ReportMetric(float64(times[1].Nanoseconds())/n, "bare-ns/op")
	b.ReportMetric(float64(times[1])/float64(times[0]), "bare/idem")
	b.ReportMetric(float64(pgTrips[0])/n, "idem-pg-rt/op")
	b.ReportMetric(float64(pgTrips[1])/n, "bare-pg-rt/op")
	b.ReportMetric(float64(redisTrips[0])/n, "idem-redis-rt/op")
	b.ReportMetric(0, "ns/op")
}

// tripHook counts the round trips of a go-redis client: a command, or a
// pipeline.
type tripHook struct{ n *atomic.Int64 }

func (h tripHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (h tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
