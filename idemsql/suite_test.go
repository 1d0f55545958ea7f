package idemsql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/internal/servertest"
	"github.com/idem-go/idem/ledgertest"
)

// The drivers' conformance suite, on every backend.
func TestLedgertest(t *testing.T) {
	for _, be := range servertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			ledgertest.Exercise(t, ledgertest.Driver{Name: "idemsql/" + be.Name,
				Open: func(tb testing.TB) ledgertest.Backend { return openSuiteBackend(tb, be) },
				Reopen: func(tb testing.TB, dsn string) ledgertest.Backend {
					db := be.Reopen(tb, dsn)
					return &suiteBackend{tb: tb, be: be, db: db, l: idemsql.New(db, dialects[be.Name]), dsn: dsn}
				},
			})
		})
	}
}

func openSuiteBackend(tb testing.TB, be servertest.Backend) *suiteBackend {
	db, dsn := be.Open(tb)
	l := idemsql.New(db, dialects[be.Name])
	ctx := context.Background()
	if err := l.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE suite_movements (account TEXT NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return &suiteBackend{tb: tb, be: be, db: db, l: l, dsn: dsn}
}

// suiteBackend is idemsql's ledgertest.Backend: a database/sql database
// with idemsql's ledger and a movements table.
type suiteBackend struct {
	tb  testing.TB
	be  servertest.Backend
	db  *sql.DB
	l   *idemsql.Ledger
	dsn string
}

func (b *suiteBackend) DSN() string { return b.dsn }

func (b *suiteBackend) Ledger() idem.Ledger { return b.l }

func (b *suiteBackend) Begin(ctx context.Context) (ledgertest.Tx, error) {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &suiteTx{tx: tx, backend: b.be.Name}, nil
}

func (b *suiteBackend) Movements(ctx context.Context, account string) (int, error) {
	return countMovements(ctx, b.db, b.be.Name, account)
}

func (b *suiteBackend) Prune(ctx context.Context, before time.Time) (int64, error) {
	return b.l.Prune(ctx, before)
}

// BeginOther opens a transaction of a new database of the same system,
// with its own ledger (migrated) and movements table.
func (b *suiteBackend) BeginOther(ctx context.Context) (ledgertest.Tx, func(context.Context, string) (int, error), error) {
	other := openSuiteBackend(b.tb, b.be)
	tx, err := other.Begin(ctx)
	return tx, other.Movements, err
}

func countMovements(ctx context.Context, db *sql.DB, backend, account string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, rebind(backend, "SELECT COUNT(*) FROM suite_movements WHERE account = ?"), account).Scan(&n)
	return n, err
}

type suiteTx struct {
	tx      *sql.Tx
	backend string
}

func (t *suiteTx) Move(ctx context.Context, account string) error {
	_, err := t.tx.ExecContext(ctx, rebind(t.backend, "INSERT INTO suite_movements (account) VALUES (?)"), account)
	return err
}

func (t *suiteTx) Commit(ctx context.Context, v any) error { return idemsql.Commit(ctx, t.tx, v) }

func (t *suiteTx) CommitError(ctx context.Context, err error) error {
	return idemsql.CommitError(ctx, t.tx, err)
}

func (t *suiteTx) Rollback(context.Context) error { return t.tx.Rollback() }
