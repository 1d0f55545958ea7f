// relay.go: Relay, which moves committed outbox rows to their Redis
// Streams, in batches, and deletes them.

package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/idemsql"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// A RelayOption configures Relay. The options are idemsql's, so one set
// configures a relay of either driver.
type RelayOption = idemsql.RelayOption

// RelayStats are a relay's counts since it started: idemsql's.
type RelayStats = idemsql.RelayStats

// WithRelayBatch sets how many rows one batch moves at most: one SELECT,
// one pipeline of XADDs, one DELETE, one transaction. n is from 1 to
// 10,000. The default is 100. It is idemsql.WithRelayBatch.
func WithRelayBatch(n int) RelayOption { return idemsql.WithRelayBatch(n) }

// WithRelayPoll sets how long Relay waits after a batch that was not full
// before it looks again, and the first wait after a failure (later ones
// double, up to WithRelayBackoff's). d must be positive. The default is
// one second. It is idemsql.WithRelayPoll.
func WithRelayPoll(d time.Duration) RelayOption { return idemsql.WithRelayPoll(d) }

// WithRelayBackoff sets the longest wait between two batches that failed
// (Redis or the database down). d must be positive. The default is 10
// seconds, or the poll interval if that is longer. It is
// idemsql.WithRelayBackoff.
func WithRelayBackoff(d time.Duration) RelayOption { return idemsql.WithRelayBackoff(d) }

// WithRelayObserver has Relay call f after every batch, from Relay's
// goroutine, with its counts so far: f must not block. The default is
// none. It is idemsql.WithRelayObserver.
func WithRelayObserver(f func(RelayStats)) RelayOption { return idemsql.WithRelayObserver(f) }

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
// Several relays share the work, through idempgx or idemsql (the rows are
// the same): a batch claims its rows with FOR UPDATE SKIP LOCKED, so two
// relays never hold one row. Each stream's entries follow the rows' order
// (the outbox's identity seq) within a batch, and across batches of one
// relay; with several relays, batches run side by side and a stream's
// order is not kept across them. See the package doc, "Outbox and event
// order".
func (l *Ledger) Relay(ctx context.Context, rdb redis.UniversalClient, opts ...RelayOption) error {
	batch := func(ctx context.Context, n int) (int, bool, error) {
		moved, err := l.relayBatch(ctx, rdb, fmt.Sprintf(l.sql.claim, n))
		var fatal *relayFatal
		if errors.As(err, &fatal) {
			return 0, true, fatal.err
		}
		return moved, false, err
	}
	return idemsql.RunRelay(ctx, "idempgx: Relay", rdb, batch, l.lag, opts...)
}

// relayFatal is an error that another batch would meet again.
type relayFatal struct{ err error }

func (e *relayFatal) Error() string { return e.err.Error() }

// relayBatch moves one batch and returns how many rows it moved.
func (l *Ledger) relayBatch(ctx context.Context, rdb redis.UniversalClient, claim string) (int, error) {
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return 0, l.explainTable("relay", "_outbox", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, claim)
	if err != nil {
		if missing(err) {
			return 0, &relayFatal{fmt.Errorf("idempgx: relay: the table %s_outbox is missing (call Migrate first): %w", l.table, err)}
		}
		return 0, l.explainTable("relay", "_outbox", err)
	}
	var seqs []int64
	pipe := rdb.Pipeline()
	var seq int64
	var id, stream, fields []byte
	_, err = pgx.ForEachRow(rows, []any{&seq, &id, &stream, &fields}, func() error {
		values, err := idemsql.DecodeFields(fields)
		if err != nil {
			return &relayFatal{fmt.Errorf("idempgx: relay: the row of seq %d in %s_outbox: %w", seq, l.table, err)}
		}
		seqs = append(seqs, seq)
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: string(stream), Values: append(values, EventIDField, string(id))})
		return nil
	})
	if err != nil {
		var fatal *relayFatal
		if errors.As(err, &fatal) {
			return 0, err
		}
		if missing(err) {
			return 0, &relayFatal{fmt.Errorf("idempgx: relay: the table %s_outbox is missing (call Migrate first): %w", l.table, err)}
		}
		return 0, l.explainTable("relay", "_outbox", err)
	}
	if len(seqs) == 0 {
		return 0, tx.Commit(ctx)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("idempgx: relay: XADD: %w", err)
	}
	if _, err := tx.Exec(ctx, l.sql.deleteEvents, seqs); err != nil {
		return 0, l.explainTable("relay", "_outbox", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, l.explainTable("relay", "_outbox", err)
	}
	return len(seqs), nil
}

// lag returns the age of the outbox's oldest row, or 0.
func (l *Ledger) lag(ctx context.Context) time.Duration {
	var micros int64
	if err := l.pool.QueryRow(ctx, l.sql.lag).Scan(&micros); err != nil {
		return 0
	}
	return max(time.Duration(micros)*time.Microsecond, 0)
}
