package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql" // the "mysql" database/sql driver, for mysql://
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for postgres://
	_ "modernc.org/sqlite"             // the "sqlite" database/sql driver, for sqlite:
)

// What -ledger says about a key: whether the ledger (idemsql's table in
// the service's own database) holds its outcome, and since when. idemctl
// only reads the ledger: one SELECT of the key's row, on one connection.

// ledgerDB is a ledger opened from -ledger's DSN.
type ledgerDB struct {
	db     *sql.DB
	ledger *idemsql.Ledger
	where  string // the DSN with its password hidden, for messages
}

// openLedger opens the ledger that dsn names: postgres://… or
// postgresql://… (pgx's database/sql driver), sqlite:PATH (a file that
// must exist, opened read-only), or mysql://user:password@host:port/db
// (go-sql-driver/mysql; or mysql:DSN in that driver's own form). A DSN of none of these
// kinds, or malformed, is bad usage. Nothing is sent to the database yet.
func openLedger(dsn, table string) (*ledgerDB, error) {
	if table == "" || !validTable(table) {
		return nil, usagef("-ledger-table %q: want the table's name as idemsql.WithTable got it (letters, digits, '_'; at most 48)", table)
	}
	scheme, rest, _ := strings.Cut(dsn, ":")
	var (
		driver, source, where string
		dialect               idemsql.Dialect
	)
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, usagef("-ledger: a malformed postgres:// URL: %v", redactErr(err, dsn))
		}
		driver, source, where, dialect = "pgx", dsn, u.Redacted(), idemsql.Postgres
	case "sqlite":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return nil, usagef("-ledger sqlite: names no file: want sqlite:PATH, such as sqlite:/var/lib/app/app.db")
		}
		if strings.HasPrefix(path, "file:") {
			source = path // a URI of the user's own, with its own options
		} else {
			if _, err := os.Stat(path); err != nil {
				return nil, fmt.Errorf("-ledger %s: %w (idemctl reads an existing ledger; it creates none)", dsn, err)
			}
			source = "file:" + (&url.URL{Path: path}).EscapedPath() + "?mode=ro&_pragma=busy_timeout(5000)"
		}
		driver, where, dialect = "sqlite", dsn, idemsql.SQLite
	case "mysql":
		var err error
		if source, where, err = mysqlDSN(dsn, rest); err != nil {
			return nil, err
		}
		driver, dialect = "mysql", idemsql.MySQL
	default:
		return nil, usagef("-ledger %q: want postgres://user@host:port/db, sqlite:PATH or mysql://user@host:port/db", redactDSN(dsn))
	}
	db, err := sql.Open(driver, source)
	if err != nil {
		return nil, usagef("-ledger %s: %v", where, redactErr(err, dsn))
	}
	db.SetMaxOpenConns(1)
	return &ledgerDB{db: db, ledger: idemsql.New(db, dialect, idemsql.WithTable(table)), where: where}, nil
}

// mysqlDSN turns -ledger mysql://user:password@host:port/db?params into
// go-sql-driver/mysql's DSN (user:password@tcp(host:port)/db?params), and
// takes mysql:DSN, the driver's own form, as it is. It returns the DSN and
// the URL with its password hidden.
func mysqlDSN(dsn, rest string) (source, where string, err error) {
	if !strings.HasPrefix(rest, "//") {
		cfg, err := mysql.ParseDSN(rest)
		if err != nil {
			return "", "", usagef("-ledger mysql:DSN: %v", redactErr(err, rest))
		}
		if cfg.DBName == "" {
			return "", "", usagef("-ledger mysql:DSN names no database: want mysql:user@tcp(host:port)/db")
		}
		c := *cfg
		c.Passwd = ""
		return rest, "mysql:" + c.FormatDSN(), nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", "", usagef("-ledger: a malformed mysql:// URL: %v", redactErr(err, dsn))
	}
	db := strings.TrimPrefix(u.Path, "/")
	if u.Host == "" || db == "" || strings.Contains(db, "/") {
		return "", "", usagef("-ledger %s: want mysql://user:password@host:port/db", u.Redacted())
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "3306")
	}
	cfg, err := mysql.ParseDSN("tcp(" + host + ")/" + db + "?" + u.RawQuery)
	if err != nil {
		return "", "", usagef("-ledger %s: %v", u.Redacted(), err)
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return cfg.FormatDSN(), u.Redacted(), nil
}

// validTable reports whether name is a table name that idemsql.WithTable
// takes.
func validTable(name string) bool {
	if len(name) > 48 {
		return false
	}
	for i, r := range name {
		switch {
		case r == '_', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func (l *ledgerDB) Close() error { return l.db.Close() }

// redactDSN hides the password of a URL-shaped dsn.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		return u.Redacted()
	}
	return dsn
}

// redactErr returns err with dsn's password, if any, cut from its message.
func redactErr(err error, dsn string) error {
	u, perr := url.Parse(dsn)
	if perr != nil || u.User == nil {
		if i := strings.Index(dsn, "@"); i > 0 {
			// Too malformed to parse: say nothing of what precedes '@'.
			return errors.New(strings.ReplaceAll(err.Error(), dsn[:i], "xxxxx"))
		}
		return err
	}
	if p, ok := u.User.Password(); ok && p != "" {
		return errors.New(strings.ReplaceAll(err.Error(), p, "xxxxx"))
	}
	return err
}

// ledgerJSON is what the ledger holds for a key, in -json output.
type ledgerJSON struct {
	// Looked is false without -ledger: the ledger was not read, and
	// nothing is known of it.
	Looked bool   `json:"looked"`
	Table  string `json:"table,omitempty"`
	// Found: the ledger holds the key's outcome (its row).
	Found       bool       `json:"found"`
	Failed      bool       `json:"failed,omitempty"` // a permanent failure (CommitError), not a result
	Attempt     int64      `json:"attempt,omitempty"`
	RecordedAt  *time.Time `json:"recorded_at,omitempty"` // now less the row's age, by the database's clock
	AgeSeconds  float64    `json:"age_seconds,omitempty"`
	ValueBytes  int        `json:"value_bytes,omitempty"`
	Fingerprint bool       `json:"fingerprint,omitempty"` // the row has a fingerprint digest
}

// lookup reads key's row from the ledger, when there is one (l not nil).
func (l *ledgerDB) lookup(ctx context.Context, key string) (ledgerJSON, error) {
	if l == nil {
		return ledgerJSON{}, nil
	}
	j := ledgerJSON{Looked: true, Table: l.ledger.Table()}
	e, ok, err := l.ledger.Lookup(ctx, key)
	if err != nil {
		return j, fmt.Errorf("ledger %s: %w", l.where, err)
	}
	if !ok {
		return j, nil
	}
	at := time.Now().Add(-e.Age).UTC().Round(time.Millisecond)
	j.Found, j.Failed, j.Attempt, j.RecordedAt = true, e.Failed, e.Attempt, &at
	j.AgeSeconds, j.ValueBytes, j.Fingerprint = e.Age.Seconds(), len(e.Value), e.FingerprintDigest != ""
	return j, nil
}

// line says what the ledger holds, for the text output.
func (j ledgerJSON) line() string {
	switch {
	case !j.Looked:
		return "not looked at (-ledger DSN reads the service's ledger)"
	case !j.Found:
		return fmt.Sprintf("no outcome of the key in %s", j.Table)
	}
	what := "a result"
	if j.Failed {
		what = "a permanent failure"
	}
	age := time.Duration(j.AgeSeconds * float64(time.Second)).Round(time.Second)
	return fmt.Sprintf("holds %s (%d B) of attempt %d in %s, recorded %s (%v ago)",
		what, j.ValueBytes, j.Attempt, j.Table, j.RecordedAt.Format(time.RFC3339Nano), age)
}

// nextCall says what the next call with the key does, given its record's
// state in Redis (after forget: absent), whether a tombstone of it is left,
// and what the ledger holds.
func nextCall(st idem.Status, tomb bool, lj ledgerJSON) string {
	switch st.State {
	case idem.StateDone, idem.StateFailed:
		return "the next call replays the stored outcome"
	case idem.StateReleased:
		return fmt.Sprintf("the next call runs attempt %d", st.Attempt+1)
	case idem.StateParked:
		if st.Step == "" {
			return "every call gets idem.ErrParked (HTTP 409) without running the operation, and Recover leaves it, until idemctl retry KEY runs it again (or forget deletes it)"
		}
		return fmt.Sprintf("every call gets idem.ErrUnknownOutcome (HTTP 409) until an operator settles step %q with idem.Resolve or ResolveNotApplied; then the next call runs attempt %d", st.Step, st.Attempt+1)
	case idem.StateInProgress:
		if time.Until(st.LeaseEnds) > 0 {
			return "calls wait for the owner's outcome"
		}
		if lj.Found {
			return fmt.Sprintf("the next call takes over as attempt %d, finds the ledger's outcome and returns it without running the operation", st.Attempt+1)
		}
		return fmt.Sprintf("the next call takes over as attempt %d", st.Attempt+1)
	}
	var s string
	switch {
	case tomb && lj.Found:
		s = "a tombstone is left: the next call looks the key up in the ledger and returns its outcome, without running the operation"
	case tomb:
		s = "a tombstone is left (the retention ended): the next call is refused with idem.ErrLateRetry (HTTP 410) and the operation does not run"
	case lj.Found:
		s = "the next call runs the operation as attempt 1, but its ledger commit meets the row, rolls its transaction back and returns the recorded outcome " +
			"(with idem.WithLedgerLookups(true) the operation does not run at all); effects outside that transaction run again"
	default:
		s = "the next call runs the operation as attempt 1"
	}
	if !lj.Looked {
		s += " (or gets the ledger's outcome, if the service's ledger holds one: -ledger DSN tells)"
	}
	return s
}
