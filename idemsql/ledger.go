// ledger.go: the Ledger, its options, and its reads.

package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Ledger keeps the outcomes of idem calls in one table of a SQL database,
// the one that holds their business changes. It implements idem.Ledger:
// give it to idem.New with idem.WithLedger, and record outcomes from fn
// with Commit. It is safe for concurrent use.
type Ledger struct {
	db      *sql.DB
	dialect *dialect
	table   string
	sql     statements

	mu sync.Mutex // guards id
	id []byte     // the database's marker, once read; nil before
}

// An Option configures a Ledger. Pass options to New.
type Option func(*config)

type config struct {
	table    string
	problems []string
}

// WithTable sets the name of the ledger's table. Migrate also creates a
// second table, <name>_meta, and an index, <name>_recorded_at. The name
// must be a plain SQL identifier of at most 48 characters (letters, digits
// and underscores, not starting with a digit), unquoted and without a
// schema: set the connection's search_path to use another schema.
// The default is "idem_ledger".
func WithTable(name string) Option {
	return func(c *config) {
		if !identifier.MatchString(name) {
			c.problems = append(c.problems, fmt.Sprintf("WithTable(%q): must be letters, digits and underscores, not starting with a digit, at most 48 characters", name))
			return
		}
		c.table = name
	}
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)

// New returns the ledger kept in db, in the SQL of d. It does not touch
// the database: call Migrate once (at start-up) to create its tables.
// New panics if db is nil, d is the zero Dialect or an option is invalid,
// as those are programming errors.
func New(db *sql.DB, d Dialect, opts ...Option) *Ledger {
	cfg := config{table: "idem_ledger"}
	for _, o := range opts {
		o(&cfg)
	}
	if db == nil {
		cfg.problems = append(cfg.problems, "db is nil")
	}
	if d.d == nil {
		cfg.problems = append(cfg.problems, "the zero Dialect (use idemsql.Postgres, idemsql.SQLite or idemsql.MySQL)")
	}
	if len(cfg.problems) > 0 {
		panic("idemsql: New: " + strings.Join(cfg.problems, "; "))
	}
	return &Ledger{db: db, dialect: d.d, table: cfg.table, sql: d.d.statements(cfg.table)}
}

// Table returns the name of the ledger's table.
func (l *Ledger) Table() string { return l.table }

// row is one recorded outcome, as the table holds it.
type row struct {
	key         string
	fingerprint string
	attempt     int64
	failed      bool
	outcome     []byte
	age         time.Duration // by the database's clock, when read
}

// querier is what reads take: the ledger's db, or the user's tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// lookup reads key's row from the ledger's database.
func (l *Ledger) lookup(ctx context.Context, key string) (row, bool, error) {
	return l.lookupIn(ctx, l.db, l.sql.lookup, key)
}

// lookupIn reads key's row through q, with query (a lookup statement).
func (l *Ledger) lookupIn(ctx context.Context, q querier, query, key string) (row, bool, error) {
	r := row{key: key}
	var fp []byte
	var micros int64
	err := q.QueryRowContext(ctx, query, []byte(key)).Scan(&fp, &r.attempt, &r.failed, &r.outcome, &micros)
	if errors.Is(err, sql.ErrNoRows) {
		return row{}, false, nil
	}
	if err != nil {
		return row{}, false, l.explain("look up a key", err)
	}
	r.fingerprint = string(fp)
	r.age = max(time.Duration(micros)*time.Microsecond, 0) // clocks step back
	if r.outcome == nil {
		r.outcome = []byte{}
	}
	return r, true, nil
}

// databaseID returns the marker of the ledger's database, which Migrate
// wrote; it is read once, from the ledger's db, and kept. Inside fn (inTx),
// a pool with no connection free at once (a pool of one, held by fn's
// transaction) is not waited for: the read fails at once, naming the fix.
// It cannot be read through fn's transaction instead: that would take the
// id of whatever database the transaction is of, and the check that it is
// the ledger's would pass whatever it is.
func (l *Ledger) databaseID(ctx context.Context, inTx bool) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id != nil {
		return l.id, nil
	}
	if inTx && !l.poolHasRoom() {
		return nil, fmt.Errorf("idemsql: the ledger has not read its database's id yet, and fn's transaction holds the pool's only free connection: call Migrate once at start-up, in every process (it reads the id), before the first Commit")
	}
	q := l.db
	var id []byte
	err := q.QueryRowContext(ctx, l.sql.selectMeta).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) || (err != nil && l.dialect.missing(err)) {
		return nil, fmt.Errorf("idemsql: the ledger's database has no %s_meta table or row: call Migrate first", l.table)
	}
	if err != nil {
		return nil, l.explain("read the database's id", err)
	}
	l.id = id
	return id, nil
}

// explain wraps an error of the database with what was being done, and
// with the fix for the errors whose fix is known.
func (l *Ledger) explain(doing string, err error) error {
	if l.dialect.missing(err) {
		return fmt.Errorf("idemsql: %s: the table %s is missing (call Migrate first): %w", doing, l.table, err)
	}
	if fix := l.dialect.hint(err); fix != "" {
		return fmt.Errorf("idemsql: %s: %s: %w", doing, fix, err)
	}
	return fmt.Errorf("idemsql: %s: %w", doing, err)
}
