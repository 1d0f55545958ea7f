package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/internal/servertest"
	"github.com/idem-go/idem/ledgertest/dbtest"
)

// BenchmarkLedger measures a debit on a new key through idem with the
// ledger (claim, the transaction with the ledger's INSERT, completion)
// beside the same transaction without idem (BEGIN, UPDATE, INSERT,
// COMMIT), run in turns in phases of 20ms, with 1 and 16 goroutines, each
// goroutine debiting an account of its own. It reports idem-ns/op and
// bare-ns/op (wall time per debit of each) and bare/idem, the share of the
// bare transaction's throughput that idem keeps (1 = as fast). Two more
// pairs split the cost: Redis, idem without a ledger around the bare
// transaction; Row, the bare transaction with the ledger's row written in
// plain SQL. PostgreSQL runs with its durable defaults (fsync on), and so
// does MariaDB (InnoDB's log flushed at every commit, doublewrite on,
// REPEATABLE READ); SQLite
// in WAL mode with its default synchronous=FULL, through one connection
// (SetMaxOpenConns(1), the package doc's advice for one process); Redis
// without persistence. Never asserted.
func BenchmarkLedger(b *testing.B) {
	for _, be := range []servertest.Backend{durablePostgres(), durableMariaDB(), backendNamed("sqlite")} {
		b.Run(be.Name, func(b *testing.B) {
			bk := newBank(b, be)
			ctx := context.Background()
			for _, g := range []int{1, 16} {
				for w := range g {
					open := "INSERT INTO accounts (id, balance) VALUES (?, ?) ON CONFLICT (id) DO NOTHING"
					if be.Name == "mariadb" {
						open = "INSERT INTO accounts (id, balance) VALUES (?, ?) ON DUPLICATE KEY UPDATE id = id"
					}
					if _, err := bk.db.Exec(bk.q(open), benchAccount(w), opening); err != nil {
						b.Fatal(err)
					}
				}
			}
			bk.db.SetMaxIdleConns(32)
			if be.Name == "sqlite" {
				bk.db.SetMaxOpenConns(1)
			}
			c := bk.client(b)
			plain := idem.New(bk.redis.Client(b), idem.WithLogger(nil))
			b.Cleanup(func() { _ = plain.Close() })
			var keys atomic.Int64
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			idemOp := func(w int) error {
				key := fmt.Sprintf("bench-%s-%d", run, keys.Add(1))
				_, err := idem.Do(ctx, c, key, "", func(ctx context.Context) (Receipt, error) {
					tx, err := bk.db.BeginTx(ctx, nil)
					if err != nil {
						return Receipt{}, err
					}
					defer tx.Rollback()
					r, err := benchChange(ctx, bk, tx, w, key)
					if err != nil {
						return Receipt{}, err
					}
					return r, idemsql.Commit(ctx, tx, r)
				})
				return err
			}
			bareOp := func(w int) error {
				key := fmt.Sprintf("bare-%s-%d", run, keys.Add(1))
				tx, err := bk.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := benchChange(ctx, bk, tx, w, key); err != nil {
					return err
				}
				return tx.Commit()
			}
			redisOp := func(w int) error {
				key := fmt.Sprintf("redis-%s-%d", run, keys.Add(1))
				_, err := plain.Do(ctx, key, "", func(ctx context.Context) ([]byte, error) {
					return nil, bareOp(w)
				})
				return err
			}
			rowSQL := "INSERT INTO idem_ledger (idem_key, fingerprint, attempt, failed, outcome, recorded_at) VALUES (?, ?, 1, false, ?, ?)"
			stamp := func() any { return time.Now().UnixMilli() }
			switch be.Name {
			case "postgres":
				stamp = func() any { return time.Now() }
			case "mariadb":
				stamp = func() any { return time.Now().UTC() }
			}
			rowOp := func(w int) error {
				key := fmt.Sprintf("row-%s-%d", run, keys.Add(1))
				tx, err := bk.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := benchChange(ctx, bk, tx, w, key); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, bk.q(rowSQL), []byte(key), make([]byte, 16), make([]byte, 40), stamp()); err != nil {
					return err
				}
				return tx.Commit()
			}
			for _, g := range []int{1, 16} {
				b.Run(fmt.Sprintf("%dgoroutines", g), func(b *testing.B) {
					inTurns(b, g, idemOp, bareOp)
				})
				b.Run(fmt.Sprintf("%dgoroutines/Redis", g), func(b *testing.B) {
					inTurns(b, g, redisOp, bareOp)
				})
				b.Run(fmt.Sprintf("%dgoroutines/Row", g), func(b *testing.B) {
					inTurns(b, g, rowOp, bareOp)
				})
			}
		})
	}
}

func durablePostgres() servertest.Backend {
	return servertest.Backend{Name: "postgres", Driver: "pgx", Open: func(tb testing.TB) (*sql.DB, string) {
		pg := dbtest.DurablePostgres(tb)
		dsn := pg.NewDatabase(tb)
		return pg.Open(tb, dsn), dsn
	}}
}

func durableMariaDB() servertest.Backend {
	return servertest.Backend{Name: "mariadb", Driver: "mysql", Open: func(tb testing.TB) (*sql.DB, string) {
		m := dbtest.DurableMariaDB(tb)
		dsn := m.NewDatabase(tb)
		return m.Open(tb, dsn), dsn
	}}
}

func benchAccount(w int) string { return "bench-" + strconv.Itoa(w) }

// benchChange is the business change of a benchmark's debit: w's account
// and a movement.
func benchChange(ctx context.Context, bk *bank, tx *sql.Tx, w int, op string) (Receipt, error) {
	r := Receipt{Op: op, Amount: 1}
	var err error
	if r.Balance, err = bk.debitBalance(ctx, tx, benchAccount(w), 1); err != nil {
		return Receipt{}, err
	}
	if _, err := tx.ExecContext(ctx, bk.q("INSERT INTO movements (op, amount, attempt, kind) VALUES (?, 1, 1, 'bench')"), op); err != nil {
		return Receipt{}, err
	}
	return r, nil
}

// inTurns runs b.N calls of idemOp and b.N of bareOp from g goroutines
// (worker w calls op(w)), in alternating phases of 20ms, so that load on a
// shared machine weighs on both alike, and reports the wall time per call
// of each and their ratio.
func inTurns(b *testing.B, g int, idemOp, bareOp func(w int) error) {
	const phase = 20 * time.Millisecond
	var idemTime, bareTime time.Duration
	left := [2]int64{int64(b.N), int64(b.N)}
	ops := [2]func(int) error{idemOp, bareOp}
	totals := [2]*time.Duration{&idemTime, &bareTime}
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
		*totals[side] += time.Since(t0)
		if err := failed.Load(); err != nil {
			b.Fatal(*err)
		}
		left[side] -= done.Load()
	}
	b.StopTimer()
	b.ReportMetric(float64(idemTime.Nanoseconds())/float64(b.N), "idem-ns/op")
	b.ReportMetric(float64(bareTime.Nanoseconds())/float64(b.N), "bare-ns/op")
	b.ReportMetric(float64(bareTime)/float64(idemTime), "bare/idem")
}
