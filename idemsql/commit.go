// commit.go: recording an outcome in the transaction of its business change.

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
// next attempt's lookup finds out.
func Commit[T any](ctx context.Context, tx *sql.Tx, v T) error {
	p, l, err := pending(ctx, tx)
	if err != nil {
		return err
	}
	e, err := p.Entry(v)
	if err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("idemsql: Commit: nothing committed: %w", err)
	}
	return l.commit(ctx, tx, p, e, v)
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
	if err == nil {
		if tx != nil {
			_ = tx.Rollback()
		}
		return errors.New("idemsql: CommitError with a nil error: nothing committed")
	}
	if !idem.IsPermanent(err) {
		err = idem.Permanent(err)
	}
	p, l, perr := pending(ctx, tx)
	if perr != nil {
		return perr
	}
	e, perr := p.FailureEntry(err)
	if perr != nil {
		_ = tx.Rollback()
		return fmt.Errorf("idemsql: CommitError: nothing committed: %w", perr)
	}
	if cerr := l.commit(ctx, tx, p, e, err); cerr != nil {
		return cerr
	}
	return err
}

// pending returns the call of ctx and its ledger, or, after rolling tx
// back, why Commit cannot record in it.
func pending(ctx context.Context, tx *sql.Tx) (*idem.Pending, *Ledger, error) {
	if tx == nil {
		return nil, nil, errors.New("idemsql: Commit with a nil tx")
	}
	p, err := idem.PendingFrom(ctx)
	if err != nil {
		_ = tx.Rollback()
		return nil, nil, fmt.Errorf("idemsql: Commit: nothing committed: %w", err)
	}
	l, ok := p.Ledger().(*Ledger)
	if !ok || l == nil {
		_ = tx.Rollback()
		return nil, nil, fmt.Errorf("idemsql: Commit: the Client's ledger is a %T, not an *idemsql.Ledger: nothing committed", p.Ledger())
	}
	return p, l, nil
}

// commit inserts e and commits tx; v is what e was made from. The ledger's
// primary key decides: when the key has a row already, tx is rolled back
// and the row becomes the call's outcome (Found).
func (l *Ledger) commit(ctx context.Context, tx *sql.Tx, p *idem.Pending, e idem.Entry, v any) error {
	id, err := l.databaseID(ctx)
	if err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("idemsql: Commit: nothing committed: %w", err)
	}
	r := row{key: e.Key, fingerprint: e.Fingerprint, attempt: e.Attempt, failed: e.Failed, outcome: e.Value}
	added, err := l.insert(ctx, tx, r, id)
	if err != nil {
		_ = tx.Rollback()
		return l.insertFailed(ctx, p, e.Key, err)
	}
	if !added {
		// The key has a row, or tx's database is another one (the insert
		// copies the row only where it finds the ledger's database id).
		if err := l.checkDatabase(ctx, tx, id); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("idemsql: Commit: nothing committed: %w", err)
		}
		_ = tx.Rollback()
		// Read the row outside tx: under REPEATABLE READ or SERIALIZABLE
		// tx's snapshot may not see it.
		found, ok, err := l.lookup(ctx, e.Key)
		switch {
		case err != nil:
			return fmt.Errorf("idemsql: Commit: the key has an outcome in the ledger already, which could not be read (nothing committed): %w", err)
		case !ok:
			return fmt.Errorf("idemsql: Commit: key %q: the ledger's row of the key was gone when read (pruned?); nothing committed", e.Key)
		}
		return p.Found(found.entry())
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("idemsql: Commit: COMMIT failed, so the outcome counts only if it landed (the next attempt's lookup tells): %w", err)
	}
	p.Committed(e, v)
	return nil
}

// insertFailed explains the failed INSERT of key's row, tx rolled back.
func (l *Ledger) insertFailed(ctx context.Context, p *idem.Pending, key string, err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("idemsql: Commit: tx was already committed or rolled back: nothing recorded: %w", err)
	}
	if l.dialect.missing(err) {
		return fmt.Errorf("idemsql: Commit: tx's database has no table %s or %s_meta: tx must be of the ledger's database (New's db), migrated (Migrate); nothing committed: %w", l.table, l.table, err)
	}
	// Under REPEATABLE READ or SERIALIZABLE, an INSERT that meets a row
	// committed after tx began fails (a serialization failure) instead of
	// doing nothing: the row, if there, is the outcome all the same.
	if found, ok, lerr := l.lookup(ctx, key); lerr == nil && ok {
		return p.Found(found.entry())
	}
	return l.explain("Commit: record the outcome (nothing committed)", err)
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

var _ idem.Ledger = (*Ledger)(nil)

func (r row) entry() idem.Entry {
	return idem.Entry{Key: r.key, Fingerprint: r.fingerprint, Attempt: r.attempt, Failed: r.failed, Value: r.outcome}
}
