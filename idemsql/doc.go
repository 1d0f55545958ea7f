// Package idemsql records the outcomes of idem calls in a SQL database, in
// the transaction of the business change they report: the change and the
// fact that it was made commit together or not at all.
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
//	ledger := idemsql.New(db, idemsql.Postgres) // or idemsql.SQLite, idemsql.MySQL
//	if err := ledger.Migrate(ctx); err != nil { ... }
//	client := idem.New(rdb, idem.WithLedger(ledger))
//
// In fn, the business change and Commit share one transaction:
//
//	receipt, err := idem.Do(ctx, client, key, idem.Fingerprint(req),
//		func(ctx context.Context) (Receipt, error) {
//			tx, err := db.BeginTx(ctx, nil)
//			if err != nil {
//				return Receipt{}, err
//			}
//			defer tx.Rollback()
//			r, err := debit(ctx, tx, req) // the business change, in tx
//			if err != nil {
//				return Receipt{}, err
//			}
//			return r, idemsql.Commit(ctx, tx, r)
//		})
//
// fn needs no reconcile code. If another attempt committed first (a second
// live owner, a call after Redis lost the record), Commit rolls tx back and
// Do returns the recorded outcome; on a takeover after a crash, the Client
// reads the ledger before fn and returns the outcome without running fn.
// A permanent failure whose own changes must stick (a declined payment's
// row) is recorded with CommitError.
//
// # What is exactly-once, and what is not
//
// Changes made in tx, the transaction that Commit commits, are applied
// once per key while the key's row is kept: by the database's unique key,
// whatever happens to Redis or to the process. Effects outside tx are not:
// an HTTP call to a provider before the transaction may be repeated by a
// second attempt. For those, forward idem.Attempt.Key to the provider's
// own idempotency, and consider idem.WithLedgerLookups(true), which reads
// the ledger before every fn, not only on takeovers.
//
// A failed COMMIT (the connection lost after COMMIT was sent, a
// serialization failure) is returned as the transient error it is: Do
// never reports a success that is not recorded, and the next attempt's
// lookup finds the outcome if the commit landed after all.
//
// # The tables
//
// Migrate creates, where missing, the table idem_ledger (WithTable names
// it) with the columns idem_key (primary key), fingerprint, attempt,
// failed, outcome (bytes; the value encoded exactly as idem stores it in
// Redis) and recorded_at; an index on recorded_at for Prune; and
// idem_ledger_meta, one row holding a random id of the database. Commit
// writes only where it finds that id, so a tx of another database is
// refused, even one with a ledger of its own (a copy of the database, id
// included, is not told apart). recorded_at is the database's clock, not
// the host's. Prune deletes rows older than a time: keep them at least as
// long as the Client's retention, Prune(ctx, time.Now().Add(-retention)) —
// a record the Client finishes from a row expires when the row is that old
// (idem.Entry.Age), so the rule holds. docs/operating.md says how often to
// prune and what a row costs.
//
// Keys are bytes; on PostgreSQL, at most 2 KiB (a B-tree entry's limit),
// on MySQL and MariaDB 3 KiB (InnoDB's): the Client refuses a longer key
// before fn runs (Ledger.MaxKeyLen). An error that the database gives the
// same row every time (a value too long, a statement over MySQL's
// max_allowed_packet) is permanent: Do does not retry it.
//
// Any isolation level works. When Commit meets the key's row, it reads the
// row through tx before rolling it back (on MySQL, a locking read, which
// sees the row whatever tx's snapshot). Under REPEATABLE READ or
// SERIALIZABLE an INSERT that meets a row committed after tx began fails
// instead (a serialization failure); Commit then reads the row from db and
// returns the recorded outcome as it would have, if db's pool has a
// connection free at once, and otherwise returns the error as transient:
// the next attempt's lookup finds the outcome.
//
// # Outbox and event order
//
// Publish writes an event into the ledger's _outbox table in the business
// change's transaction: the event exists if and only if the change
// commits (inside Do, with the ledger's row), so no crash between COMMIT
// and XADD loses it, and no rolled-back change publishes one. Relay moves
// committed rows to their Redis Streams (XADD, the fields and
// idem_event_id) and then deletes them, in batches of one transaction.
// Delivery is at least once: a relay that dies between its XADDs and its
// COMMIT, or a batch that fails after them (Redis or the database lost),
// publishes its rows again, with the same ids; consumers deduplicate by
// idem_event_id. While Redis is down, batches fail, back off and are
// retried; no row is deleted before its XADD succeeded. Inside Do, the id
// is derived from the key and the Publish's ordinal in its transaction, so
// a re-run of fn publishes the same ids.
//
// Several relays share the work on PostgreSQL and MySQL: a batch claims its
// rows with FOR UPDATE SKIP LOCKED (on MySQL at READ COMMITTED, deleting
// row by row, so that relays and publishers take no locks on each other's
// rows). In TestOutbox's TwoRelays scenario, two relays moved 1,000 rows
// with no duplicate on PostgreSQL and MariaDB. The rows of a relay killed
// mid-batch stay locked until the server ends its session; until then the
// next relay skips them, and relays them after rows published later. SQLite
// has one writer: run one relay.
//
// Order: rows are relayed in the order of the outbox's autoincrement seq,
// and one relay keeps each stream's entries in that order. seq is given
// at INSERT, not at COMMIT: two transactions that publish to one stream at
// once may commit out of seq order, and the relay may move the later seq
// first; several relays also run batches side by side. Streams do not
// promise more than that, and redeliveries come back out of order anyway.
// So consumers that need order check it: Advance records each entity's
// version in the handler's transaction (the _versions table) and refuses a
// version at or below it with ErrStale (permanent: acknowledge, count, do
// not apply); AdvanceInOrder also refuses a version above the next with
// ErrGap (transient: the event comes back later, and is dead-lettered
// after the consumer's delivery limit). Advance locks the entity's row
// until the transaction ends, so of two consumers applying one version at
// once, one applies it and the other gets ErrStale.
//
// Outside an idem call, give Publish and Advance the ledger with
// NewContext.
//
// # SQLite
//
// SQLite has one writer at a time. Open it so that writers wait for each
// other instead of failing with "database is locked":
//
//	sql.Open("sqlite", "file:app.db?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate")
//
// (modernc.org/sqlite; mattn/go-sqlite3 takes the same parameters). WAL
// lets readers, the Client's lookups among them, run beside the writer.
// The busy timeout makes a writer wait up to 10s for the lock. Immediate
// transactions take the write lock at BEGIN, where the busy timeout
// applies: a deferred transaction that reads and then writes (an UPDATE of
// a balance after a SELECT) asks for the lock at its first write, where
// SQLite cannot wait without risking a deadlock and fails at once. Commit
// names these parameters in its error when SQLite reports itself busy.
// Open a new file with one connection first (Ping, or Migrate): the first
// connection turns it to WAL, and others opening at that moment may fail
// with "database is locked" without waiting.
//
// In one process, also limit the pool to one connection
// (db.SetMaxOpenConns(1)): writers then queue in database/sql's pool, in
// turn, instead of in SQLite's busy handler, whose waits grow to 100ms. In
// BenchmarkLedger, 16 goroutines debiting through a pool of connections
// took 20 to 40 times longer a debit than through one. Commit needs no
// second connection while fn's transaction holds the only one, also for a
// transaction on a *sql.Conn; Migrate reads what Commit needs, so run it in
// every process (a Commit before it fails at once, saying so, rather than
// wait). The Client's lookups run before fn; but fn must not use db outside
// its transaction while it holds one.
//
// # MySQL and MariaDB
//
// The MySQL dialect runs on InnoDB through github.com/go-sql-driver/mysql,
// which you import; it is tested on MariaDB 10.11. A plain DSN works:
//
//	sql.Open("mysql", "app:secret@tcp(db:3306)/bank?parseTime=true")
//
// The DSN must name the database, and its session must keep a strict
// sql_mode (STRICT_TRANS_TABLES, both servers' default), so that a value
// too long for its column is refused, not cut short: Migrate checks both
// and says what to change. Nothing else matters to the ledger:
// clientFoundRows, interpolateParams, multiStatements, the session's
// time_zone and parseTime may be set as the rest of the service needs
// (Commit tells a met row by ER_DUP_ENTRY, not by a count of rows, and
// dates rows with UTC_TIMESTAMP(6) in a DATETIME(6)). interpolateParams=true
// saves a round trip per statement (the driver prepares and closes each
// one otherwise).
//
// Isolation: InnoDB's default, REPEATABLE READ, works, and it is what the
// tests run, beside READ COMMITTED and SERIALIZABLE. The ledger's INSERT
// of a key that another transaction inserted but has not committed waits
// for it, as on PostgreSQL. Under REPEATABLE READ and SERIALIZABLE, InnoDB
// also takes gap locks: an INSERT that meets a key holds a shared next-key
// lock on it. Prune's DELETE (a batch of 1000 rows, one statement) locks
// the rows it scans at any level, which may include the row of a Commit in
// flight: Prune then waits for that transaction (up to
// innodb_lock_wait_timeout, 50 s by default, after which it returns the
// error with the count so far: call it again), and Commits that insert
// into a gap it locked wait for the batch. Prune when the ledger is quiet,
// or keep fn's transactions short. Two
// attempts that wait behind a third's row and are both freed when it
// rolls back deadlock: InnoDB ends one (ER_LOCK_DEADLOCK), which Do
// returns as transient, as it does a lock wait timeout. READ COMMITTED
// takes no gap locks and is what we recommend for services with many
// concurrent writers; the ledger is exactly-once under any level.
//
// What differs on MySQL 8 (not run by the tests): the statements are the
// same, and MySQL 8.0.16 and later enforce the _meta table's CHECK, as
// MariaDB does. MySQL 8 writes a warning for a LOCK IN SHARE MODE (FOR
// SHARE is its name now) and may warn of invalid utf8mb4 in a binary
// parameter of a prepared statement (warning 1300: the value is kept,
// byte for byte); it has no CREATE INDEX IF NOT EXISTS, so Migrate makes
// the index with the table. Its default sql_mode is strict, as MariaDB's
// is, and its default max_allowed_packet is 64 MiB, not 16 MiB. MySQL 8's
// default authentication (caching_sha2_password) needs TLS or
// allowPublicKeyRetrieval=true on the DSN for a password's first login:
// that is the driver's business, not the ledger's.
package idemsql
