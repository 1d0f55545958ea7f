package idempgx_test

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migrate makes the ledger's tables as idemsql.Postgres's Migrate makes
// them (<table>, <table>_meta, <table>_versions and <table>_outbox): the
// same columns, types, constraints and indexes, under the default name and
// another.
func TestSchemaIsIdemsqls(t *testing.T) {
	ctx := context.Background()
	pg := dbtest.SharedPostgres(t)
	for _, table := range []string{"idem_ledger", "debits_ledger"} {
		t.Run(table, func(t *testing.T) {
			sqlDSN, pgxDSN := pg.NewDatabase(t), pg.NewDatabase(t)
			db := pg.Open(t, sqlDSN)
			if err := idemsql.New(db, idemsql.Postgres, idemsql.WithTable(table)).Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			pool, _ := openPool(t, pgxDSN, 0)
			if err := idempgx.New(pool, idempgx.WithTable(table)).Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			got, want := schema(t, pool, table), schema(t, openPoolOnly(t, sqlDSN), table)
			if len(want) < 10 {
				t.Fatalf("idemsql's schema: %q: too little to compare", want)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("idempgx's schema:\n%s\nidemsql's:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func openPoolOnly(t *testing.T, dsn string) *pgxpool.Pool {
	p, _ := openPool(t, dsn, 0)
	return p
}

// schema describes the ledger's tables, table, table_meta, table_versions
// and table_outbox: columns, constraints and indexes, one line each, in
// order.
func schema(t *testing.T, pool *pgxpool.Pool, table string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || ordinal_position || ' ' || is_identity || ' ' || coalesce(identity_generation, '')
		FROM information_schema.columns WHERE table_schema = 'public' AND table_name IN ($1::text, $1::text || '_meta', $1::text || '_versions', $1::text || '_outbox')
		UNION ALL
		SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text IN ($1::text, $1::text || '_meta', $1::text || '_versions', $1::text || '_outbox')
		UNION ALL
		SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename IN ($1::text, $1::text || '_meta', $1::text || '_versions', $1::text || '_outbox')
		ORDER BY 1`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// A service moving between database/sql and pgx keeps its rows: what
// idemsql recorded, idempgx finds (Lookup, and a commit that meets the
// row), and the reverse; one movement each.
func TestCrossDriver(t *testing.T) {
	ctx := context.Background()
	b := newBank(t, 0) // migrated by idempgx
	db := dbtest.SharedPostgres(t).Open(t, b.dsn)
	sqlLedger := idemsql.New(db, idemsql.Postgres)
	if err := sqlLedger.Migrate(ctx); err != nil { // finds the tables, and idempgx's id
		t.Fatal(err)
	}
	sqlClient := idem.New(b.redis, idem.WithLedger(sqlLedger), idem.WithPrefix("sql"), idem.WithLogger(nil))
	t.Cleanup(func() { sqlClient.Close() })
	sqlDebit := func(op string) func(ctx context.Context) (Receipt, error) {
		return func(ctx context.Context) (Receipt, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return Receipt{}, err
			}
			defer tx.Rollback()
			r, err := sqlChange(ctx, tx, op)
			if err != nil {
				return Receipt{}, err
			}
			return r, idemsql.Commit(ctx, tx, r)
		}
	}

	for _, dir := range []struct {
		name         string
		write, find  *idem.Client
		writeFn      func(op string) func(ctx context.Context) (Receipt, error)
		findFn       func(op string) func(ctx context.Context) (Receipt, error)
		writer, user idem.Ledger
	}{
		{"idemsql writes, idempgx finds", sqlClient, b.client(t), sqlDebit, func(op string) func(context.Context) (Receipt, error) { return b.debit(op, 10) }, sqlLedger, b.ledger},
		{"idempgx writes, idemsql finds", b.client(t), sqlClient, func(op string) func(context.Context) (Receipt, error) { return b.debit(op, 10) }, sqlDebit, b.ledger, sqlLedger},
	} {
		t.Run(dir.name, func(t *testing.T) {
			op := dir.name
			fp := fingerprint(op, 10)
			first, err := idem.Do(ctx, dir.write, op, fp, dir.writeFn(op))
			if err != nil {
				t.Fatal(err)
			}
			wrote, ok, err := dir.writer.Lookup(ctx, op)
			if err != nil || !ok {
				t.Fatalf("the writer's Lookup: %v, %v", ok, err)
			}
			found, ok, err := dir.user.Lookup(ctx, op)
			if err != nil || !ok {
				t.Fatalf("the other driver's Lookup: %v, %v", ok, err)
			}
			wrote.Age, found.Age = 0, 0
			if !reflect.DeepEqual(found, wrote) {
				t.Fatalf("the other driver found %+v; the writer %+v", found, wrote)
			}
			b.flush(t) // Redis lost the record: the other driver's fn runs and meets the row
			got, err := idem.Do(ctx, dir.find, op, fp, dir.findFn(op))
			if err != nil || got != first {
				t.Fatalf("the other driver's call: %+v, %v; want the recorded %+v", got, err, first)
			}
			b.flush(t)
			if _, err := idem.Do(ctx, dir.find, op, fingerprint(op, 99), dir.findFn(op)); !errors.Is(err, idem.ErrConflict) {
				t.Fatalf("other parameters: %v; want ErrConflict", err)
			}
			if n := b.movements(t, op); n != 1 {
				t.Fatalf("%d movements; want 1", n)
			}
		})
	}
}

// sqlChange is change on a database/sql transaction.
func sqlChange(ctx context.Context, tx *sql.Tx, op string) (Receipt, error) {
	a, _ := idem.AttemptFrom(ctx)
	r := Receipt{Op: op, Amount: 10, Attempt: a.Number}
	if err := tx.QueryRowContext(ctx, "UPDATE accounts SET balance = balance - 10 WHERE id = 'acct' RETURNING balance").Scan(&r.Balance); err != nil {
		return Receipt{}, err
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO movements (op, amount, attempt, kind) VALUES ($1, 10, $2, 'debit')", op, a.Number)
	return r, err
}
