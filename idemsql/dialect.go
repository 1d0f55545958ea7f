// dialect.go: the SQL that differs between databases.

package idemsql

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
)

// A Dialect is the SQL of one database system: its column types,
// placeholders and error codes. Use Postgres, SQLite or MySQL; the zero
// Dialect is not valid.
type Dialect struct {
	d *dialect
}

// String returns the dialect's name: "postgres", "sqlite" or "mysql".
func (d Dialect) String() string {
	if d.d == nil {
		return "<zero Dialect>"
	}
	return d.d.name
}

var (
	// Postgres is PostgreSQL 13 or later, through any database/sql driver
	// (pgx's stdlib, lib/pq). Keys, fingerprints and outcomes are bytea;
	// the recording time is a timestamptz.
	Postgres = Dialect{&dialect{
		name:        "postgres",
		placeholder: func(i int, typ string) string { return "$" + strconv.Itoa(i) + "::" + typ },
		blob:        "bytea",
		key:         "bytea",
		boolean:     "boolean",
		integer:     "bigint",
		timestamp:   "timestamptz",
		// The start of the INSERT's statement: after Commit began, so a
		// row is never older than the record finished from it thinks.
		clock:     "statement_timestamp()",
		ageMicros: "(extract(epoch FROM statement_timestamp() - recorded_at) * 1000000)::bigint",
		before:    func(p string) string { return "statement_timestamp() - " + p + " * interval '1 microsecond'" },
		// A B-tree entry of PostgreSQL holds at most about 2,700 bytes (a
		// third of a page): keys up to 2 KiB leave room for its header and
		// whatever the page needs.
		maxKeyLen:   2048,
		permanent:   pgPermanent,
		missing:     pgMissing,
		migrateLock: "SELECT pg_advisory_xact_lock(hashtext($1))",
		// BRIN: rows arrive in about the order of their times, and a BRIN
		// index costs an INSERT next to nothing, unlike a B-tree.
		timeIndex:   "USING brin (recorded_at)",
		onDuplicate: onConflictDoNothing,
		hint:        func(error) string { return "" },
	}}

	// SQLite is SQLite 3.24 or later, through any database/sql driver
	// (modernc.org/sqlite, mattn/go-sqlite3). Keys, fingerprints and outcomes
	// are blobs; the recording time is in Unix milliseconds. Open the
	// database so that concurrent writers wait for each other instead of
	// failing with "database is locked" (see the package doc).
	SQLite = Dialect{&dialect{
		name:        "sqlite",
		placeholder: func(int, string) string { return "?" },
		blob:        "blob",
		key:         "blob",
		boolean:     "integer",
		integer:     "integer",
		timestamp:   "integer",
		// SQLite's clock, in Unix milliseconds; 'now' is one moment within
		// a statement.
		clock:       sqliteNow,
		ageMicros:   "(" + sqliteNow + " - recorded_at) * 1000",
		before:      func(p string) string { return sqliteNow + " - " + p + " / 1000" },
		permanent:   sqliteTooBig,
		missing:     func(err error) bool { return strings.Contains(err.Error(), "no such table") },
		timeIndex:   "(recorded_at)",
		onDuplicate: onConflictDoNothing,
		hint:        sqliteHint,
	}}

	// MySQL is MariaDB 10.5 or later, or MySQL 8.0 or later, through
	// github.com/go-sql-driver/mysql (import it yourself: idemsql imports
	// no driver), with InnoDB tables. A plain DSN works,
	// user:pass@tcp(host:3306)/db?parseTime=true; it must name the
	// database. Keys are a VARBINARY(3072), the primary key, compared byte
	// for byte; fingerprints and outcomes are LONGBLOBs; the recording time
	// is a DATETIME(6) in UTC by the server's clock, whatever the session's
	// time zone. See the package doc for isolation levels and locks.
	MySQL = Dialect{&dialect{
		name:        "mysql",
		placeholder: func(int, string) string { return "?" },
		blob:        "longblob",
		// InnoDB's limit for a key of the DYNAMIC row format, the default
		// since MySQL 5.7 and MariaDB 10.2, with 16 KiB pages.
		key:       "varbinary(3072)",
		boolean:   "boolean",
		integer:   "bigint",
		timestamp: "datetime(6)",
		// UTC_TIMESTAMP is the start of the statement, as NOW() is, and
		// does not depend on the session's time_zone.
		clock:     "UTC_TIMESTAMP(6)",
		ageMicros: "TIMESTAMPDIFF(MICROSECOND, recorded_at, UTC_TIMESTAMP(6))",
		before:    func(p string) string { return "UTC_TIMESTAMP(6) - INTERVAL " + p + " MICROSECOND" },
		maxKeyLen: 3072,
		permanent: mysqlPermanent,
		missing:   func(err error) bool { return mysqlErrno(err) == 1146 }, // ER_NO_SUCH_TABLE
		// MySQL 8 has no CREATE INDEX IF NOT EXISTS: the index is made
		// with the table.
		timeIndex:   "INDEX %s_recorded_at (recorded_at)",
		indexInline: true,
		// A plain INSERT: a key that has a row fails with ER_DUP_ENTRY,
		// which rolls back the statement only, and reads as "not added"
		// (duplicate) whatever the DSN's clientFoundRows, which would make
		// ON DUPLICATE KEY UPDATE report a row that was not added.
		onDuplicate: func(string) string { return "" },
		duplicate:   func(err error) bool { return mysqlErrno(err) == 1062 }, // ER_DUP_ENTRY
		deleteLimit: true,
		// Under REPEATABLE READ, a plain SELECT reads the transaction's
		// snapshot, which may predate the row its INSERT just met; a
		// locking read sees the row (and the lock is the INSERT's already).
		lockRead:   " LOCK IN SHARE MODE",
		metaIgnore: "ON DUPLICATE KEY UPDATE one = one",
		sessionCheck: "SELECT CASE WHEN DATABASE() IS NULL THEN 'the DSN names no database: end its address part with /dbname' " +
			"WHEN @@SESSION.sql_mode NOT LIKE '%STRICT_%' THEN CONCAT('the session''s sql_mode (', @@SESSION.sql_mode, ') is not strict, so a value too long for its column would be cut short instead of refused: add STRICT_TRANS_TABLES (the server''s default), or sql_mode=%27STRICT_TRANS_TABLES%27 to the DSN') " +
			"ELSE '' END",
		hint: mysqlHint,
	}}
)

// dialect holds what differs; Dialect wraps a pointer to it so that users
// cannot build one that lacks a part.
type dialect struct {
	name string
	// placeholder is the i-th parameter (from 1), of the column type typ
	// (Postgres cannot infer the types of an INSERT's SELECT list).
	placeholder func(i int, typ string) string
	// Column types; key is the type of the key column, the primary key.
	blob, key, boolean, integer, timestamp string
	// clock is the database's current time as the recorded_at column holds
	// it; ageMicros, the age of a row's recorded_at by that clock, in
	// microseconds; before(p), the recorded_at of a row that is p
	// microseconds old (p is a parameter of type integer).
	clock, ageMicros string
	before           func(p string) string
	// maxKeyLen is the longest key the key column can index, in bytes; 0:
	// no limit of its own.
	maxKeyLen int
	// permanent reports whether err is one the database will repeat
	// whatever the attempt (a value too large for it).
	permanent func(error) bool
	// missing reports whether err says that a table does not exist.
	missing func(error) bool
	// timeIndex is the index method and columns of the index Prune uses;
	// with indexInline, its definition inside CREATE TABLE (%s: the
	// table's name), for databases without CREATE INDEX IF NOT EXISTS.
	timeIndex   string
	indexInline bool
	// onDuplicate(col) ends an INSERT so that a row whose col exists is
	// not added ("ON CONFLICT (col) DO NOTHING"); "" for a plain INSERT,
	// whose failure duplicate reports. metaIgnore, when set, is the
	// ending of the INSERT of the _meta row instead.
	onDuplicate func(col string) string
	duplicate   func(error) bool
	metaIgnore  string
	// deleteLimit: DELETE takes a LIMIT (else Prune deletes the keys of a
	// subquery with a LIMIT).
	deleteLimit bool
	// lockRead ends the lookup of a key through the user's transaction,
	// after its INSERT met the key's row: a read that sees that row.
	lockRead string
	// sessionCheck, when set, is a query that Migrate runs: one text
	// column, empty when the session suits the ledger, else what is wrong
	// and its fix.
	sessionCheck string
	// migrateLock, if not empty, takes a lock that makes Migrates of one
	// table ($1: a name for it) take turns, for databases whose CREATE ...
	// IF NOT EXISTS is not safe against itself in two sessions at once.
	migrateLock string
	// hint returns the fix of err, when the fix is known: "" otherwise.
	hint func(error) string
}

// onConflictDoNothing ends an INSERT of Postgres and SQLite that adds no
// row whose col exists.
func onConflictDoNothing(col string) string { return "ON CONFLICT (" + col + ") DO NOTHING" }

// sqlStater is an error of a Postgres driver that carries the SQLSTATE
// code, as pgx's *pgconn.PgError does: reading it needs no import of the
// driver. Without it, errors are told apart by their messages.
type sqlStater interface{ SQLState() string }

func sqlState(err error) string {
	var s sqlStater
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// pgPermanent reports an error of class 54 (program_limit_exceeded: an
// index row or a statement too large) or a value too long for its type
// (22001): the database gives the same answer to the same row every time.
func pgPermanent(err error) bool {
	s := sqlState(err)
	return strings.HasPrefix(s, "54") || s == "22001"
}

// sqliteNow is SQLite's clock in Unix milliseconds.
const sqliteNow = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)"

// sqliteTooBig reports SQLITE_TOOBIG (18): a row over SQLite's limit.
func sqliteTooBig(err error) bool {
	var c interface{ Code() int }
	if errors.As(err, &c) {
		return c.Code()&0xff == 18
	}
	return strings.Contains(err.Error(), "string or blob too big")
}

// pgMissing reports an undefined_table error (42P01).
func pgMissing(err error) bool {
	if s := sqlState(err); s != "" {
		return s == "42P01"
	}
	return strings.Contains(err.Error(), "does not exist") && strings.Contains(err.Error(), "relation")
}

// sqliteHint names the DSN parameters that make SQLite's writers wait for
// each other, for an error that says that SQLite was busy.
func sqliteHint(err error) string {
	if sqliteBusy(err) {
		return "SQLite was locked by another writer longer than it waits: open it with _busy_timeout=10000 and _txlock=immediate (see the package doc)"
	}
	return ""
}

// sqliteBusy reports SQLITE_BUSY (5) or SQLITE_LOCKED (6), by the code of
// the driver's error when it has one, else by the message.
func sqliteBusy(err error) bool {
	var c interface{ Code() int }
	if errors.As(err, &c) {
		code := c.Code() & 0xff // the primary result code of an extended one
		return code == 5 || code == 6
	}
	msg := err.Error()
	return strings.Contains(msg, "database is locked") || strings.Contains(msg, "SQLITE_BUSY")
}

// mysqlErrno returns the error number of the first *mysql.MySQLError of
// go-sql-driver/mysql in err's chain (its Number field, read by
// reflection: idemsql imports no driver), or 0.
func mysqlErrno(err error) uint16 {
	for _, e := range chain(err) {
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer && !v.IsNil() {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct || v.Type().Name() != "MySQLError" {
			continue
		}
		if f := v.FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
			return uint16(f.Uint())
		}
	}
	return 0
}

// chain returns err and every error it wraps, depth first.
func chain(err error) []error {
	var all []error
	var walk func(error)
	walk = func(e error) {
		if e == nil || len(all) > 100 {
			return
		}
		all = append(all, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, w := range u.Unwrap() {
				walk(w)
			}
		}
	}
	walk(err)
	return all
}

// mysqlPermanent reports the errors MySQL and MariaDB give the same row
// every time: a value too long for its column (ER_DATA_TOO_LONG, 1406), a
// key too long for its index (ER_TOO_LONG_KEY, 1071), a row too large
// (ER_TOO_BIG_ROWSIZE, 1118), a statement larger than max_allowed_packet
// (ER_NET_PACKET_TOO_LARGE, 1153; ER_WARN_ALLOWED_PACKET_OVERFLOWED,
// 1301). Deadlocks (1213) and lock wait
// timeouts (1205) are not: another attempt may pass.
func mysqlPermanent(err error) bool {
	switch mysqlErrno(err) {
	case 1406, 1071, 1118, 1153, 1301:
		return true
	}
	return false
}

// mysqlHint explains the errors of MySQL whose fix is known.
func mysqlHint(err error) string {
	switch mysqlErrno(err) {
	case 1046: // ER_NO_DB_ERROR
		return "the DSN names no database: end its address part with /dbname"
	case 1153, 1301:
		return "the outcome is larger than the server's max_allowed_packet"
	}
	return ""
}

// statements is the SQL of one ledger: its dialect with its table's name.
type statements struct {
	createTable, createIndex, createMeta, insertMeta string
	selectMeta                                       string // the database's marker
	insert                                           string // a row, if the marker is the ledger's
	lookup                                           string // a row by key
	lookupLocked                                     string // a row by key, through the tx whose INSERT met it
	prune                                            string // one batch of rows recorded before a time
}

// pruneBatch is how many rows one DELETE of Prune removes: small enough
// that no statement holds its locks for long.
const pruneBatch = 1000

func (d *dialect) statements(table string) statements {
	meta := table + "_meta"
	blob := func(i int) string { return d.placeholder(i, d.blob) }
	st := statements{
		createTable: "CREATE TABLE IF NOT EXISTS " + table + " (\n" +
			"\tidem_key " + d.key + " NOT NULL PRIMARY KEY,\n" +
			"\tfingerprint " + d.blob + " NOT NULL,\n" +
			"\tattempt " + d.integer + " NOT NULL,\n" +
			"\tfailed " + d.boolean + " NOT NULL,\n" +
			"\toutcome " + d.blob + " NOT NULL,\n" +
			"\trecorded_at " + d.timestamp + " NOT NULL\n)",
		createIndex: "CREATE INDEX IF NOT EXISTS " + table + "_recorded_at ON " + table + " " + d.timeIndex,
		// One row, whose id tells this database from every other: Commit
		// writes only where it finds the ledger's own id.
		createMeta: "CREATE TABLE IF NOT EXISTS " + meta + " (\n" +
			"\tone " + d.integer + " NOT NULL PRIMARY KEY CHECK (one = 1),\n" +
			"\tdatabase_id " + d.blob + " NOT NULL\n)",
		insertMeta: "INSERT INTO " + meta + " (one, database_id) VALUES (1, " + blob(1) + ") " + d.onDuplicate("one"),
		selectMeta: "SELECT database_id FROM " + meta + " WHERE one = 1",
		insert: "INSERT INTO " + table + " (idem_key, fingerprint, attempt, failed, outcome, recorded_at)\n" +
			"SELECT " + blob(1) + ", " + blob(2) + ", " + d.placeholder(3, d.integer) + ", " +
			d.placeholder(4, d.boolean) + ", " + blob(5) + ", " + d.clock +
			" FROM " + meta + " WHERE one = 1 AND database_id = " + blob(6) + "\n" +
			d.onDuplicate("idem_key"),
		lookup: "SELECT fingerprint, attempt, failed, outcome, " + d.ageMicros + " FROM " + table + " WHERE idem_key = " + blob(1),
		prune: "DELETE FROM " + table + " WHERE idem_key IN (SELECT idem_key FROM " + table +
			" WHERE recorded_at < " + d.before(d.placeholder(1, d.integer)) + " LIMIT " + strconv.Itoa(pruneBatch) + ")",
	}
	st.lookupLocked = st.lookup + d.lockRead
	if d.indexInline {
		st.createTable = strings.TrimSuffix(st.createTable, "\n)") + ",\n\t" + strings.ReplaceAll(d.timeIndex, "%s", table) + "\n)"
		st.createIndex = ""
	}
	if d.metaIgnore != "" {
		st.insertMeta = "INSERT INTO " + meta + " (one, database_id) VALUES (1, " + blob(1) + ") " + d.metaIgnore
	}
	if d.deleteLimit {
		st.prune = "DELETE FROM " + table + " WHERE recorded_at < " + d.before(d.placeholder(1, d.integer)) + " LIMIT " + strconv.Itoa(pruneBatch)
	}
	return st
}
