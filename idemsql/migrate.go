// migrate.go: creating the ledger's tables, and removing old rows.

package idemsql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Migrate creates the ledger's table, its index and its _meta table (one
// row: a random id of this database, which Commit checks), the _versions
// table of Advance and the _outbox table of Publish, where they are
// missing, and leaves existing ones as they are. Run it at start-up,
// before the first Commit; it is safe to run from many processes at once.
func (l *Ledger) Migrate(ctx context.Context) error {
	id := make([]byte, 16)
	_, _ = rand.Read(id) // never fails (crypto/rand documents it)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return l.explain("migrate", err)
	}
	defer func() { _ = tx.Rollback() }()
	if q := l.dialect.migrateLock; q != "" {
		if _, err := tx.ExecContext(ctx, q, "idemsql:"+l.table); err != nil {
			return l.explain("migrate", err)
		}
	}
	if q := l.dialect.sessionCheck; q != "" {
		var problem string
		if err := tx.QueryRowContext(ctx, q).Scan(&problem); err != nil {
			return l.explain("migrate", err)
		}
		if problem != "" {
			return fmt.Errorf("idemsql: migrate: %s", problem)
		}
	}
	for _, q := range []string{l.sql.createTable, l.sql.createIndex, l.sql.createMeta, l.versionStatements().create, l.outboxStatements().create} {
		if q == "" {
			continue
		}
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return l.explain("migrate", err)
		}
	}
	if _, err := tx.ExecContext(ctx, l.sql.insertMeta, id); err != nil {
		return l.explain("migrate", err)
	}
	if err := tx.Commit(); err != nil {
		return l.explain("migrate", err)
	}
	// Read the id now, so that Commit need not: it would take a second
	// connection while fn's transaction holds one.
	_, err = l.databaseID(ctx, false)
	return err
}

// Prune deletes the rows recorded before before and returns how many it
// deleted. A row is what keeps an outcome exactly-once when Redis has lost
// its record: keep rows at least as long as the Client's retention
// (idem.WithRetention), Prune(ctx, time.Now().Add(-retention)), and longer
// than the latest retry you accept. The rule holds because a record that
// the Client finishes from a row expires when the row is the retention
// old (see idem.Entry.Age).
//
// Rows are dated by the database's clock, and so is the cutoff: Prune
// turns before into an age (time.Since(before)) and deletes the rows older
// than that by the database's clock, so a host clock that is off does not
// move the cutoff. Prune deletes in batches of 1000 rows, each in its own
// statement, so that it never holds the table's locks for long; an error
// stops it, with the count deleted so far.
func (l *Ledger) Prune(ctx context.Context, before time.Time) (int64, error) {
	if before.IsZero() {
		return 0, errors.New("idemsql: Prune: before is the zero time")
	}
	age := time.Since(before).Microseconds()
	var total int64
	for {
		res, err := l.db.ExecContext(ctx, l.sql.prune, age)
		if err != nil {
			return total, l.explain("prune", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("idemsql: prune: %w", err)
		}
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}

// insert adds r to the ledger in tx, if tx's database is the ledger's
// (its _meta row holds id). It reports whether it added the row: false
// means that the key has a row already, or that tx belongs to another
// database (see checkDatabase).
func (l *Ledger) insert(ctx context.Context, tx *sql.Tx, r row, id []byte) (bool, error) {
	fp := []byte(r.fingerprint)
	if fp == nil {
		fp = []byte{}
	}
	outcome := r.outcome
	if outcome == nil {
		outcome = []byte{}
	}
	res, err := tx.ExecContext(ctx, l.sql.insert, []byte(r.key), fp, r.attempt, r.failed, outcome, id)
	if err != nil {
		if l.dialect.duplicate != nil && l.dialect.duplicate(err) {
			return false, nil // the statement failed, not tx
		}
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// checkDatabase returns an error unless tx's database is the ledger's: its
// _meta row holds id.
func (l *Ledger) checkDatabase(ctx context.Context, tx *sql.Tx, id []byte) error {
	var got []byte
	err := tx.QueryRowContext(ctx, l.sql.selectMeta).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && string(got) != string(id)) {
		return fmt.Errorf("%w: its %s_meta table names another database", errOtherDatabase, l.table)
	}
	if err != nil {
		return err
	}
	return nil
}

var errOtherDatabase = errors.New("idemsql: tx belongs to another database than the ledger's (New's db)")
