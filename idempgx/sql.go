// sql.go: the ledger's SQL, the same tables as idemsql.Postgres writes, so
// that a service moving between database/sql and pgx keeps its rows.

package idempgx

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// statements is the SQL of one ledger's table. Everything but insert and
// recorded is idemsql.Postgres's SQL, word for word (a test compares the
// schemas that the two Migrates make).
type statements struct {
	createTable, createIndex, createMeta, insertMeta string
	createVersions, createOutbox                     string // the tables of Advance and Publish
	publish                                          string // an event: $1 id, $2 stream, $3 fields
	publishDerived                                   string // an event whose id is $1 and the tx's next ordinal; returns the id
	claim                                            string // the oldest events (%d: how many), locked, skipping rows locked by others
	deleteEvents                                     string // the events of the seqs $1
	lag                                              string // the age of the oldest event, in microseconds
	ensureVersion                                    string // a row at version 0 for the entity $1, if it has none
	lockVersion                                      string // $1's version, locked until the tx ends
	setVersion                                       string // $1 to $2 where it is at $3
	migrateLock                                      string // Migrates of one table take turns (with idemsql's too)
	selectMeta                                       string // the database's marker
	insert                                           string // a row, failing unless the marker is the ledger's
	lookup                                           string // a row by key
	recorded                                         string // a row by key, if the marker is the ledger's
	prune                                            string // one batch of rows recorded before a time
}

// pruneBatch is how many rows one DELETE of Prune removes, as idemsql's:
// small enough that no statement holds its locks for long.
const pruneBatch = 1000

// maxKeyLen is the longest key the table indexes: a B-tree entry of
// PostgreSQL holds at most about 2,700 bytes (a third of a page), and keys
// up to 2 KiB leave room for its header (idemsql.Postgres's limit).
const maxKeyLen = 2048

// ageMicros is a row's age by the database's clock, in microseconds.
const ageMicros = "(extract(epoch FROM statement_timestamp() - recorded_at) * 1000000)::bigint"

func newStatements(table string) statements {
	meta := table + "_meta"
	return statements{
		createTable: "CREATE TABLE IF NOT EXISTS " + table + " (\n" +
			"\tidem_key bytea NOT NULL PRIMARY KEY,\n" +
			"\tfingerprint bytea NOT NULL,\n" +
			"\tattempt bigint NOT NULL,\n" +
			"\tfailed boolean NOT NULL,\n" +
			"\toutcome bytea NOT NULL,\n" +
			"\trecorded_at timestamptz NOT NULL\n)",
		// BRIN: rows arrive in about the order of their times, and a BRIN
		// index costs an INSERT next to nothing, unlike a B-tree.
		createIndex: "CREATE INDEX IF NOT EXISTS " + table + "_recorded_at ON " + table + " USING brin (recorded_at)",
		createMeta: "CREATE TABLE IF NOT EXISTS " + meta + " (\n" +
			"\tone bigint NOT NULL PRIMARY KEY CHECK (one = 1),\n" +
			"\tdatabase_id bytea NOT NULL\n)",
		insertMeta:  "INSERT INTO " + meta + " (one, database_id) VALUES (1, $1::bytea) ON CONFLICT (one) DO NOTHING",
		migrateLock: "SELECT pg_advisory_xact_lock(hashtext($1))",
		selectMeta:  "SELECT database_id FROM " + meta + " WHERE one = 1",
		// A plain INSERT: a key that has a row fails it (23505), which
		// aborts the transaction, so the COMMIT sent with it rolls back.
		// recorded_at is the start of the statement by the database's
		// clock, read from the _meta row only where it holds the ledger's
		// id: in another database it is NULL and the INSERT fails (23502)
		// instead of inserting nothing and letting the COMMIT through.
		insert: "INSERT INTO " + table + " (idem_key, fingerprint, attempt, failed, outcome, recorded_at)\n" +
			"VALUES ($1::bytea, $2::bytea, $3::bigint, $4::boolean, $5::bytea,\n" +
			"\t(SELECT statement_timestamp() FROM " + meta + " WHERE one = 1 AND database_id = $6::bytea))",
		lookup: "SELECT fingerprint, attempt, failed, outcome, " + ageMicros + " FROM " + table + " WHERE idem_key = $1::bytea",
		recorded: "SELECT fingerprint, attempt, failed, outcome, " + ageMicros + " FROM " + table +
			" WHERE idem_key = $1::bytea AND EXISTS (SELECT 1 FROM " + meta + " WHERE one = 1 AND database_id = $2::bytea)",
		createVersions: "CREATE TABLE IF NOT EXISTS " + table + "_versions (\n" +
			"\tentity bytea NOT NULL PRIMARY KEY,\n" +
			"\tversion bigint NOT NULL\n)",
		createOutbox: "CREATE TABLE IF NOT EXISTS " + table + "_outbox (\n" +
			"\tseq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n" +
			"\tevent_id bytea NOT NULL UNIQUE,\n" +
			"\tstream bytea NOT NULL,\n" +
			"\tfields bytea NOT NULL,\n" +
			"\trecorded_at timestamptz NOT NULL\n)",
		publish: "INSERT INTO " + table + "_outbox (event_id, stream, fields, recorded_at) VALUES ($1::bytea, $2::bytea, $3::bytea, statement_timestamp())",
		publishDerived: "INSERT INTO " + table + "_outbox (event_id, stream, fields, recorded_at) VALUES (\n" +
			"\tconvert_to($1::text || set_config('" + ordinalSetting + "', (coalesce(nullif(current_setting('" + ordinalSetting + "', true), ''), '0')::bigint + 1)::text, true), 'UTF8'),\n" +
			"\t$2::bytea, $3::bytea, statement_timestamp()) RETURNING event_id",
		claim:         "SELECT seq, event_id, stream, fields FROM " + table + "_outbox ORDER BY seq LIMIT %d FOR UPDATE SKIP LOCKED",
		deleteEvents:  "DELETE FROM " + table + "_outbox WHERE seq = ANY($1::bigint[])",
		lag:           "SELECT " + ageMicros + " FROM " + table + "_outbox ORDER BY seq LIMIT 1",
		ensureVersion: "INSERT INTO " + table + "_versions (entity, version) VALUES ($1::bytea, 0) ON CONFLICT (entity) DO NOTHING",
		lockVersion:   "SELECT version FROM " + table + "_versions WHERE entity = $1::bytea FOR UPDATE",
		setVersion:    "UPDATE " + table + "_versions SET version = $1::bigint WHERE entity = $2::bytea AND version = $3::bigint",
		prune: "DELETE FROM " + table + " WHERE idem_key IN (SELECT idem_key FROM " + table +
			" WHERE recorded_at < statement_timestamp() - $1::bigint * interval '1 microsecond' LIMIT " + strconv.Itoa(pruneBatch) + ")",
	}
}

// SQLSTATE codes that Commit tells apart.
const (
	uniqueViolation  = "23505"
	notNullViolation = "23502"
	undefinedTable   = "42P01"
	inFailedTx       = "25P02"
)

// pgError returns err's *pgconn.PgError, or nil.
func pgError(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

// permanent reports an error of class 54 (program_limit_exceeded: an index
// row or a statement too large) or a value too long for its type (22001):
// the database gives the same answer to the same row every time.
func permanent(err error) bool {
	pe := pgError(err)
	return pe != nil && (strings.HasPrefix(pe.Code, "54") || pe.Code == "22001")
}

// explainTable is explain for the statements of the ledger's table of
// suffix (_outbox, _versions).
func (l *Ledger) explainTable(doing, suffix string, err error) error {
	if missing(err) {
		return fmt.Errorf("idempgx: %s: the table %s%s is missing (call Migrate first): %w", doing, l.table, suffix, err)
	}
	return fmt.Errorf("idempgx: %s: %w", doing, err)
}

// missing reports an undefined_table error.
func missing(err error) bool {
	pe := pgError(err)
	return pe != nil && pe.Code == undefinedTable
}
