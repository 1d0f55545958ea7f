// options.go: the Options of New, their defaults and their validation.

package idemstream

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
	"github.com/redis/go-redis/v9"
)

// An Option configures a Consumer. Pass options to New.
type Option func(*config)

type config struct {
	key           func(redis.XMessage) string
	fingerprint   func(redis.XMessage) string
	scope         *string // nil: the stream's and the group's names
	maxDeliveries int64
	deadLetter    string // "" : <stream>:dead
	claimIdle     time.Duration
	workers       int
	batch         int
	block         time.Duration
	backoffMin    time.Duration
	backoffMax    time.Duration
	drain         time.Duration
	handlerTime   time.Duration // 0: none
	onDeadLetter  func(context.Context, DeadLetter)
	logger        *slog.Logger
	problems      []string
}

func defaultConfig(keys *idem.Client) config {
	lease := 30 * time.Second
	if keys != nil {
		lease = keys.Lease()
	}
	return config{
		key:           nil, // the entry's ID, set in New
		fingerprint:   defaultFingerprint,
		maxDeliveries: 10,
		claimIdle:     2 * lease,
		workers:       1,
		batch:         16,
		block:         time.Second,
		backoffMin:    time.Second,
		backoffMax:    time.Minute,
		drain:         lease,
		handlerTime:   10 * lease,
		logger:        door.Logger(),
	}
}

func (c *config) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// WithKey sets how an entry's idempotency key is found: typically a field
// that the producer sets to the event's stable business id, so that an
// event the producer sent twice (in two entries) is handled once. An
// entry for which key returns "" is dead-lettered (ErrNoKey). The key
// given to Do is door.Key(scope, key's result), the scheme every door
// shares (see WithScope).
// The default is the entry's EventIDField when it has one (a string, as
// the outbox relays of idemsql and idempgx write it: an event published
// once and relayed twice is handled once), and else the entry's ID:
// redeliveries of one entry are handled once, but an event sent twice is
// handled twice.
func WithKey(key func(redis.XMessage) string) Option {
	return func(c *config) {
		if key == nil {
			c.problem("WithKey(nil)")
			return
		}
		c.key = key
	}
}

// WithFingerprint sets how an entry's fingerprint is computed: a key seen
// before with another fingerprint is a conflict (idem.ErrConflict), and
// the entry is dead-lettered without running the handler. Fingerprint
// what makes the event (not a send time that a producer's retry changes),
// or return "" to skip the check.
// The default is idem.Fingerprint of the entry's fields, independent of
// their order.
func WithFingerprint(fingerprint func(redis.XMessage) string) Option {
	return func(c *config) {
		if fingerprint == nil {
			c.problem("WithFingerprint(nil)")
			return
		}
		c.fingerprint = fingerprint
	}
}

// WithScope sets the scope of every key the Consumer gives to Do, which
// is door.Key(scope, key), so that keys of one stream and group never
// meet another's in the same idem.Client. Pass "" to share keys with the
// other doors used without a scope: an entry with key order-1 and a POST
// through httpidem with Idempotency-Key order-1 (no httpidem.WithScope)
// name one record, door.Key("", "order-1"); or pass one scope to several
// groups that must not repeat each other's work.
// The default is the stream's and the group's names, each followed by
// '/' (with '/' and '\' in them escaped by '\'): "orders/billing/". New
// panics if the scope leaves no room for a key within the Client's
// idem.WithMaxKeyLen.
func WithScope(scope string) Option {
	return func(c *config) { c.scope = &scope }
}

// WithMaxDeliveries sets how often an entry is delivered before it is
// dead-lettered: after a transient failure of its n-th delivery, and
// before its handler runs once more when its consumers died or hung
// holding it n times. Redeliveries after errors that are not the
// handler's (the key in progress elsewhere, Redis unreachable) are not
// counted. It must be at least 1.
// The default is 10.
func WithMaxDeliveries(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.problem("WithMaxDeliveries(%d): must be at least 1", n)
			return
		}
		c.maxDeliveries = int64(n)
	}
}

// WithDeadLetter sets the stream that dead-lettered entries are copied to
// (XADD), with their fields and the Field* fields that say where they
// come from and why.
// The default is the consumer's stream followed by ":dead".
func WithDeadLetter(stream string) Option {
	return func(c *config) {
		if stream == "" {
			c.problem("WithDeadLetter(\"\"): needs a stream")
			return
		}
		c.deadLetter = stream
	}
}

// WithClaimIdle sets how long an entry stays with a consumer that neither
// acknowledged it nor showed it is still working on it (a consumer renews
// its entries every quarter of this time while it holds them) before
// another consumer takes it over (XAUTOCLAIM). Above the Client's lease,
// the taker finds the dead consumer's claim ended and runs the handler at
// once; below it, it waits for the claim. It must be at least 10ms.
// The default is twice the Client's lease (idem.WithLease).
func WithClaimIdle(d time.Duration) Option {
	return func(c *config) {
		if d < 10*time.Millisecond {
			c.problem("WithClaimIdle(%v): must be at least 10ms", d)
			return
		}
		c.claimIdle = d
	}
}

// WithWorkers sets how many entries are handled at once. With one, entries
// are handled in the stream's order (an entry being retried holds back
// the ones after it), except for entries taken over from other consumers.
// It must be at least 1.
// The default is 1.
func WithWorkers(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.problem("WithWorkers(%d): must be at least 1", n)
			return
		}
		c.workers = n
	}
}

// WithBatch sets how many entries one read (XREADGROUP, XAUTOCLAIM) asks
// for. Entries read wait for a free worker, held by the consumer. It must
// be at least 1.
// The default is 16.
func WithBatch(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.problem("WithBatch(%d): must be at least 1", n)
			return
		}
		c.batch = n
	}
}

// WithBlock sets how long a read waits for new entries (XREADGROUP
// BLOCK). Run notices the end of its context within this time. It must be
// at least 1ms.
// The default is 1 second.
func WithBlock(d time.Duration) Option {
	return func(c *config) {
		if d < time.Millisecond {
			c.problem("WithBlock(%v): must be at least 1ms", d)
			return
		}
		c.block = d
	}
}

// WithBackoff sets the pauses before an entry is tried again after a
// transient failure: first after the first failure, doubling up to max, each
// shortened by up to half at random. The same pauses space the retries
// of reads that failed. It needs 0 < first <= max.
// The default is 1 second to 1 minute.
func WithBackoff(first, max time.Duration) Option {
	return func(c *config) {
		if first <= 0 || max < first {
			c.problem("WithBackoff(%v, %v): needs 0 < first <= max", first, max)
			return
		}
		c.backoffMin, c.backoffMax = first, max
	}
}

// WithDrainTimeout sets how long the handlers still running when Run's
// context ends may go on; then their context is cancelled, and Run
// returns: at once when they have all returned, else without those that
// ignore their context, whose entries stay pending, for redelivery (see
// WithHandlerTimeout). It must not be negative.
// The default is the Client's lease.
func WithDrainTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.problem("WithDrainTimeout(%v): must not be negative", d)
			return
		}
		c.drain = d
	}
}

// WithHandlerTimeout sets how long one try of an entry's handler may run:
// then its context ends (its cause context.DeadlineExceeded), and a
// handler that honours it fails the try, which is retried as any transient
// failure. A handler that ignores it is abandoned a second later: the
// worker goes on with other entries, and the entry stays pending, for
// redelivery (after WithClaimIdle, to this consumer or another) once the
// handler has let its idem key go; the handler's goroutine goes on until
// it returns. 0 sets no timeout. It must not be negative.
// The default is ten times the Client's lease.
func WithHandlerTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.problem("WithHandlerTimeout(%v): must not be negative", d)
			return
		}
		c.handlerTime = d
	}
}

// WithOnDeadLetter sets a function called after each entry was copied to
// the dead-letter stream and acknowledged. It runs on the worker that
// handled the entry; ctx is Run's context, detached from its cancellation.
// The default is none.
func WithOnDeadLetter(f func(ctx context.Context, d DeadLetter)) Option {
	return func(c *config) { c.onDeadLetter = f }
}

// WithLogger sets where the Consumer reports what it works around: reads
// and acknowledgements that failed and are retried, entries dead-lettered.
// nil discards.
// The default is slog.Default(), as it is when a record is logged (as in
// every door: door.Logger).
func WithLogger(l *slog.Logger) Option {
	// Resolved here, not in the closure: one Option may be shared by
	// many New calls at once, and must not write what they read.
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return func(c *config) { c.logger = l }
}

// escapeName escapes '\' and '/' in a stream's or group's name for the
// default scope, so that two pairs of names never make the same scope.
func escapeName(s string) string {
	if !strings.ContainsAny(s, `\/`) {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `/`, `\/`).Replace(s)
}

// defaultFingerprint is idem.Fingerprint of the entry's fields: a map, so
// the fields' order does not matter.
func defaultFingerprint(m redis.XMessage) string {
	return idem.Fingerprint(m.Values)
}
