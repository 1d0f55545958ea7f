// outbox.go: Publish, an event row written in the business change's
// transaction, and the ids that make a re-run of fn publish the same ones.

package idempgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem/idemsql"
	"github.com/jackc/pgx/v5"
)

// EventIDField is the field of every stream entry that Relay adds: the
// event's id, which Publish returned. A consumer deduplicates by it. It is
// idemsql.EventIDField.
const EventIDField = idemsql.EventIDField

// Publish writes an event for stream, with fields, into the ledger's
// outbox table, in tx: the event exists if and only if tx commits. Relay
// later adds it to the Redis Stream called stream, as an entry with fields
// and EventIDField set to the returned id.
//
// The id is unique per row. Inside an idem call, it is derived from the
// call's key (and step's name, in a Step) and the ordinal of this Publish
// among tx's: a re-run of fn after a failed attempt, which publishes in the
// same order in a new tx, publishes the same ids, and the consumer tells
// the re-run's events from new ones. The ordinal is counted by the server,
// per transaction (savepoints included: a Publish rolled back to a
// savepoint gives its ordinal back). Publish in the transaction that
// Commit commits; publishing from two transactions of one attempt gives
// their events the same ids (the second is refused by the outbox's unique
// key while the first is unrelayed). Outside an idem call, the id is
// random.
//
// The ids, the rows and the entries are idemsql.Publish's, byte for byte:
// an event published through either driver is relayed by either, and the
// same key and ordinal give the same id. Field values are strings, []byte
// or numbers (of any integer or float kind, named types included); other
// values are refused, and so is the field EventIDField. Fields are stored
// with their keys sorted, and numbers in their shortest decimal form. The
// ledger is the idem call's, or the one NewContext put in ctx.
func Publish(ctx context.Context, tx pgx.Tx, stream string, fields map[string]any) (id string, err error) {
	if tx == nil {
		return "", errors.New("idempgx: Publish with a nil tx")
	}
	if stream == "" {
		return "", errors.New("idempgx: Publish: the stream's name is empty")
	}
	l, err := ledgerOf(ctx, "Publish")
	if err != nil {
		return "", err
	}
	enc, err := idemsql.EncodeFields(fields)
	if err != nil {
		return "", fmt.Errorf("idempgx: Publish: %w", err)
	}
	prefix, derived := idemsql.EventIDPrefix(ctx)
	if !derived {
		if _, err := tx.Exec(ctx, l.sql.publish, []byte(prefix), []byte(stream), enc); err != nil {
			return "", l.explainTable("publish to "+stream, "_outbox", err)
		}
		return prefix, nil
	}
	var b []byte
	if err := tx.QueryRow(ctx, l.sql.publishDerived, prefix, []byte(stream), enc).Scan(&b); err != nil {
		return "", l.explainTable("publish to "+stream, "_outbox", err)
	}
	return string(b), nil
}

// ordinalSetting is the transaction-local setting that counts a
// transaction's derived Publishes: the server forgets it when the
// transaction ends, and a ROLLBACK TO SAVEPOINT restores it.
const ordinalSetting = "idem.publish_ordinal"
