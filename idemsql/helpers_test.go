package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/internal/servertest"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/redis/go-redis/v9"
)

// bank is a database with a ledger and a business: accounts, and the
// movements that debits write. movements has no unique key on purpose:
// only the ledger keeps a debit from being applied twice.
type bank struct {
	name    string // of the backend
	db      *sql.DB
	dsn     string
	dialect idemsql.Dialect
	ledger  *idemsql.Ledger
	redis   *dbtest.Redis
	runs    atomic.Int64 // debit fns started
}

const (
	account = "acct"
	opening = int64(1_000_000)
)

// Receipt is what a debit returns: the balance after it tells one
// execution from another.
type Receipt struct {
	Op      string
	Amount  int64
	Balance int64
	Attempt int64
}

var dialects = map[string]idemsql.Dialect{"postgres": idemsql.Postgres, "sqlite": idemsql.SQLite, "mariadb": idemsql.MySQL}

// eachBank runs test on a new bank of each backend, in parallel, with a
// redis-server of its own.
func eachBank(t *testing.T, test func(t *testing.T, b *bank)) {
	for _, be := range servertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			test(t, newBank(t, be))
		})
	}
}

func newBank(t testing.TB, be servertest.Backend) *bank {
	db, dsn := be.Open(t)
	b := &bank{name: be.Name, db: db, dsn: dsn, dialect: dialects[be.Name]}
	b.ledger = idemsql.New(db, b.dialect)
	ctx := context.Background()
	if err := b.ledger.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := createBusiness(ctx, db, be.Name); err != nil {
		t.Fatal(err)
	}
	b.redis = dbtest.StartRedis(t)
	return b
}

// createBusiness creates the tables of the business and opens the account.
func createBusiness(ctx context.Context, db *sql.DB, backend string) error {
	for _, q := range []string{
		"CREATE TABLE accounts (id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL)",
		"CREATE TABLE movements (op TEXT NOT NULL, amount BIGINT NOT NULL, attempt BIGINT NOT NULL, kind TEXT NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	_, err := db.ExecContext(ctx, rebind(backend, "INSERT INTO accounts (id, balance) VALUES (?, ?)"), account, opening)
	return err
}

// rebind turns the ? placeholders of q into Postgres's $n.
func rebind(backend, q string) string {
	if backend != "postgres" {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (b *bank) q(query string) string { return rebind(b.name, query) }

// client returns an idem Client on the bank's Redis, with the ledger.
func (b *bank) client(t testing.TB, opts ...idem.Option) *idem.Client {
	return b.clientOn(t, b.redis.Client(t), opts...)
}

func (b *bank) clientOn(t testing.TB, rdb redis.UniversalClient, opts ...idem.Option) *idem.Client {
	opts = append([]idem.Option{idem.WithLedger(b.ledger), idem.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	c := idem.New(rdb, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// change applies the business change of a debit in tx: the balance, and a
// movement row.
func (b *bank) change(ctx context.Context, tx *sql.Tx, op string, amount int64, kind string) (Receipt, error) {
	a, _ := idem.AttemptFrom(ctx)
	r := Receipt{Op: op, Amount: amount, Attempt: a.Number}
	var err error
	if r.Balance, err = b.debitBalance(ctx, tx, account, amount); err != nil {
		return Receipt{}, err
	}
	if _, err := tx.ExecContext(ctx, b.q("INSERT INTO movements (op, amount, attempt, kind) VALUES (?, ?, ?, ?)"), op, amount, a.Number, kind); err != nil {
		return Receipt{}, err
	}
	return r, nil
}

// debitBalance takes amount from the balance of acct in tx and returns the
// new balance (MariaDB has no UPDATE ... RETURNING).
func (b *bank) debitBalance(ctx context.Context, tx *sql.Tx, acct string, amount int64) (int64, error) {
	var n int64
	if b.name != "mariadb" {
		err := tx.QueryRowContext(ctx, b.q("UPDATE accounts SET balance = balance - ? WHERE id = ? RETURNING balance"), amount, acct).Scan(&n)
		return n, err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - ? WHERE id = ?", amount, acct); err != nil {
		return 0, err
	}
	err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = ?", acct).Scan(&n)
	return n, err
}

// debit is fn of a debit: the business change and the outcome in one
// transaction. It has no reconcile code: the ledger is all it needs.
func (b *bank) debit(op string, amount int64) func(context.Context) (Receipt, error) {
	return func(ctx context.Context) (Receipt, error) {
		b.runs.Add(1)
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return Receipt{}, err
		}
		defer tx.Rollback()
		r, err := b.change(ctx, tx, op, amount, "debit")
		if err != nil {
			return Receipt{}, err
		}
		return r, idemsql.Commit(ctx, tx, r)
	}
}

func fingerprint(op string, amount int64) string { return idem.Fingerprint(op, amount) }

// balance returns the account's balance.
func (b *bank) balance(t testing.TB) int64 {
	t.Helper()
	var n int64
	if err := b.db.QueryRow(b.q("SELECT balance FROM accounts WHERE id = ?"), account).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// movements returns how many movement rows op has, of any kind.
func (b *bank) movements(t testing.TB, op string) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(b.q("SELECT count(*) FROM movements WHERE op = ?"), op).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// rows returns how many rows the ledger holds.
func (b *bank) rows(t testing.TB) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow("SELECT count(*) FROM " + b.ledger.Table()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// entry returns the ledger's entry for key, failing the test if none.
func (b *bank) entry(t testing.TB, key string) idem.Entry {
	t.Helper()
	e, ok, err := b.ledger.Lookup(context.Background(), key)
	if err != nil || !ok {
		t.Fatalf("ledger lookup %q: %v, %v; want an entry", key, ok, err)
	}
	return e
}

// flush empties the bank's Redis (FLUSHALL): Redis lost every record.
func (b *bank) flush(t testing.TB) {
	t.Helper()
	c := b.redis.Client(t)
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

func (r Receipt) String() string {
	return fmt.Sprintf("%s:%d@%d#%d", r.Op, r.Amount, r.Balance, r.Attempt)
}

func backendNamed(name string) servertest.Backend {
	for _, be := range servertest.Backends() {
		if be.Name == name {
			return be
		}
	}
	panic("no backend " + name)
}

func openPostgres(t testing.TB, dsn string) *sql.DB {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func redisClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
