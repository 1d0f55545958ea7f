// Package idemstream consumes a Redis Stream with a consumer group and
// runs each entry's handler through idem, so that an event is handled
// once though Redis delivers it again (its consumer died, or the producer
// sent it twice), and an entry is acknowledged only once its outcome is
// stored.
//
//	client := idem.New(rdb)
//	c := idemstream.New(client, rdb, "payments", "ledger", hostname,
//		idemstream.WithKey(func(m redis.XMessage) string { s, _ := m.Values["event_id"].(string); return s }),
//		idemstream.WithWorkers(8))
//	err := c.Run(ctx, func(ctx context.Context, m redis.XMessage) error {
//		return apply(ctx, m.Values) // idem.Permanent(err) for what never works
//	})
//
// # An entry's way
//
// Run reads with XREADGROUP (creating the group with MKSTREAM if needed),
// and hands each entry to a worker, which calls Do with the entry's key
// (WithKey: by default its EventIDField, else its ID) and fingerprint
// (WithFingerprint: by default its fields), after the scope (WithScope).
// Then, by what Do returned (the rule is idem.Ack):
//
//	nil, idem.Permanent, a replayed failure               → XACK
//	the handler's other errors                            → again after a pause (WithBackoff), as one more delivery
//	  ... its WithMaxDeliveries-th delivery failed        → XADD to the dead-letter stream, then XACK
//	in progress elsewhere, Redis failing, not recorded    → again after a pause, not counted as a delivery
//	idem.ErrConflict: the key has another entry's outcome → XADD to the dead-letter stream, then XACK
//	no key, idem.ErrInvalidKey, idem.ErrCorrupt           → XADD to the dead-letter stream, then XACK
//
// The dead-letter stream (WithDeadLetter) gets the entry's fields and the
// Field* fields: its ID, stream, group, consumer, deliveries and the last
// error. The copy comes before the acknowledgement, so a crash between
// the two leaves a duplicate in the dead-letter stream, never a loss.
// Delivery counts are Redis's (XPENDING): they survive restarts, and an
// entry whose consumers keep dying while they hold it (a handler that
// crashes the process) is dead-lettered, without running again, once
// delivered more than WithMaxDeliveries times.
//
// # Consumers that die
//
// While a consumer holds entries (handling them, or waiting for a free
// worker) it renews them every quarter of WithClaimIdle (XCLAIM JUSTID).
// The entries of a consumer that died stop being renewed; after
// WithClaimIdle the others take them over (XAUTOCLAIM), and a consumer
// restarted under the same name takes its own back at once. A taken-over
// entry whose handler had finished is acknowledged with its replayed
// outcome; one whose handler was cut short is run again as the next
// attempt (idem.AttemptFrom(ctx).Number > 1) once the dead consumer's
// claim has ended: reconcile there, or let the ledger decide (below).
//
// # Exactly once, with the ledger
//
// idem alone makes the handler run once per stored outcome; a consumer
// killed after the handler's effect and before its outcome was stored
// leaves the next attempt to find out whether the effect happened. With
// the ledger (idem.WithLedger on the Client), the handler commits the
// outcome in the transaction of its own changes, and a takeover finds it
// there: the change is applied exactly once, with no reconcile code. The
// outcome the Consumer stores is empty, a nil []byte:
//
//	tx, err := db.BeginTx(ctx, nil)
//	if err != nil {
//		return err
//	}
//	defer tx.Rollback()
//	if err := credit(ctx, tx, m.Values); err != nil {
//		return err
//	}
//	return idemsql.Commit(ctx, tx, []byte(nil))
//
// When the commit finds the key recorded already (Redis lost the record
// and the entry came again, or a second live owner committed first), the
// transaction rolls back and Commit returns an error wrapping
// idem.ErrRecorded: return it, and the entry is acknowledged with the
// recorded outcome, its change applied once. A handler behind the ledger
// commits on every path that changes something: a change committed
// without idemsql.Commit (or idempgx.Commit) is not covered. The Ledger
// example shows this with a stand-in for the database; examples/events
// does it on SQLite, killing consumer processes as they commit.
//
// # Stopping
//
// When Run's context ends, Run stops reading and waits for the handlers
// running (WithDrainTimeout, by default the Client's lease, after which
// their context is cancelled and Run returns, whatever a handler does).
// What they finish is acknowledged; what they do not stays pending, for
// the next Run or another consumer: no entry is lost, acknowledged early,
// or acknowledged without a stored outcome. One try of a handler is
// bounded by WithHandlerTimeout (by default ten times the lease): a
// handler that ignores its context is abandoned, its entry left pending
// for redelivery, and its goroutine runs on until it returns.
//
// # Other brokers
//
// The rule of this package, idem.Ack, serves any broker: acknowledge
// (commit the offset, Ack, DeleteMessage) when idem.Ack(err) is true.
// docs/brokers.md has the recipes for Kafka, NATS JetStream and SQS.
package idemstream
