package idempgx_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/ledgertest"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The drivers' advance scenarios.
func TestAdvance(t *testing.T) {
	t.Parallel()
	ledgertest.ExerciseAdvance(t, ledgertest.AdvanceDriver{Name: "idempgx",
		Open:     func(tb testing.TB) ledgertest.Versions { return openVersions(tb) },
		ErrStale: idempgx.ErrStale, ErrGap: idempgx.ErrGap})
}

// versionsDB is idempgx's ledgertest.Versions: a database with a migrated
// ledger and a business table, state, that holds the last version applied
// to each entity.
type versionsDB struct {
	dsn    string
	pool   *pgxpool.Pool
	ledger *idempgx.Ledger
	ctx    context.Context // carries the ledger
}

func openVersions(tb testing.TB) *versionsDB {
	tb.Helper()
	dsn := dbtest.SharedPostgres(tb).NewDatabase(tb)
	pool, _ := openPool(tb, dsn, 0)
	l := idempgx.New(pool)
	ctx := context.Background()
	if err := l.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE state (entity text PRIMARY KEY, last bigint NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	for _, entity := range ledgertest.AdvanceEntities() {
		if _, err := pool.Exec(ctx, "INSERT INTO state (entity, last) VALUES ($1, 0)", entity); err != nil {
			tb.Fatal(err)
		}
	}
	return &versionsDB{dsn: dsn, pool: pool, ledger: l, ctx: idempgx.NewContext(ctx, l)}
}

func (e *versionsDB) Apply(ctx context.Context, entity string, version int64, inOrder bool) (bool, error) {
	ctx = idempgx.NewContext(ctx, e.ledger)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	advance := idempgx.Advance
	cond := "last < $1"
	if inOrder {
		advance, cond = idempgx.AdvanceInOrder, "last = $1 - 1"
	}
	if err := advance(ctx, tx, entity, version); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, "UPDATE state SET last = $1 WHERE entity = $2 AND "+cond, version, entity)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, tx.Commit(ctx)
}

func (e *versionsDB) Last(ctx context.Context, entity string) (int64, error) {
	var n int64
	err := e.pool.QueryRow(ctx, "SELECT last FROM state WHERE entity = $1", entity).Scan(&n)
	return n, err
}

// Advance needs a ledger: an idem call's, or NewContext's; versions start
// at 1; a missing table names Migrate.
func TestAdvanceRefuses(t *testing.T) {
	t.Parallel()
	e := openVersions(t)
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(e.ctx)
	err = idempgx.Advance(context.Background(), tx, "order-1", 1)
	if err == nil || !strings.Contains(err.Error(), "NewContext") {
		t.Errorf("Advance without a ledger: %v, want an error naming NewContext", err)
	}
	if err := idempgx.Advance(e.ctx, tx, "order-1", 0); err == nil || !idem.IsPermanent(err) {
		t.Errorf("Advance to version 0: %v, want a permanent error", err)
	}
	other := idempgx.NewContext(e.ctx, idempgx.New(e.pool, idempgx.WithTable("never_migrated")))
	if err := idempgx.Advance(other, tx, "order-1", 1); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Advance without its table: %v, want an error naming Migrate", err)
	}
}

// ErrStale and ErrGap are idemsql's: a consumer's errors.Is check holds
// whichever driver applied the event; and idemsql's Advance continues
// from the version that idempgx's recorded, in the same table.
func TestAdvanceAsIdemsql(t *testing.T) {
	t.Parallel()
	e := openVersions(t)
	ctx := e.ctx
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := idempgx.AdvanceInOrder(ctx, tx, "order-1", 1); err != nil {
		t.Fatal(err)
	}
	stale := idempgx.Advance(ctx, tx, "order-1", 1)
	gap := idempgx.AdvanceInOrder(ctx, tx, "order-1", 3)
	if !errors.Is(stale, idemsql.ErrStale) || !errors.Is(gap, idemsql.ErrGap) || errors.Is(gap, idemsql.ErrStale) {
		t.Errorf("stale %v, gap %v: want idemsql's ErrStale and ErrGap", stale, gap)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	db := dbtest.SharedPostgres(t).Open(t, e.dsn)
	sqlLedger := idemsql.New(db, idemsql.Postgres)
	sqlCtx := idemsql.NewContext(context.Background(), sqlLedger)
	stx, err := db.BeginTx(sqlCtx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback()
	if err := idemsql.AdvanceInOrder(sqlCtx, stx, "order-1", 1); !errors.Is(err, idempgx.ErrStale) {
		t.Errorf("idemsql's AdvanceInOrder to the version idempgx recorded: %v, want ErrStale", err)
	}
	if err := idemsql.AdvanceInOrder(sqlCtx, stx, "order-1", 2); err != nil {
		t.Errorf("idemsql's AdvanceInOrder to the next version: %v", err)
	}
}
