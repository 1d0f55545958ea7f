// Package idempgx records the outcomes of idem calls in PostgreSQL through
// pgx (github.com/jackc/pgx/v5), in the transaction of the business change
// they report: the change and the fact that it was made commit together or
// not at all. It is idemsql's ledger for services that run pgxpool (and
// sqlc's pgx code) rather than database/sql.
//
// idem coordinates calls through Redis: one owner per key, waiting
// duplicates, replays. Redis cannot join your database's transaction, so
// without a ledger a crash between your COMMIT and idem's write to Redis,
// a Redis that lost a record, or an owner paused past its lease can apply a
// change twice. With a ledger, the outcome is a row in your database whose
// primary key is the idempotency key, written by fn inside its own
// transaction; the database's unique key decides which commit stands, and
// Redis is the fast path (claims, waiting, replays) in front of it.
//
// Setup, once per process:
//
//	ledger := idempgx.New(pool) // a *pgxpool.Pool
//	if err := ledger.Migrate(ctx); err != nil { ... }
//	client := idem.New(rdb, idem.WithLedger(ledger))
//
// In fn, the business change and Commit share one pgx.Tx; queries that
// sqlc generated for pgx run in it unchanged (queries.WithTx(tx)):
//
//	receipt, err := idem.Do(ctx, client, key, idem.Fingerprint(req),
//		func(ctx context.Context) (Receipt, error) {
//			tx, err := pool.Begin(ctx)
//			if err != nil {
//				return Receipt{}, err
//			}
//			defer tx.Rollback(ctx)
//			r, err := debit(ctx, tx, req) // the business change, in tx
//			if err != nil {
//				return Receipt{}, err
//			}
//			return r, idempgx.Commit(ctx, tx, r)
//		})
//
// fn needs no reconcile code. If another attempt committed first (a second
// live owner, a call after Redis lost the record), Commit rolls tx back and
// Do returns the recorded outcome; on a takeover after a crash, the Client
// reads the ledger before fn and returns the outcome without running fn.
// A permanent failure whose own changes must stick (a declined payment's
// row) is recorded with CommitError. What is exactly-once and what is not
// is as in idemsql: the changes made in tx, while the key's row is kept.
//
// # One round trip
//
// Commit sends the row's INSERT and the COMMIT to the server together, in
// one round trip: the ledger adds none to the transaction. The INSERT is a
// plain one, so a key that has a row already fails it, the transaction is
// aborted and the COMMIT is not run; Commit then rolls back and reads the
// recorded row on the transaction's own connection (one more round trip,
// on that path only). Commit never takes a second connection from the
// pool: a pool of one connection (MaxConns=1) works, conflicts included.
// Migrate reads the database's id that Commit checks; run it in every
// process. A Commit before it reads the id through its transaction, once.
//
// # The tables
//
// The tables are idemsql.Postgres's, column for column: a service that
// moves between database/sql (idemsql) and pgx (idempgx), or runs both,
// keeps its rows, and either finds what the other recorded. Migrate
// creates, where missing, the table idem_ledger (WithTable names it) with
// the columns idem_key (bytea, primary key), fingerprint, attempt, failed,
// outcome (the value encoded exactly as idem stores it in Redis) and
// recorded_at (timestamptz, the database's statement_timestamp(), not the
// host's clock); a BRIN index on recorded_at for Prune; and
// idem_ledger_meta, one row holding a random id of the database. Commit
// writes only where it finds that id, so a tx of another database is
// refused, even one with a ledger of its own. Prune deletes rows older
// than a time, by the database's clock: keep them at least as long as the
// Client's retention, Prune(ctx, time.Now().Add(-retention)).
//
// Keys are bytes, at most 2 KiB (a B-tree entry's limit): the Client
// refuses a longer key before fn runs (Ledger.MaxKeyLen). An error that the
// database gives the same row every time (SQLSTATE class 54, or 22001) is
// permanent (idem.Permanent), never retried.
//
// Any isolation level works: the recorded row is read outside the
// transaction, after its ROLLBACK, so REPEATABLE READ and SERIALIZABLE see
// it too. A serialization failure or a deadlock is returned as the
// transient error it is: nothing committed, and the next attempt's lookup
// finds the outcome if another attempt committed one.
//
// # Events: the outbox, the relay, entity versions
//
// Publish writes an event in the handler's pgx.Tx, so that it commits or
// rolls back with the business change (and, inside Do, with the ledger's
// row); inside Do its id is derived from the operation's key and the
// publish's ordinal, so a re-run of fn publishes the same ids. Ledger.Relay
// moves committed rows to their Redis Streams (XADD with the fields and
// EventIDField, then the delete; FOR UPDATE SKIP LOCKED, so several relays
// share the work), at least once: a relay killed between the XADD and the
// delete publishes the row again with the same id, which idemstream keys
// entries by. Advance and AdvanceInOrder guard an entity's version in the
// consumer's tx (ErrStale, ErrGap). Tables, ids and entries are idemsql's
// byte for byte: either driver relays and applies the other's events.
package idempgx
