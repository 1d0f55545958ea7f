// ledger.go: the Ledger, its options, and its reads.

package idempgx

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Ledger keeps the outcomes of idem calls in one table of a PostgreSQL
// database, the one that holds their business changes, through a pgx pool.
// It implements idem.Ledger: give it to idem.New with idem.WithLedger, and
// record outcomes from fn with Commit. It is safe for concurrent use.
type Ledger struct {
	pool  *pgxpool.Pool
	table string
	sql   statements

	mu sync.Mutex // guards id
	id []byte     // the database's marker, once read; nil before
}

var _ idem.Ledger = (*Ledger)(nil)

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
// schema: set the connection's search_path to use another schema. It is
// the same table as idemsql.WithTable's of the same name.
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

// New returns the ledger kept in pool's database. It does not touch the
// database: call Migrate once at start-up, in every process, to create its
// tables and read what Commit needs. New panics if pool is nil or an
// option is invalid, as those are programming errors.
func New(pool *pgxpool.Pool, opts ...Option) *Ledger {
	cfg := config{table: "idem_ledger"}
	for _, o := range opts {
		o(&cfg)
	}
	if pool == nil {
		cfg.problems = append(cfg.problems, "pool is nil")
	}
	if len(cfg.problems) > 0 {
		panic("idempgx: New: " + strings.Join(cfg.problems, "; "))
	}
	return &Ledger{pool: pool, table: cfg.table, sql: newStatements(cfg.table)}
}

// Table returns the name of the ledger's table.
func (l *Ledger) Table() string { return l.table }

// MaxKeyLen returns 2048, the longest key in bytes that the ledger's table
// can index: the Client refuses a longer key before fn runs (see
// idem.Ledger).
func (l *Ledger) MaxKeyLen() int { return maxKeyLen }

// Lookup returns the outcome recorded for key, and false when none is,
// read from the ledger's pool. The Client calls it (see idem.WithLedger).
// The entry's Age is computed by the database's clock.
func (l *Ledger) Lookup(ctx context.Context, key string) (idem.Entry, bool, error) {
	e, ok, err := scanEntry(key, l.pool.QueryRow(ctx, l.sql.lookup, []byte(key)))
	if err != nil {
		return idem.Entry{}, false, l.explain("look up a key", err)
	}
	return e, ok, nil
}

// scanEntry reads the row of key that r holds: the columns of lookup.
func scanEntry(key string, r pgx.Row) (idem.Entry, bool, error) {
	e := idem.Entry{Key: key}
	var fp []byte
	var micros int64
	err := r.Scan(&fp, &e.Attempt, &e.Failed, &e.Value, &micros)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Entry{}, false, nil
	}
	if err != nil {
		return idem.Entry{}, false, err
	}
	e.FingerprintDigest = string(fp)
	e.Age = max(time.Duration(micros)*time.Microsecond, 0) // clocks step back
	if e.Value == nil {
		e.Value = []byte{}
	}
	return e, true, nil
}

// databaseID returns the marker of the ledger's database, which Migrate
// wrote; it is read once and kept. Inside fn, it is read through tx when
// tx's connection is to the ledger's database (the pool's host, port and
// database), else from the pool when a connection is free at once; a pool
// whose every connection is taken (a pool of one, held by fn's
// transaction) is not waited for: the read fails at once, naming the fix.
// It is never read through a tx of another database: the check that tx is
// of the ledger's database would then pass whatever it is.
func (l *Ledger) databaseID(ctx context.Context, tx pgx.Tx) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id != nil {
		return l.id, nil
	}
	var q interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
	switch {
	case tx == nil:
		q = l.pool
	case sameDatabase(tx.Conn().Config(), l.pool.Config().ConnConfig):
		q = tx
	case l.poolHasRoom():
		q = l.pool
	default:
		return nil, errors.New("idempgx: the ledger has not read its database's id yet, tx is not of the pool's host and database, and every connection of the pool is taken: call Migrate once at start-up, in every process (it reads the id), before the first Commit")
	}
	var id []byte
	err := q.QueryRow(ctx, l.sql.selectMeta).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) || missing(err) {
		return nil, fmt.Errorf("idempgx: the ledger's database has no %s_meta table or row: call Migrate first", l.table)
	}
	if err != nil {
		return nil, l.explain("read the database's id", err)
	}
	l.id = id
	return id, nil
}

// sameDatabase reports whether two connections' configs name one database
// of one server.
func sameDatabase(a, b *pgx.ConnConfig) bool {
	return a.Host == b.Host && a.Port == b.Port && a.Database == b.Database
}

// poolHasRoom reports whether the pool can give a connection without
// waiting for one in use.
func (l *Ledger) poolHasRoom() bool {
	st := l.pool.Stat()
	return st.IdleConns() > 0 || st.TotalConns() < st.MaxConns()
}

// explain wraps an error of the database with what was being done, and
// with the fix for the errors whose fix is known.
func (l *Ledger) explain(doing string, err error) error {
	if missing(err) {
		return fmt.Errorf("idempgx: %s: the table %s or %s_meta is missing (call Migrate first): %w", doing, l.table, l.table, err)
	}
	return fmt.Errorf("idempgx: %s: %w", doing, err)
}
