package idempgx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/jackc/pgx/v5"
)

// Under REPEATABLE READ and SERIALIZABLE, a transaction whose snapshot
// predates the key's row (another owner committed it meanwhile) gets the
// recorded outcome: the row is read after the ROLLBACK, outside the
// snapshot, on the transaction's own connection.
func TestConflictUnderSnapshotIsolation(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			b := newBank(t, 2)
			ctx := context.Background()
			late, early := b.client(t), b.client(t) // two Redis records: two live owners
			fp := fingerprint("op", 10)
			var (
				first     Receipt
				firstErr  error
				commitErr error
			)
			got, err := idem.Do(ctx, late, "op", fp, func(ctx context.Context) (Receipt, error) {
				tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
				if err != nil {
					return Receipt{}, err
				}
				defer tx.Rollback(ctx)
				var n int
				// Takes the snapshot, and (SERIALIZABLE) reads the key's absence
				// through its index: a predicate lock that the other owner's
				// insert conflicts with.
				if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
					return Receipt{}, err
				}
				if err := tx.QueryRow(ctx, "SELECT count(*) FROM idem_ledger WHERE idem_key = 'op'").Scan(&n); err != nil {
					return Receipt{}, err
				}
				// The other owner commits the key now, on the pool's other
				// connection, at the same isolation level.
				first, firstErr = idem.Do(ctx, early, "op", fp, func(ctx context.Context) (Receipt, error) {
					tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
					if err != nil {
						return Receipt{}, err
					}
					defer tx.Rollback(ctx)
					r, err := change(ctx, tx, "op", 10, "debit")
					if err != nil {
						return Receipt{}, err
					}
					return r, idempgx.Commit(ctx, tx, r)
				})
				if _, err := tx.Exec(ctx, "INSERT INTO movements (op, amount, attempt, kind) VALUES ('op', 10, 1, 'late')"); err != nil {
					return Receipt{}, err
				}
				commitErr = idempgx.Commit(ctx, tx, Receipt{Op: "late"})
				return Receipt{Op: "late"}, commitErr
			})
			if firstErr != nil {
				t.Fatal(firstErr)
			}
			if !errors.Is(commitErr, idem.ErrRecorded) {
				t.Fatalf("the late Commit: %v; want ErrRecorded", commitErr)
			}
			if err != nil || got != first {
				t.Fatalf("the late call: %+v, %v; want the recorded %+v", got, err, first)
			}
			if n := b.movements(t, "op"); n != 1 {
				t.Fatalf("%d movements; want 1", n)
			}
		})
	}
}
