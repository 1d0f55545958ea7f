package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// An event is one business event: credit Amount to Account. ID is the
// event's stable business id, the same in every stream entry that carries
// it (a producer that retries an XADD whose reply it lost sends the event
// twice): it is the idempotency key.
type event struct {
	ID      string
	Account string
	Amount  int64
}

// values returns the event as the fields of a stream entry.
func (e event) values() []any {
	return []any{"id", e.ID, "account", e.Account, "amount", e.Amount}
}

// parseEvent reads an event from the fields of a stream entry.
func parseEvent(v map[string]any) (event, error) {
	id, _ := v["id"].(string)
	account, _ := v["account"].(string)
	amount, err := strconv.ParseInt(fmt.Sprint(v["amount"]), 10, 64)
	if id == "" || account == "" || err != nil {
		return event{}, fmt.Errorf("malformed event %v", v)
	}
	return event{ID: id, Account: account, Amount: amount}, nil
}

// Applied is the outcome of applying an event. idem.Do stores it (its
// fields are exported for msgpack) and returns it to every later delivery
// of the event.
type Applied struct {
	// Event is the event's id.
	Event string
	// Attempt is the idem attempt that applied the event, or found it
	// applied.
	Attempt int64
	// Reconciled is true when the attempt found the event already applied
	// by an earlier attempt that died before idem recorded its outcome.
	Reconciled bool
}

// A stream names a consumer group's stream and says how its consumers read
// it.
type stream struct {
	key   string        // the stream's key
	group string        // the consumer group
	batch int64         // entries read at once
	block time.Duration // how long a read waits for new entries; short, so a consumer notices its end soon
	// minIdle is how long an entry stays with the consumer that received it,
	// unacknowledged, before another consumer takes it over (XAUTOCLAIM).
	// It need not outlast the slowest handler: a live owner's claim makes
	// the other consumer wait for its outcome, not apply the event again.
	minIdle time.Duration
}

// stats counts what the consumers of one run did. It is safe for concurrent
// use.
type stats struct {
	reclaimed  atomic.Int64 // entries taken over from another consumer (XAUTOCLAIM)
	reconciled atomic.Int64 // attempts that found their event applied by an earlier one
	rejected   atomic.Int64 // entries acknowledged without applying: malformed, conflicting or failed for good
}

// A consumer is one member of the consumer group: one process in
// production.
type consumer struct {
	name   string
	rdb    *redis.Client // its own connection, as a process of its own would have
	keys   *idem.Client  // nil for the plain handler, which applies without idem.Do
	ledger *ledger
	s      stream
	stats  *stats
	// hook, if not nil, runs just before the ledger applies an event and
	// just after (after true); an error it returns ends the handler with
	// that error. The demo and the tests stop consumers in it.
	hook   func(ctx context.Context, ev event, after bool) error
	cursor string // where the next XAUTOCLAIM starts; "" for the stream's start
}

// run consumes entries until ctx ends, and then returns nil. It returns an
// error when the consumer cannot go on (Redis failed it).
func (c *consumer) run(ctx context.Context) error {
	for ctx.Err() == nil {
		msgs, err := c.read(ctx)
		if err == nil {
			for _, m := range msgs {
				if err = c.handle(ctx, m); err != nil {
					break
				}
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("consumer %s: %w", c.name, err)
		}
	}
	return nil
}

// read returns the next entries to handle: first those that a consumer
// received and left unacknowledged for minIdle (its process died, or it
// hangs), then new ones.
func (c *consumer) read(ctx context.Context) ([]redis.XMessage, error) {
	if c.cursor == "" {
		c.cursor = "0-0"
	}
	msgs, next, err := c.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream:   c.s.key,
		Group:    c.s.group,
		Consumer: c.name,
		MinIdle:  c.s.minIdle,
		Start:    c.cursor,
		Count:    c.s.batch,
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("XAUTOCLAIM: %w", err)
	}
	c.cursor = next
	if len(msgs) > 0 {
		c.stats.reclaimed.Add(int64(len(msgs)))
		return msgs, nil
	}
	res, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group:    c.s.group,
		Consumer: c.name,
		Streams:  []string{c.s.key, ">"},
		Count:    c.s.batch,
		Block:    c.s.block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil // nothing new within the block time
	}
	if err != nil {
		return nil, fmt.Errorf("XREADGROUP: %w", err)
	}
	return res[0].Messages, nil
}

// handle applies one entry's event through idem.Do, and acknowledges the
// entry only after Do returned a final outcome: the event applied, now or
// by an earlier delivery (a replay), or refused for good. Otherwise the
// entry stays pending, and XAUTOCLAIM hands it to a consumer again after
// minIdle.
func (c *consumer) handle(ctx context.Context, m redis.XMessage) error {
	ev, err := parseEvent(m.Values)
	if err != nil {
		// It can never be applied: acknowledge it, or it comes back for
		// ever. (A real consumer would copy it to a dead-letter stream.)
		c.stats.rejected.Add(1)
		return c.ack(ctx, m.ID)
	}
	if c.keys == nil {
		return c.handlePlain(ctx, m.ID, ev)
	}
	_, err = idem.Do(ctx, c.keys, ev.ID, idem.Fingerprint(ev.Account, ev.Amount),
		func(ctx context.Context) (Applied, error) { return c.apply(ctx, ev) })
	switch {
	case err == nil:
	case errors.Is(err, idem.ErrConflict), idem.IsPermanent(err):
		// The producer reused the event's id for other data, or the event
		// failed for good: no redelivery changes that.
		c.stats.rejected.Add(1)
	default:
		// Not applied (Redis or the ledger failed), applied but not
		// recorded (ErrNotRecorded, ErrLeaseLost), or still running in
		// another consumer (ErrInProgress): leave it pending.
		return nil
	}
	return c.ack(ctx, m.ID)
}

// apply is the side effect that idem.Do runs, for one event at most one
// attempt at a time.
func (c *consumer) apply(ctx context.Context, ev event) (Applied, error) {
	a, _ := idem.AttemptFrom(ctx)
	if a.Number > 1 {
		// An earlier attempt ended without a recorded outcome (its
		// consumer died, or failed): it may have applied the event. Look
		// it up first, and fence that attempt off.
		done, err := c.ledger.reconcile(ctx, ev.ID, a.Number)
		if err != nil {
			return Applied{}, err
		}
		if done {
			c.stats.reconciled.Add(1)
			return Applied{Event: ev.ID, Attempt: a.Number, Reconciled: true}, nil
		}
	}
	if err := c.applyLedger(ctx, ev, a.Number); err != nil {
		return Applied{}, err
	}
	return Applied{Event: ev.ID, Attempt: a.Number}, nil
}

// handlePlain is the handler without idem, for comparison: apply, then
// acknowledge. A redelivered entry, or a second entry of the same event, is
// applied again.
func (c *consumer) handlePlain(ctx context.Context, id string, ev event) error {
	if err := c.applyLedger(ctx, ev, 0); err != nil {
		return err
	}
	return c.ack(ctx, id)
}

// applyLedger applies ev to the ledger as attempt n, between the calls of
// the hook.
func (c *consumer) applyLedger(ctx context.Context, ev event, n int64) error {
	if c.hook != nil {
		if err := c.hook(ctx, ev, false); err != nil {
			return err
		}
	}
	if err := c.ledger.apply(ctx, ev, n); err != nil {
		return err
	}
	if c.hook != nil {
		return c.hook(ctx, ev, true)
	}
	return nil
}

// ack acknowledges the entry id.
func (c *consumer) ack(ctx context.Context, id string) error {
	if err := c.rdb.XAck(ctx, c.s.key, c.s.group, id).Err(); err != nil {
		return fmt.Errorf("XACK %s: %w", id, err)
	}
	return nil
}
