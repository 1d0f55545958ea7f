// commit.go: recording an outcome in the transaction of its business
// change: this package's idem.LedgerTx, and the typed helpers around
// idem.Commit, which runs the protocol.

package idempgx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Commit records v as the outcome of the idem call that ctx belongs to (fn's
// context, or one derived from it), in tx, and commits tx: the business
// change and the outcome commit together or not at all. Return what it
// returns from fn: return v, idempgx.Commit(ctx, tx, v). The row's INSERT
// and the COMMIT go to the server in one round trip, so the ledger costs
// the transaction no round trip; tx is done when Commit returns (a later
// tx.Rollback returns pgx.ErrTxClosed, and a pool's connection is back in
// the pool).
//
// When the ledger holds an outcome for the key already (another attempt
// committed first), the INSERT fails, so the COMMIT rolls back; Commit
// reads the recorded row on tx's own connection and returns an error
// wrapping idem.ErrRecorded, and Do returns the recorded outcome instead of
// v; with another fingerprint, idem.ErrConflict. Outside an idem call, for
// a Client without an idempgx ledger, for a tx already done, failed, nested
// (a savepoint) or of another database, or a v that Do cannot store (not a
// T of Do[T], not a []byte for Client.Do, not encodable), Commit rolls tx
// back and says why: nothing is committed. When the COMMIT itself fails,
// the error is returned, transient: the outcome counts only if the commit
// landed, which the next attempt's lookup finds out. Commit never needs a
// second connection from the pool while tx holds one.
//
// tx is a transaction of pgxpool.Pool.Begin or pgx.Conn.Begin; Commit
// talks to the server through tx.Conn().PgConn(), and ends tx with a
// Commit on a context that is already done, which sends nothing: a
// QueryTracer sees that call fail with context.Canceled.
func Commit[T any](ctx context.Context, tx pgx.Tx, v T) error {
	t, err := ledgerTx(ctx, tx)
	if err != nil {
		return err
	}
	return idem.Commit(ctx, t, v)
}

// CommitError records err as the permanent failure of the idem call that
// ctx belongs to, in tx, and commits tx: for a failure whose own changes
// must stick, such as the row of a declined payment. Every later call with
// the key gets the failure (a *idem.StoredError); the owner's Do returns
// err, marked permanent. Return what CommitError returns from fn:
// return zero, idempgx.CommitError(ctx, tx, err). That is err marked
// permanent (idem.Permanent) once committed, or, as for Commit, the reason
// nothing was committed. err must not be nil.
func CommitError(ctx context.Context, tx pgx.Tx, err error) error {
	t, terr := ledgerTx(ctx, tx)
	if terr != nil {
		return terr
	}
	return idem.CommitError(ctx, t, err)
}

// ledgerTx returns tx as the idem.LedgerTx of the Client's ledger, or,
// after rolling tx back, why Commit cannot record in it.
func ledgerTx(ctx context.Context, tx pgx.Tx) (*txn, error) {
	if tx == nil {
		return nil, errors.New("idempgx: Commit with a nil tx")
	}
	l, err := idem.LedgerFrom(ctx)
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("idempgx: Commit: nothing committed: %w", err)
	}
	own, ok := l.(*Ledger)
	if !ok || own == nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("idempgx: Commit: the Client's ledger is a %T, not an *idempgx.Ledger: nothing committed", l)
	}
	return &txn{l: own, tx: tx}, nil
}

// txn is one of the user's transactions in the ledger's database: the
// idem.LedgerTx that idem.Commit drives.
type txn struct {
	l  *Ledger
	tx pgx.Tx
}

var _ idem.LedgerTx = (*txn)(nil)

// Rollback rolls the transaction back.
func (t *txn) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// Type OIDs and the binary format of the parameters that Commit sends.
const (
	oidBool  = 16
	oidBytea = 17
	oidInt8  = 20
	binFmt   = 1
)

// Commit sends the row's INSERT and the COMMIT in one batch (one Sync: an
// error skips what follows it). The ledger's primary key decides: when the
// key has a row, the INSERT fails and the COMMIT is not run; the row is
// read on tx's connection after a ROLLBACK, in one more round trip.
func (t *txn) Commit(ctx context.Context, e idem.Entry) (idem.Entry, bool, error) {
	l, tx := t.l, t.tx
	if err := usable(ctx, tx); err != nil {
		return idem.Entry{}, false, err
	}
	id, err := l.databaseID(ctx, tx)
	if err != nil {
		_ = tx.Rollback(ctx)
		return idem.Entry{}, false, fmt.Errorf("idempgx: nothing committed: %w", err)
	}
	var attempt [8]byte
	binary.BigEndian.PutUint64(attempt[:], uint64(e.Attempt))
	failed := []byte{0}
	if e.Failed {
		failed[0] = 1
	}
	var b pgconn.Batch
	b.ExecParams(l.sql.insert,
		[][]byte{bytes(e.Key), bytes(e.FingerprintDigest), attempt[:], failed, nonNil(e.Value), id},
		[]uint32{oidBytea, oidBytea, oidInt8, oidBool, oidBytea, oidBytea},
		[]int16{binFmt}, nil)
	b.ExecParams("COMMIT", nil, nil, nil, nil)
	res, err := tx.Conn().PgConn().ExecBatch(ctx, &b).ReadAll()
	pe := pgError(err)
	switch {
	case err == nil:
		end(ctx, tx)
		if len(res) != 2 || res[1].CommandTag.String() != "COMMIT" || res[0].CommandTag.RowsAffected() != 1 {
			return idem.Entry{}, false, fmt.Errorf("idempgx: the server answered the INSERT and COMMIT with %s: whether the outcome is recorded is unknown (the next attempt's lookup tells)", tags(res))
		}
		return idem.Entry{}, false, nil
	case pe == nil && pgconn.SafeToRetry(err):
		// Nothing was sent (ctx was done before, or the connection was
		// closed): the server rolls tx back when the connection goes.
		_ = tx.Rollback(ctx)
		return idem.Entry{}, false, fmt.Errorf("idempgx: the INSERT and COMMIT were not sent: nothing committed: %w", err)
	case pe == nil:
		// The connection failed, or ctx ended, with the batch sent or
		// half sent: the COMMIT may have landed.
		_ = tx.Rollback(ctx)
		return idem.Entry{}, false, fmt.Errorf("idempgx: whether the COMMIT landed is unknown (the next attempt's lookup tells): %w", err)
	case len(res) > 0:
		// The COMMIT failed (a serialization failure, a deferred
		// constraint): the server rolled the transaction back.
		end(ctx, tx)
		return idem.Entry{}, false, fmt.Errorf("idempgx: COMMIT failed (nothing committed): %w", err)
	case pe.Code == uniqueViolation && pe.TableName == l.table:
		// The INSERT met the key's row; the COMMIT was not run.
		return t.recorded(ctx, e.Key, id)
	}
	// The INSERT failed otherwise, and the COMMIT was not run: tx is
	// aborted. A serialization failure or a deadlock stays transient: the
	// next attempt's lookup finds a row that another attempt committed.
	_ = tx.Rollback(ctx)
	switch {
	case pe.Code == notNullViolation && pe.TableName == l.table && pe.ColumnName == "recorded_at":
		return idem.Entry{}, false, fmt.Errorf("%w: its %s_meta table names another database: nothing committed", errOtherDatabase, l.table)
	case missing(err):
		return idem.Entry{}, false, fmt.Errorf("idempgx: tx's database has no table %s or %s_meta: tx must be of the ledger's database (New's pool), migrated (Migrate); nothing committed: %w", l.table, l.table, err)
	case permanent(err):
		// The same row gets the same answer at every attempt.
		return idem.Entry{}, false, idem.Permanent(fmt.Errorf("idempgx: record the outcome (nothing committed; the database refuses this row every time): %w", err))
	case pe.Code == inFailedTx:
		return idem.Entry{}, false, fmt.Errorf("idempgx: tx had failed before Commit (a statement of it returned an error): nothing committed: %w", err)
	}
	return idem.Entry{}, false, fmt.Errorf("idempgx: record the outcome (nothing committed): %w", err)
}

var errOtherDatabase = errors.New("idempgx: tx belongs to another database than the ledger's (New's pool)")

// recorded ends tx, whose INSERT met the key's row, and reads that row on
// tx's connection, in one round trip: a ROLLBACK, then the row, read only
// where the _meta row holds the ledger's id. The read is outside tx, so it
// sees the row whatever tx's isolation level.
func (t *txn) recorded(ctx context.Context, key string, id []byte) (idem.Entry, bool, error) {
	tx := t.tx
	var b pgconn.Batch
	b.ExecParams("ROLLBACK", nil, nil, nil, nil)
	b.ExecParams(t.l.sql.recorded, [][]byte{bytes(key), id}, []uint32{oidBytea, oidBytea}, []int16{binFmt}, []int16{binFmt})
	res, err := tx.Conn().PgConn().ExecBatch(ctx, &b).ReadAll()
	if err != nil {
		_ = tx.Rollback(ctx)
		return idem.Entry{}, false, fmt.Errorf("idempgx: the key has an outcome in the ledger already, which could not be read (nothing committed): %w", err)
	}
	end(ctx, tx)
	if len(res) != 2 || len(res[1].Rows) == 0 {
		return idem.Entry{}, false, errors.New("idempgx: the ledger's row of the key was gone when read (pruned?); nothing committed")
	}
	e, err := decodeEntry(key, res[1].Rows[0])
	if err != nil {
		return idem.Entry{}, false, fmt.Errorf("idempgx: the key has an outcome in the ledger already, which could not be read (nothing committed): %w", err)
	}
	return e, true, nil
}

// decodeEntry decodes a row of the recorded statement, in binary format.
func decodeEntry(key string, row [][]byte) (idem.Entry, error) {
	if len(row) != 5 || len(row[1]) != 8 || len(row[2]) != 1 || len(row[4]) != 8 || row[0] == nil || row[3] == nil {
		return idem.Entry{}, fmt.Errorf("idempgx: a row of %d columns that is not the ledger's", len(row))
	}
	e := idem.Entry{
		Key:               key,
		FingerprintDigest: string(row[0]),
		Attempt:           int64(binary.BigEndian.Uint64(row[1])),
		Failed:            row[2][0] != 0,
		Value:             row[3],
	}
	micros := int64(binary.BigEndian.Uint64(row[4]))
	e.Age = max(0, time.Duration(micros)*time.Microsecond) // clocks step back
	return e, nil
}

// usable returns nil if tx is a transaction in progress that Commit can
// commit; else it rolls tx back and says why nothing is committed.
func usable(ctx context.Context, tx pgx.Tx) error {
	// An empty batch sends nothing: it fails only on a Tx already done.
	if err := tx.SendBatch(ctx, &pgx.Batch{}).Close(); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			return fmt.Errorf("idempgx: tx was already committed or rolled back: nothing recorded: %w", err)
		}
		_ = tx.Rollback(ctx)
		return fmt.Errorf("idempgx: nothing committed: %w", err)
	}
	if nested(tx) {
		_ = tx.Rollback(ctx)
		return errors.New("idempgx: tx is a savepoint (a pgx.Tx's Begin), whose COMMIT would not be the transaction's: pass the outer transaction; nothing committed")
	}
	switch tx.Conn().PgConn().TxStatus() {
	case 'T':
		return nil
	case 'E':
		_ = tx.Rollback(ctx)
		return errors.New("idempgx: tx had failed before Commit (a statement of it returned an error): nothing committed")
	}
	_ = tx.Rollback(ctx)
	return errors.New("idempgx: tx's connection is not in a transaction (was it ended by a COMMIT or ROLLBACK statement?): nothing recorded")
}

// nested reports whether tx is pgx's savepoint transaction.
func nested(tx pgx.Tx) bool { return fmt.Sprintf("%T", tx) == "*pgx.dbSimulatedNestedTx" }

// end marks tx done after the server ended its transaction, without a
// round trip. pgx has no call for that: Commit on a context already done
// sends nothing, marks tx closed, keeps the connection (it is not in a
// transaction), and a pool's Tx gives it back to the pool. A connection
// still in a transaction is rolled back instead.
func end(ctx context.Context, tx pgx.Tx) {
	if tx.Conn().PgConn().TxStatus() != 'I' {
		_ = tx.Rollback(ctx)
		return
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tx.Commit(done)
}

// bytes returns s as a non-nil []byte (nil would be NULL).
func bytes(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return []byte(s)
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// tags lists the command tags of res, for an error.
func tags(res []*pgconn.Result) string {
	s := "["
	for i, r := range res {
		if i > 0 {
			s += ", "
		}
		s += r.CommandTag.String()
	}
	return s + "]"
}
