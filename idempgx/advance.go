// advance.go: Advance and AdvanceInOrder, each entity's version, kept in
// the handler's transaction so that events apply forward only.

package idempgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/jackc/pgx/v5"
)

// ErrStale is returned, marked idem.Permanent, by Advance and
// AdvanceInOrder for a version at or below the entity's recorded one: the
// event is old news. A consumer acknowledges it and does not apply it.
//
// It is idemsql.ErrStale itself, so a consumer's errors.Is check holds
// whichever driver applied the event.
var ErrStale = idemsql.ErrStale

// ErrGap is returned by AdvanceInOrder for a version above the entity's
// recorded one plus one: an earlier event has not been applied yet. It is
// transient: the consumer gets the event again later, after the missing
// one, or dead-letters it after its delivery limit.
//
// It is idemsql.ErrGap itself, as ErrStale is idemsql's.
var ErrGap = idemsql.ErrGap

// Advance records version as entity's version in tx, if it is above the
// recorded one (an entity never seen is at version 0); otherwise it
// returns an error wrapping ErrStale, marked idem.Permanent, and records
// nothing. Call it in the transaction that applies the entity's event,
// before the change: the change then commits only with the version.
//
// Advance locks the entity's row until tx ends, so that of two
// transactions advancing one entity at once, the second waits and then
// sees the first's version. It takes two round trips. tx stays usable
// after ErrStale (roll it back, or commit the rest). The ledger (and its
// _versions table, idemsql's) is the one of the idem call ctx belongs to,
// or the one NewContext put in ctx.
func Advance(ctx context.Context, tx pgx.Tx, entity string, version int64) error {
	return advance(ctx, tx, entity, version, false)
}

// AdvanceInOrder is Advance that also refuses a version above the
// recorded one plus one, with ErrGap (transient: try the event again
// later). Through it, each entity's events are applied once each, in
// version order, by any number of consumers.
func AdvanceInOrder(ctx context.Context, tx pgx.Tx, entity string, version int64) error {
	return advance(ctx, tx, entity, version, true)
}

func advance(ctx context.Context, tx pgx.Tx, entity string, version int64, inOrder bool) error {
	if tx == nil {
		return errors.New("idempgx: Advance with a nil tx")
	}
	l, err := ledgerOf(ctx, "Advance")
	if err != nil {
		return err
	}
	if version < 1 {
		return idem.Permanent(fmt.Errorf("idempgx: Advance(%q, %d): versions start at 1", entity, version))
	}
	// The row first, so that the locking read always has a row to lock:
	// two transactions that both found no row would both advance. Both
	// statements go in one round trip.
	var b pgx.Batch
	b.Queue(l.sql.ensureVersion, []byte(entity))
	var recorded int64
	b.Queue(l.sql.lockVersion, []byte(entity)).QueryRow(func(r pgx.Row) error { return r.Scan(&recorded) })
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return l.explainTable("advance "+entity, "_versions", err)
	}
	switch {
	case version <= recorded:
		return idem.Permanent(fmt.Errorf("idempgx: %w: %s is at version %d, the event is %d", ErrStale, entity, recorded, version))
	case inOrder && version > recorded+1:
		return fmt.Errorf("idempgx: %w: %s is at version %d, the event is %d", ErrGap, entity, recorded, version)
	}
	tag, err := tx.Exec(ctx, l.sql.setVersion, version, []byte(entity), recorded)
	if err != nil {
		return l.explainTable("advance "+entity, "_versions", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("idempgx: advance %s: its version changed under the transaction: try again", entity)
	}
	return nil
}

type ledgerCtxKey struct{}

// NewContext returns a copy of ctx that carries l, for Publish, Advance and
// AdvanceInOrder outside an idem call (a relay's producer, a consumer
// without idem): they find their tables through it. Inside an idem call
// whose Client has an idempgx ledger, that ledger is used instead.
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
	return nil, fmt.Errorf("idempgx: %s: ctx has no idempgx ledger: call it inside an idem call of a Client with an idempgx ledger, or with a context from idempgx.NewContext", doing)
}
