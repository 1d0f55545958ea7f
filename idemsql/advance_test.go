package idemsql_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/internal/servertest"
	"github.com/idem-go/idem/ledgertest"
)

// The drivers' advance scenarios, on every backend.
func TestAdvance(t *testing.T) {
	for _, be := range servertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			ledgertest.ExerciseAdvance(t, ledgertest.AdvanceDriver{Name: "idemsql/" + be.Name,
				Open:     func(tb testing.TB) ledgertest.Versions { return openVersions(tb, be) },
				ErrStale: idemsql.ErrStale, ErrGap: idemsql.ErrGap})
		})
	}
}

// versionsDB is idemsql's ledgertest.Versions: a database with a migrated
// ledger and a business table, state, that holds the last version applied
// to each entity.
type versionsDB struct {
	name   string
	db     *sql.DB
	ledger *idemsql.Ledger
}

func openVersions(tb testing.TB, be servertest.Backend) *versionsDB {
	db, _ := be.Open(tb)
	l := idemsql.New(db, dialects[be.Name])
	ctx := context.Background()
	if err := l.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE state (entity VARCHAR(64) PRIMARY KEY, last BIGINT NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	for _, entity := range ledgertest.AdvanceEntities() {
		if _, err := db.ExecContext(ctx, rebind(be.Name, "INSERT INTO state (entity, last) VALUES (?, 0)"), entity); err != nil {
			tb.Fatal(err)
		}
	}
	return &versionsDB{name: be.Name, db: db, ledger: l}
}

func (e *versionsDB) Apply(ctx context.Context, entity string, version int64, inOrder bool) (bool, error) {
	ctx = idemsql.NewContext(ctx, e.ledger)
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	advance := idemsql.Advance
	cond := "last < ?"
	if inOrder {
		advance, cond = idemsql.AdvanceInOrder, "last = ? - 1"
	}
	if err := advance(ctx, tx, entity, version); err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, rebind(e.name, "UPDATE state SET last = ? WHERE entity = ? AND "+cond), version, entity, version)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n == 1, tx.Commit()
}

func (e *versionsDB) Last(ctx context.Context, entity string) (int64, error) {
	var n int64
	err := e.db.QueryRowContext(ctx, rebind(e.name, "SELECT last FROM state WHERE entity = ?"), entity).Scan(&n)
	return n, err
}

// Advance needs a ledger: an idem call's, or NewContext's.
func TestAdvanceWithoutLedger(t *testing.T) {
	db, _ := backendNamed("sqlite").Open(t)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	err = idemsql.Advance(context.Background(), tx, "order-1", 1)
	if err == nil || !strings.Contains(err.Error(), "NewContext") {
		t.Fatalf("Advance without a ledger: %v, want an error naming NewContext", err)
	}
}
