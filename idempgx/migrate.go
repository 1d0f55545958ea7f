// migrate.go: creating the ledger's tables, and removing old rows.

package idempgx

import (
	"context"
	"crypto/rand"
	"errors"
	"time"
)

// Migrate creates the ledger's table, its index and its _meta table (one
// row: a random id of this database, which Commit checks), the _versions
// table of Advance and the _outbox table of Publish, where they are
// missing, and leaves existing ones as they are: the tables of
// idemsql.Postgres, so a database that idemsql migrated needs nothing more,
// and events published through either driver are relayed by either.
// Run it at start-up, before the first Commit, in every process: it also
// reads the id that Commit needs. It is safe to run from many processes at
// once, beside idemsql's Migrate too.
func (l *Ledger) Migrate(ctx context.Context) error {
	id := make([]byte, 16)
	_, _ = rand.Read(id) // never fails (crypto/rand documents it)
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return l.explain("migrate", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// idemsql's lock name: its Migrate and this one take turns.
	if _, err := tx.Exec(ctx, l.sql.migrateLock, "idemsql:"+l.table); err != nil {
		return l.explain("migrate", err)
	}
	for _, q := range []string{l.sql.createTable, l.sql.createIndex, l.sql.createMeta, l.sql.createVersions, l.sql.createOutbox} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return l.explain("migrate", err)
		}
	}
	if _, err := tx.Exec(ctx, l.sql.insertMeta, id); err != nil {
		return l.explain("migrate", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return l.explain("migrate", err)
	}
	_, err = l.databaseID(ctx, nil)
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
		return 0, errors.New("idempgx: Prune: before is the zero time")
	}
	age := time.Since(before).Microseconds()
	var total int64
	for {
		tag, err := l.pool.Exec(ctx, l.sql.prune, age)
		if err != nil {
			return total, l.explain("prune", err)
		}
		n := tag.RowsAffected()
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}
