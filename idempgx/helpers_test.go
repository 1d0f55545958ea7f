package idempgx_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// bank is a database with a ledger and a business: accounts, and the
// movements that debits write. movements has no unique key on purpose:
// only the ledger keeps a debit from being applied twice.
type bank struct {
	dsn    string
	pool   *pgxpool.Pool
	ledger *idempgx.Ledger
	redis  *redis.Client
	writes *atomic.Int64 // writes to the database's connections (round trips)
	n      atomic.Int64  // Redis prefixes handed out
}

const opening = int64(1_000_000)

// Receipt is what a debit returns: the balance after it tells one
// execution from another.
type Receipt struct {
	Op      string
	Amount  int64
	Balance int64
	Attempt int64
}

// newBank returns a bank on a new database of the shared server, migrated,
// with a pool of at most maxConns connections (0: pgxpool's default) and a
// redis-server of its own.
func newBank(t testing.TB, maxConns int32) *bank {
	t.Helper()
	b := &bank{dsn: dbtest.SharedPostgres(t).NewDatabase(t)}
	b.pool, b.writes = openPool(t, b.dsn, maxConns)
	b.ledger = idempgx.New(b.pool)
	ctx := context.Background()
	if err := b.ledger.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := createBusiness(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	b.redis = dbtest.StartRedis(t).Client(t)
	return b
}

// openPool opens a pool on dsn whose connections count their writes.
func openPool(t testing.TB, dsn string, maxConns int32) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	writes := new(atomic.Int64)
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, writes
}

// countingConn counts the writes to a connection: pgx writes each request
// (a query, a batch) in one write and then waits for the answer, so the
// count is the round trips.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// createBusiness creates the tables of the business and opens the account.
func createBusiness(ctx context.Context, pool *pgxpool.Pool) error {
	for _, q := range []string{
		"CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)",
		"CREATE TABLE movements (op TEXT NOT NULL, amount BIGINT NOT NULL, attempt BIGINT NOT NULL, kind TEXT NOT NULL)",
		fmt.Sprintf("INSERT INTO accounts VALUES ('acct', %d)", opening),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// client returns a Client of the bank's Redis and ledger, with a prefix of
// its own: two clients are two Redis records of one key (two live owners).
func (b *bank) client(t testing.TB, opts ...idem.Option) *idem.Client {
	t.Helper()
	all := append([]idem.Option{
		idem.WithLedger(b.ledger), idem.WithPrefix(fmt.Sprintf("b%d", b.n.Add(1))),
		idem.WithWait(30 * time.Second), idem.WithLogger(nil),
	}, opts...)
	c := idem.New(b.redis, all...)
	t.Cleanup(func() { c.Close() })
	return c
}

// change applies the business change of a debit in tx: the balance, and
// a movement row.
func change(ctx context.Context, tx pgx.Tx, op string, amount int64, kind string) (Receipt, error) {
	a, _ := idem.AttemptFrom(ctx)
	r := Receipt{Op: op, Amount: amount, Attempt: a.Number}
	err := tx.QueryRow(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = 'acct' RETURNING balance", amount).Scan(&r.Balance)
	if err != nil {
		return Receipt{}, err
	}
	_, err = tx.Exec(ctx, "INSERT INTO movements (op, amount, attempt, kind) VALUES ($1, $2, $3, $4)", op, amount, a.Number, kind)
	return r, err
}

// debit is the fn of a debit of amount under op, recorded by the ledger.
func (b *bank) debit(op string, amount int64) func(ctx context.Context) (Receipt, error) {
	return func(ctx context.Context) (Receipt, error) {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return Receipt{}, err
		}
		defer tx.Rollback(ctx)
		r, err := change(ctx, tx, op, amount, "debit")
		if err != nil {
			return Receipt{}, err
		}
		return r, idempgx.Commit(ctx, tx, r)
	}
}

// movements returns how many movements of op are committed.
func (b *bank) movements(t testing.TB, op string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT COUNT(*) FROM movements WHERE op = $1", op).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bank) flush(t testing.TB) {
	t.Helper()
	if err := b.redis.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// watchdog runs f and fails the test if it has not returned after d: a
// stall (a call waiting for a connection that never comes).
func watchdog(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		panic(fmt.Sprintf("%s: %s stalled for %v", t.Name(), what, d)) // the stack of every goroutine shows where
	}
}

func fingerprint(op string, amount int64) string { return idem.Fingerprint(op, amount) }
