// Package servertest opens the databases idemsql's tests run on: SQLite
// files in temporary directories, and databases of the shared PostgreSQL
// and MariaDB servers that ledgertest/dbtest starts.
package servertest

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/ledgertest/dbtest"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// SQLiteOptions are the DSN parameters idemsql's package doc recommends:
// WAL, so that readers do not wait for the writer; a busy timeout, so that
// a writer waits for another instead of failing with "database is
// locked"; and immediate transactions, so that a transaction takes the
// write lock when it begins, where the busy timeout applies, not when it
// first writes after a read, where SQLite cannot wait.
const SQLiteOptions = "_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"

// SQLiteDSN returns the DSN of a new SQLite database file in a temporary
// directory that is removed when the test ends.
func SQLiteDSN(tb testing.TB) string {
	return "file:" + filepath.Join(tb.TempDir(), "test.db") + "?" + SQLiteOptions
}

// OpenSQLite opens dsn with the modernc.org/sqlite driver; the handle is
// closed when the test ends.
func OpenSQLite(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	// The first connection turns a new file to WAL. Connections that open
	// at the same moment may find the change under way and fail with
	// SQLITE_BUSY, without waiting: SQLite does not wait for a journal mode
	// change. Make the change now, alone.
	if err := db.Ping(); err != nil {
		tb.Fatal(err)
	}
	return db
}

// A Backend is one database system the tests run on.
type Backend struct {
	// Name is "postgres", "sqlite" or "mariadb".
	Name string
	// Open returns a new, empty database (closed when the test ends) and
	// its DSN, for child processes.
	Open func(tb testing.TB) (*sql.DB, string)
	// Reopen opens the database of a DSN that Open returned (in a child
	// process); the handle is closed when the test ends.
	Reopen func(tb testing.TB, dsn string) *sql.DB
	// Driver is the database/sql driver's name.
	Driver string
}

// Backends returns every database system: PostgreSQL and MariaDB (the
// shared servers, a new database each time) and SQLite (a new file each
// time).
func Backends() []Backend {
	return []Backend{
		{Name: "postgres", Driver: "pgx", Open: func(tb testing.TB) (*sql.DB, string) {
			pg := dbtest.SharedPostgres(tb)
			dsn := pg.NewDatabase(tb)
			return pg.Open(tb, dsn), dsn
		}, Reopen: func(tb testing.TB, dsn string) *sql.DB { return open(tb, "pgx", dsn) }},
		{Name: "sqlite", Driver: "sqlite", Open: func(tb testing.TB) (*sql.DB, string) {
			dsn := SQLiteDSN(tb)
			return OpenSQLite(tb, dsn), dsn
		}, Reopen: OpenSQLite},
		{Name: "mariadb", Driver: "mysql", Open: func(tb testing.TB) (*sql.DB, string) {
			m := dbtest.SharedMariaDB(tb)
			dsn := m.NewDatabase(tb)
			return m.Open(tb, dsn), dsn
		}, Reopen: func(tb testing.TB, dsn string) *sql.DB { return open(tb, "mysql", dsn) }},
	}
}

// open opens dsn with driver; the handle is closed when the test ends.
func open(tb testing.TB, driver, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}
