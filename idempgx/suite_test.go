package idempgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/idem-go/idem/ledgertest"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The drivers' conformance suite, on idempgx.
func TestLedgertest(t *testing.T) {
	ledgertest.Exercise(t, ledgertest.Driver{Name: "idempgx",
		Open: func(tb testing.TB) ledgertest.Backend { return openSuiteBackend(tb) },
		// The kill scenario's child process: no Migrate there (the parent
		// ran it), so Commit reads the database's id through its tx.
		Reopen: func(tb testing.TB, dsn string) ledgertest.Backend {
			pool, _ := openPool(tb, dsn, 0)
			return &suiteBackend{tb: tb, pool: pool, l: idempgx.New(pool), dsn: dsn}
		},
	})
}

// openSuiteBackend opens a new database of the shared server with
// idempgx's ledger, migrated, and a movements table.
func openSuiteBackend(tb testing.TB) *suiteBackend {
	tb.Helper()
	dsn := dbtest.SharedPostgres(tb).NewDatabase(tb)
	pool, _ := openPool(tb, dsn, 0)
	l := idempgx.New(pool)
	ctx := context.Background()
	if err := l.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE suite_movements (account text NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return &suiteBackend{tb: tb, pool: pool, l: l, dsn: dsn}
}

// suiteBackend is idempgx's ledgertest.Backend: a pgx pool with idempgx's
// ledger and a movements table.
type suiteBackend struct {
	tb   testing.TB
	pool *pgxpool.Pool
	l    *idempgx.Ledger
	dsn  string
}

var (
	_ ledgertest.OtherDatabase = (*suiteBackend)(nil)
	_ ledgertest.Reopener      = (*suiteBackend)(nil)
)

func (b *suiteBackend) DSN() string { return b.dsn }

func (b *suiteBackend) Ledger() idem.Ledger { return b.l }

func (b *suiteBackend) Begin(ctx context.Context) (ledgertest.Tx, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return suiteTx{tx}, nil
}

func (b *suiteBackend) Movements(ctx context.Context, account string) (int, error) {
	var n int
	err := b.pool.QueryRow(ctx, "SELECT count(*) FROM suite_movements WHERE account = $1", account).Scan(&n)
	return n, err
}

func (b *suiteBackend) Prune(ctx context.Context, before time.Time) (int64, error) {
	return b.l.Prune(ctx, before)
}

// BeginOther opens a transaction of a new database of the same server,
// with its own ledger (migrated) and movements table.
func (b *suiteBackend) BeginOther(ctx context.Context) (ledgertest.Tx, func(context.Context, string) (int, error), error) {
	other := openSuiteBackend(b.tb)
	tx, err := other.Begin(ctx)
	return tx, other.Movements, err
}

// suiteTx is a pgx.Tx with idempgx's helpers.
type suiteTx struct{ tx pgx.Tx }

func (t suiteTx) Move(ctx context.Context, account string) error {
	_, err := t.tx.Exec(ctx, "INSERT INTO suite_movements (account) VALUES ($1)", account)
	return err
}

func (t suiteTx) Commit(ctx context.Context, v any) error { return idempgx.Commit(ctx, t.tx, v) }

func (t suiteTx) CommitError(ctx context.Context, err error) error {
	return idempgx.CommitError(ctx, t.tx, err)
}

func (t suiteTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }
