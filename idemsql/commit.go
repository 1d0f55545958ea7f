// commit.go: recording an outcome in the transaction of its business
// change: this package's idem.LedgerTx, and the typed helpers around
// idem.Commit, which runs the protocol.

package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// Commit records v as the outcome of the idem call that ctx belongs to (fn's
// context, or one derived from it), in tx, and commits tx: the business
// change and the outcome commit together or not at all. Return what it
// returns from fn: return v, idemsql.Commit(ctx, tx, v).
//
// When the ledger holds an outcome for the key already (another attempt
// committed first), Commit rolls tx back and returns an error wrapping
// idem.ErrRecorded, and Do returns the recorded outcome instead of v; with
// another fingerprint, idem.ErrConflict. Outside an idem call, for a Client
// without an idemsql ledger, for a tx already done or of another database,
// or a v that Do cannot store (not a T of Do[T], not a []byte for
// Client.Do, not encodable), Commit rolls tx back and says why: nothing is
// committed. When tx's COMMIT itself fails, the error is returned as it
// is, transient: the outcome counts only if the commit landed, which the
// next attempt's lookup finds out. Commit never needs a second connection
// from db's pool while tx holds one.
func Commit[T any](ctx context.Context, tx *sql.Tx, v T) error {
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
// return zero, idemsql.CommitError(ctx, tx, err). That is err marked
// permanent (idem.Permanent) once committed, or, as for Commit, the reason
// nothing was committed. err must not be nil.
func CommitError(ctx context.Context, tx *sql.Tx, err error) error {
	t, terr := ledgerTx(ctx, tx)
	if terr != nil {
		return terr
	}
	return idem.CommitError(ctx, t, err)
}

// ledgerTx returns tx as the idem.LedgerTx of the Client's ledger, or,
// after rolling tx back, why Commit cannot record in it.
func ledgerTx(ctx context.Context, tx *sql.Tx) (*txn, error) {
	if tx == nil {
		return nil, errors.New("idemsql: Commit with a nil tx")
	}
	l, err := idem.LedgerFrom(ctx)
	if err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("idemsql: Commit: nothing committed: %w", err)
	}
	own, ok := l.(*Ledger)
	if !ok || own == nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("idemsql: Commit: the Client's ledger is a %T, not an *idemsql.Ledger: nothing committed", l)
	}
	return &txn{l: own, tx: tx}, nil
}

// txn is one of the user's transactions in the ledger's database: the
// idem.LedgerTx that idem.Commit drives.
type txn struct {
	l  *Ledger
	tx *sql.Tx
}

var _ idem.LedgerTx = (*txn)(nil)

// Commit inserts e and commits the transaction. The ledger's primary key
// decides: when the key has a row already, the row is read through the
// transaction (it sees the row: the INSERT met it) and the transaction is
// rolled back.
func (t *txn) Commit(ctx context.Context, e idem.Entry) (idem.Entry, bool, error) {
	l, tx := t.l, t.tx
	id, err := l.databaseID(ctx, true)
	if err != nil {
		_ = tx.Rollback()
		return idem.Entry{}, false, fmt.Errorf("idemsql: nothing committed: %w", err)
	}
	r := row{key: e.Key, fingerprint: e.FingerprintDigest, attempt: e.Attempt, failed: e.Failed, outcome: e.Value}
	added, err := l.insert(ctx, tx, r, id)
	if err != nil {
		_ = tx.Rollback()
		return l.insertFailed(ctx, e.Key, err)
	}
	if !added {
		// The key has a row, or tx's database is another one (the insert
		// copies the row only where it finds the ledger's database id).
		if err := l.checkDatabase(ctx, tx, id); err != nil {
			_ = tx.Rollback()
			return idem.Entry{}, false, fmt.Errorf("idemsql: nothing committed: %w", err)
		}
		found, ok, err := l.lookupIn(ctx, tx, l.sql.lookupLocked, e.Key)
		_ = tx.Rollback()
		switch {
		case err != nil:
			return idem.Entry{}, false, fmt.Errorf("idemsql: the key has an outcome in the ledger already, which could not be read (nothing committed): %w", err)
		case !ok:
			return idem.Entry{}, false, errors.New("idemsql: the ledger's row of the key was gone when read (pruned?); nothing committed")
		}
		return found.entry(), true, nil
	}
	if err := tx.Commit(); err != nil {
		return idem.Entry{}, false, fmt.Errorf("idemsql: COMMIT failed, so the outcome counts only if it landed (the next attempt's lookup tells): %w", err)
	}
	return idem.Entry{}, false, nil
}

// Rollback rolls the transaction back.
func (t *txn) Rollback(context.Context) error { return t.tx.Rollback() }

// insertFailed explains the failed INSERT of key's row, tx rolled back.
func (l *Ledger) insertFailed(ctx context.Context, key string, err error) (idem.Entry, bool, error) {
	switch {
	case errors.Is(err, sql.ErrTxDone):
		return idem.Entry{}, false, fmt.Errorf("idemsql: tx was already committed or rolled back: nothing recorded: %w", err)
	case l.dialect.missing(err):
		return idem.Entry{}, false, fmt.Errorf("idemsql: tx's database has no table %s or %s_meta: tx must be of the ledger's database (New's db), migrated (Migrate); nothing committed: %w", l.table, l.table, err)
	case l.dialect.permanent != nil && l.dialect.permanent(err):
		// The same row gets the same answer at every attempt.
		return idem.Entry{}, false, idem.Permanent(l.explain("record the outcome (nothing committed; the database refuses this row every time)", err))
	}
	// Under REPEATABLE READ or SERIALIZABLE, an INSERT that meets a row
	// committed after tx began fails (a serialization failure) instead of
	// doing nothing: the row, if there, is the outcome all the same. tx is
	// over, so reading it takes a connection from the pool: only when one
	// is free at once (tx's own, given back), never waiting for one that a
	// caller holds (a tx on a *sql.Conn, a pool of one).
	if l.poolHasRoom() {
		if found, ok, lerr := l.lookup(ctx, key); lerr == nil && ok {
			return found.entry(), true, nil
		}
	}
	return idem.Entry{}, false, l.explain("record the outcome (nothing committed)", err)
}

// poolHasRoom reports whether the ledger's pool can give a connection
// without waiting for one in use.
func (l *Ledger) poolHasRoom() bool {
	st := l.db.Stats()
	return st.Idle > 0 || st.MaxOpenConnections == 0 || st.OpenConnections < st.MaxOpenConnections
}

// Lookup returns the outcome recorded for key, and false when none is. The
// Client calls it (see idem.WithLedger); it reads from the ledger's db.
func (l *Ledger) Lookup(ctx context.Context, key string) (idem.Entry, bool, error) {
	r, ok, err := l.lookup(ctx, key)
	if err != nil || !ok {
		return idem.Entry{}, false, err
	}
	return r.entry(), true, nil
}

// MaxKeyLen returns the longest key the ledger's table can index, in
// bytes, or 0 when the dialect sets no limit (SQLite): the Client refuses
// a longer key before fn runs (see idem.Ledger).
func (l *Ledger) MaxKeyLen() int { return l.dialect.maxKeyLen }

var _ idem.Ledger = (*Ledger)(nil)

func (r row) entry() idem.Entry {
	return idem.Entry{Key: r.key, FingerprintDigest: r.fingerprint, Attempt: r.attempt, Failed: r.failed, Value: r.outcome, Age: r.age}
}
