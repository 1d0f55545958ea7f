// advance.go: Advance and AdvanceInOrder, each entity's version, kept in
// the handler's transaction so that events apply forward only.

package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// ErrStale is returned, marked idem.Permanent, by Advance and
// AdvanceInOrder for a version at or below the entity's recorded one: the
// event is old news. A consumer acknowledges it and does not apply it.
var ErrStale = errors.New("idemsql: stale version")

// ErrGap is returned by AdvanceInOrder for a version above the entity's
// recorded one plus one: an earlier event has not been applied yet. It is
// transient: the consumer gets the event again later, after the missing
// one, or dead-letters it after its delivery limit.
var ErrGap = errors.New("idemsql: version gap")

// Advance records version as entity's version in tx, if it is above the
// recorded one (an entity never seen is at version 0); otherwise it
// returns an error wrapping ErrStale, marked idem.Permanent, and records
// nothing. Call it in the transaction that applies the entity's event,
// before the change: the change then commits only with the version.
//
// Advance locks the entity's row until tx ends, so that of two
// transactions advancing one entity at once, the second waits and then
// sees the first's version. tx stays usable after ErrStale (roll it back,
// or commit the rest). The ledger (and its _versions table) is the one of
// the idem call ctx belongs to, or the one NewContext put in ctx.
func Advance(ctx context.Context, tx *sql.Tx, entity string, version int64) error {
	return advance(ctx, tx, entity, version, false)
}

// AdvanceInOrder is Advance that also refuses a version above the
// recorded one plus one, with ErrGap (transient: try the event again
// later). Through it, each entity's events are applied once each, in
// version order, by any number of consumers.
func AdvanceInOrder(ctx context.Context, tx *sql.Tx, entity string, version int64) error {
	return advance(ctx, tx, entity, version, true)
}

func advance(ctx context.Context, tx *sql.Tx, entity string, version int64, inOrder bool) error {
	if tx == nil {
		return errors.New("idemsql: Advance with a nil tx")
	}
	l, err := ledgerOf(ctx, "Advance")
	if err != nil {
		return err
	}
	if version < 1 {
		return idem.Permanent(fmt.Errorf("idemsql: Advance(%q, %d): versions start at 1", entity, version))
	}
	st := l.versionStatements()
	// The row first, so that the locking read below always has a row to
	// lock: two transactions that both found no row would both advance.
	if _, err := tx.ExecContext(ctx, st.ensure, []byte(entity)); err != nil {
		return l.explain("advance "+entity, err)
	}
	var recorded int64
	if err := tx.QueryRowContext(ctx, st.lock, []byte(entity)).Scan(&recorded); err != nil {
		return l.explain("advance "+entity, err)
	}
	switch {
	case version <= recorded:
		return idem.Permanent(fmt.Errorf("%w: %s is at version %d, the event is %d", ErrStale, entity, recorded, version))
	case inOrder && version > recorded+1:
		return fmt.Errorf("%w: %s is at version %d, the event is %d", ErrGap, entity, recorded, version)
	}
	res, err := tx.ExecContext(ctx, st.set, version, []byte(entity), recorded)
	if err != nil {
		return l.explain("advance "+entity, err)
	}
	if n, err := res.RowsAffected(); err == nil && n != 1 {
		// The lock makes this impossible; a database without one (a
		// SQLite opened without immediate transactions) may get here.
		return fmt.Errorf("idemsql: advance %s: its version changed under the transaction: try again", entity)
	}
	return nil
}

// versionStatements is the SQL of the ledger's _versions table.
type versionStatements struct {
	create string // the table
	ensure string // a row at version 0 for $1, if it has none
	lock   string // $1's version, locked until the tx ends
	set    string // $1 to $2 where it is at $3
}

func (l *Ledger) versionStatements() versionStatements {
	d := l.dialect
	t := l.table + "_versions"
	key := d.placeholder(1, d.blob)
	st := versionStatements{
		create: "CREATE TABLE IF NOT EXISTS " + t + " (\n" +
			"\tentity " + d.key + " NOT NULL PRIMARY KEY,\n" +
			"\tversion " + d.integer + " NOT NULL\n)",
		ensure: "INSERT INTO " + t + " (entity, version) VALUES (" + key + ", 0) " + d.onDuplicate("entity"),
		lock:   "SELECT version FROM " + t + " WHERE entity = " + key,
		set: "UPDATE " + t + " SET version = " + d.placeholder(1, d.integer) +
			" WHERE entity = " + d.placeholder(2, d.blob) + " AND version = " + d.placeholder(3, d.integer),
	}
	switch d.name {
	case "mysql":
		// Not INSERT IGNORE, which would turn a too-long entity into a
		// warning and a cut key.
		st.ensure = "INSERT INTO " + t + " (entity, version) VALUES (" + key + ", 0) ON DUPLICATE KEY UPDATE version = version"
		st.lock += " FOR UPDATE"
	case "postgres":
		st.lock += " FOR UPDATE"
	}
	// SQLite has one writer: the INSERT above took the database's write
	// lock, which the transaction keeps to its end.
	return st
}

type ledgerCtxKey struct{}

// NewContext returns a copy of ctx that carries l, for Publish, Advance and
// AdvanceInOrder outside an idem call (a relay's producer, a consumer
// without idem): they find their tables through it. Inside an idem call
// whose Client has an idemsql ledger, that ledger is used instead.
func NewContext(ctx context.Context, l *Ledger) context.Context {
	return context.WithValue(ctx, ledgerCtxKey{}, l)
}

// ledgerOf returns the ledger of ctx: the idem call's, else NewContext's.
func ledgerOf(ctx context.Context, doing string) (*Ledger, error) {
	if il, err := idem.LedgerFrom(ctx); err == nil {
		if l, ok := il.(*Ledger); ok && l != nil {
			return l, nil
		}
	}
	if l, ok := ctx.Value(ledgerCtxKey{}).(*Ledger); ok && l != nil {
		return l, nil
	}
	return nil, fmt.Errorf("idemsql: %s: ctx has no idemsql ledger: call it inside an idem call of a Client with an idemsql ledger, or with a context from idemsql.NewContext", doing)
}
