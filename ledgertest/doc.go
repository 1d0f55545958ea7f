// Package ledgertest is the conformance suite of idem's ledger drivers: a
// driver of idem.Ledger and idem.LedgerTx runs it in its own tests, as
// River's drivers run riverdrivertest, and so can a third party's driver.
//
// A driver's test gives Exercise a Driver whose Open returns a Backend on
// a new, migrated database, with a business table of movements:
//
//	func TestLedgertest(t *testing.T) {
//		ledgertest.Exercise(t, ledgertest.Driver{Name: "mydriver", Open: func(tb testing.TB) ledgertest.Backend {
//			return openMyBackend(tb) // a new database, migrated, with a movements table
//		}})
//	}
//
// Each scenario checks one promise of the ledger on a backend and a
// redis-server of its own (the suite starts redis-server on a free
// loopback port; the scenarios skip with a message where none is
// installed, and fail under IDEM_REQUIRE_REDIS=1):
//
//   - 30 concurrent calls with one key, through one Client and through 30
//     Clients that do not share their Redis records: one movement, one
//     row, one receipt for every caller;
//   - two live owners of one key, committing in either order: the second
//     commit's transaction rolls back (ErrRecorded) and its Do returns the
//     first's receipt; with other parameters, ErrConflict;
//   - Redis flushed after a completion: the recorded outcome, or
//     ErrConflict for other parameters, and no second movement;
//   - a takeover that finds the row of a dead owner's commit, and the
//     retention rule: the record it finishes expires when the row is the
//     retention old, so that Prune(now - retention) never removes the row
//     of a record Redis still holds;
//   - typed results (Do[T]), raw bytes (binary, empty) and CommitError's
//     stored failures, replayed from the ledger after FLUSHALL;
//   - refusals that commit nothing: a closed transaction, a transaction of
//     another database (for a Backend that implements OtherDatabase), a
//     value Do cannot store, a Commit outside Do (ErrNoLedger), a second
//     Commit in one call;
//   - keys as bytes (case, trailing spaces, NUL, invalid UTF-8 and
//     Unicode normalization are distinct keys), and the ledger's key
//     limit (MaxKeyLen) enforced before fn runs;
//   - a child process debiting 20 keys, killed with SIGKILL up to 8 times
//     at random reports, half of them right after a COMMIT and before
//     Redis heard of it: every key ends with one movement, and its
//     receipt is replayed after FLUSHALL (for a Driver with Reopen and a
//     Backend that implements Reopener; skipped under -short).
//
// A driver of the outbox's entity versions (Advance and AdvanceInOrder, as
// idemsql and idempgx have them) runs ExerciseAdvance too, with a Versions
// that applies an entity's event in one transaction: 10 entities × 100
// versions sent twice and shuffled, each applied once, in order through
// AdvanceInOrder and forward only through Advance; 8 transactions racing to
// one version, one applied. A driver of the outbox (Publish and Relay)
// runs ExerciseOutbox, with an Outbox that publishes in a transaction of
// its own and runs its Relay: a rollback publishes nothing, 1,000 events
// reach their streams once each and in order, Redis down loses none and
// duplicates none, a relay stopped between its XADDs and its COMMIT
// duplicates exactly that batch, and two relays at once (SharedRelays)
// publish every row.
//
// Its subpackage dbtest starts the real servers the tests need: Redis and
// PostgreSQL, each on a free loopback port in a temporary directory, as an
// unprivileged user where the server refuses root.
package ledgertest
