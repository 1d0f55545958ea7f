// dialect.go: the SQL that differs between databases.

package idemsql

import (
	"errors"
	"strconv"
	"strings"
)

// A Dialect is the SQL of one database system: its column types,
// placeholders and error codes. Use Postgres or SQLite; the zero Dialect
// is not valid.
type Dialect struct {
	d *dialect
}

// String returns the dialect's name: "postgres" or "sqlite".
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
		timeIndex: "USING brin (recorded_at)",
		busy:      func(error) bool { return false },
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
		boolean:     "integer",
		integer:     "integer",
		timestamp:   "integer",
		// SQLite's clock, in Unix milliseconds; 'now' is one moment within
		// a statement.
		clock:     sqliteNow,
		ageMicros: "(" + sqliteNow + " - recorded_at) * 1000",
		before:    func(p string) string { return sqliteNow + " - " + p + " / 1000" },
		permanent: sqliteTooBig,
		missing:   func(err error) bool { return strings.Contains(err.Error(), "no such table") },
		timeIndex: "(recorded_at)",
		busy:      sqliteBusy,
	}}
)

// dialect holds what differs; Dialect wraps a pointer to it so that users
// cannot build one that lacks a part.
type dialect struct {
	name string
	// placeholder is the i-th parameter (from 1), of the column type typ
	// (Postgres cannot infer the types of an INSERT's SELECT list).
	placeholder func(i int, typ string) string
	// Column types.
	blob, boolean, integer, timestamp string
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
	// timeIndex is the index method and columns of the index Prune uses.
	timeIndex string
	// migrateLock, if not empty, takes a lock that makes Migrates of one
	// table ($1: a name for it) take turns, for databases whose CREATE ...
	// IF NOT EXISTS is not safe against itself in two sessions at once.
	migrateLock string
	// busy reports whether err says that the database was locked by
	// another connection for longer than it was willing to wait.
	busy func(error) bool
}

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

// statements is the SQL of one ledger: its dialect with its table's name.
type statements struct {
	createTable, createIndex, createMeta, insertMeta string
	selectMeta                                       string // the database's marker
	insert                                           string // a row, if the marker is the ledger's
	lookup                                           string // a row by key
	prune                                            string // one batch of rows recorded before a time
}

// pruneBatch is how many rows one DELETE of Prune removes: small enough
// that no statement holds its locks for long.
const pruneBatch = 1000

func (d *dialect) statements(table string) statements {
	meta := table + "_meta"
	blob := func(i int) string { return d.placeholder(i, d.blob) }
	return statements{
		createTable: "CREATE TABLE IF NOT EXISTS " + table + " (\n" +
			"\tidem_key " + d.blob + " NOT NULL PRIMARY KEY,\n" +
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
		insertMeta: "INSERT INTO " + meta + " (one, database_id) VALUES (1, " + blob(1) + ") ON CONFLICT (one) DO NOTHING",
		selectMeta: "SELECT database_id FROM " + meta + " WHERE one = 1",
		insert: "INSERT INTO " + table + " (idem_key, fingerprint, attempt, failed, outcome, recorded_at)\n" +
			"SELECT " + blob(1) + ", " + blob(2) + ", " + d.placeholder(3, d.integer) + ", " +
			d.placeholder(4, d.boolean) + ", " + blob(5) + ", " + d.clock +
			" FROM " + meta + " WHERE one = 1 AND database_id = " + blob(6) + "\n" +
			"ON CONFLICT (idem_key) DO NOTHING",
		lookup: "SELECT fingerprint, attempt, failed, outcome, " + d.ageMicros + " FROM " + table + " WHERE idem_key = " + blob(1),
		prune: "DELETE FROM " + table + " WHERE idem_key IN (SELECT idem_key FROM " + table +
			" WHERE recorded_at < " + d.before(d.placeholder(1, d.integer)) + " LIMIT " + strconv.Itoa(pruneBatch) + ")",
	}
}
