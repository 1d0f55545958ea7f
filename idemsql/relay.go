// relay.go: Relay, which moves committed outbox rows to their Redis
// Streams, in batches, and deletes them.

package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A RelayOption configures Relay.
type RelayOption func(*relayConfig)

type relayConfig struct {
	batch    int
	poll     time.Duration
	backoff  time.Duration // the longest wait after failures
	observe  func(RelayStats)
	problems []string
}

// WithRelayBatch sets how many rows one batch moves at most: one SELECT,
// one pipeline of XADDs, one DELETE, one transaction. n is from 1 to
// 10,000. The default is 100.
func WithRelayBatch(n int) RelayOption {
	return func(c *relayConfig) {
		if n < 1 || n > 10_000 {
			c.problems = append(c.problems, fmt.Sprintf("WithRelayBatch(%d): must be from 1 to 10000", n))
			return
		}
		c.batch = n
	}
}

// WithRelayPoll sets how long Relay waits after a batch that was not full
// before it looks again, and the first wait after a failure (later ones
// double, up to WithRelayBackoff's). d must be positive. The default is
// one second.
func WithRelayPoll(d time.Duration) RelayOption {
	return func(c *relayConfig) {
		if d <= 0 {
			c.problems = append(c.problems, fmt.Sprintf("WithRelayPoll(%v): must be positive", d))
			return
		}
		c.poll = d
	}
}

// WithRelayBackoff sets the longest wait between two batches that failed
// (Redis or the database down). d must be positive. The default is 10
// seconds, or the poll interval if that is longer.
func WithRelayBackoff(d time.Duration) RelayOption {
	return func(c *relayConfig) {
		if d <= 0 {
			c.problems = append(c.problems, fmt.Sprintf("WithRelayBackoff(%v): must be positive", d))
			return
		}
		c.backoff = d
	}
}

// WithRelayObserver has Relay call f after every batch, from Relay's
// goroutine, with its counts so far: f must not block. The default is
// none.
func WithRelayObserver(f func(RelayStats)) RelayOption {
	return func(c *relayConfig) { c.observe = f }
}

// RelayStats are a relay's counts since it started.
type RelayStats struct {
	// Published is how many rows it added to their streams and deleted.
	Published int64
	// Failures is how many batches failed (and will be tried again).
	Failures int64
	// Lag is the age of the oldest row left in the outbox after the last
	// batch, by the database's clock; 0 when it is empty or unknown.
	Lag time.Duration
	// Err is the last batch's error, or nil.
	Err error
}

// Relay moves the outbox's committed rows to their Redis Streams until ctx
// ends, and then returns ctx's error. Each batch (WithRelayBatch) claims
// the oldest rows in a transaction, adds each to its stream with XADD (the
// fields, and EventIDField set to the row's id), in one pipeline, in the
// order of the rows, and deletes them; when a batch was full, the next one
// starts at once, else after the poll interval (WithRelayPoll).
//
// Delivery is at least once: a relay that stops between its XADDs and its
// COMMIT (killed, Redis or the database gone mid-batch) leaves its rows in
// the outbox, and the next batch adds them again with the same ids. A
// batch that fails is retried after a backoff that doubles up to
// WithRelayBackoff; no row is deleted before its XADD succeeded. Relay
// returns early only when the outbox table is missing (call Migrate) or a
// row cannot be read.
//
// On PostgreSQL and MySQL, several relays share the work: a batch claims
// its rows with FOR UPDATE SKIP LOCKED, so two relays never hold one row.
// Each stream's entries follow the rows' order (the outbox's
// autoincrement seq) within a batch, and across batches of one relay;
// with several relays, batches run side by side and a stream's order is
// not kept across them. SQLite has one writer: run one relay (a second
// waits for the first's batches, or fails with "database is locked" and
// backs off). See the package doc, "Outbox and event order".
func (l *Ledger) Relay(ctx context.Context, rdb redis.UniversalClient, opts ...RelayOption) error {
	st := l.outboxStatements()
	batch := func(ctx context.Context, n int) (int, bool, error) {
		moved, err := l.relayBatch(ctx, rdb, fmt.Sprintf(st.claim, n))
		var fatal *relayFatal
		if errors.As(err, &fatal) {
			return 0, true, fatal.err
		}
		return moved, false, err
	}
	lag := func(ctx context.Context) time.Duration { return l.lag(ctx, st.lag) }
	return RunRelay(ctx, "idemsql: Relay", rdb, batch, lag, opts...)
}

// A RelayBatch moves one batch of at most n outbox rows to their streams,
// and returns how many it moved, or an error; with fatal true, the error
// is one that another batch would meet again.
type RelayBatch func(ctx context.Context, n int) (moved int, fatal bool, err error)

// RunRelay is Relay's loop, for drivers of their own: idempgx's Relay is
// RunRelay over pgx. It applies opts and checks them (and that rdb is not
// nil, the client batch uses), then calls batch until ctx ends, waits and
// backs off as Relay describes, and calls the observer with lag's age of
// the oldest row. It returns ctx's error, the error of a fatal batch, or
// the options' problems prefixed with name ("idempgx: Relay").
func RunRelay(ctx context.Context, name string, rdb redis.UniversalClient, batch RelayBatch, lag func(context.Context) time.Duration, opts ...RelayOption) error {
	cfg := relayConfig{batch: 100, poll: time.Second, backoff: 10 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if rdb == nil {
		cfg.problems = append(cfg.problems, "rdb is nil")
	}
	if len(cfg.problems) > 0 {
		return fmt.Errorf("%s: %s", name, strings.Join(cfg.problems, "; "))
	}
	cfg.backoff = max(cfg.backoff, cfg.poll)
	var stats RelayStats
	wait := cfg.poll
	for {
		n, fatal, err := batch(ctx, cfg.batch)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		stats.Err = err
		if err != nil {
			if fatal {
				return err
			}
			stats.Failures++
		} else {
			stats.Published += int64(n)
		}
		if cfg.observe != nil {
			stats.Lag = lag(ctx)
			cfg.observe(stats)
		}
		switch {
		case err != nil:
			wait = max(wait, cfg.poll) // then doubling, below
		case n == cfg.batch:
			wait = 0
		default:
			wait = cfg.poll
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		if err != nil {
			wait = min(2*wait, cfg.backoff)
		}
	}
}

// relayFatal is an error that another batch would meet again.
type relayFatal struct{ err error }

func (e *relayFatal) Error() string { return e.err.Error() }

// relayBatch moves one batch and returns how many rows it moved.
func (l *Ledger) relayBatch(ctx context.Context, rdb redis.UniversalClient, claim string) (int, error) {
	var opts *sql.TxOptions
	if l.dialect.name == "mysql" {
		// No gap locks: under REPEATABLE READ, the claim's locking read
		// locks the gap past the last row, and publishers' INSERTs into it
		// wait or deadlock.
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := l.db.BeginTx(ctx, opts)
	if err != nil {
		return 0, l.explain("relay", err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, claim)
	if err != nil {
		if l.dialect.missing(err) {
			return 0, &relayFatal{fmt.Errorf("idemsql: relay: the table %s_outbox is missing (call Migrate first): %w", l.table, err)}
		}
		return 0, l.explain("relay", err)
	}
	var seqs []any
	pipe := rdb.Pipeline()
	for rows.Next() {
		var seq int64
		var id, stream, fields []byte
		if err := rows.Scan(&seq, &id, &stream, &fields); err != nil {
			rows.Close()
			return 0, l.explain("relay", err)
		}
		values, err := DecodeFields(fields)
		if err != nil {
			rows.Close()
			return 0, &relayFatal{fmt.Errorf("idemsql: relay: the row of seq %d in %s_outbox: %w", seq, l.table, err)}
		}
		seqs = append(seqs, seq)
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: string(stream), Values: append(values, EventIDField, string(id))})
	}
	if err := rows.Err(); err != nil {
		return 0, l.explain("relay", err)
	}
	if len(seqs) == 0 {
		return 0, tx.Commit()
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("idemsql: relay: XADD: %w", err)
	}
	if err := l.deleteRows(ctx, tx, seqs); err != nil {
		return 0, l.explain("relay", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, l.explain("relay", err)
	}
	return len(seqs), nil
}

// deleteRows deletes the rows of seqs in tx: in one statement, or on
// MySQL one row per statement. InnoDB may scan a DELETE ... IN by range
// (a full scan of a small table), and waits for the lock of every row it
// scans, the other relays' rows among them: two relays then deadlock, and
// a batch rolled back after its XADDs publishes its rows twice.
func (l *Ledger) deleteRows(ctx context.Context, tx *sql.Tx, seqs []any) error {
	if l.dialect.name != "mysql" {
		_, err := tx.ExecContext(ctx, l.deleteStatement(len(seqs)), seqs...)
		return err
	}
	stmt, err := tx.PrepareContext(ctx, l.deleteStatement(1))
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, seq := range seqs {
		if _, err := stmt.ExecContext(ctx, seq); err != nil {
			return err
		}
	}
	return nil
}

// lag returns the age of the outbox's oldest row, or 0.
func (l *Ledger) lag(ctx context.Context, query string) time.Duration {
	var micros int64
	if err := l.db.QueryRowContext(ctx, query).Scan(&micros); err != nil {
		return 0
	}
	return max(time.Duration(micros)*time.Microsecond, 0)
}
