// consumer.go: the Consumer, New and Run: the group, the reads (the
// consumer's own pending entries, entries taken over, new entries) and the
// workers they go to.

package idemstream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
	"github.com/redis/go-redis/v9"
)

// A Handler handles one stream entry. It runs inside idem's Do: its
// context carries the idem.Attempt (idem.AttemptFrom) and ends if the
// attempt loses its lease. Return nil when the entry is handled, an error
// marked idem.Permanent when it never can be (it is acknowledged, and
// redeliveries replay the failure), or any other error to have it tried
// again.
type Handler func(ctx context.Context, m redis.XMessage) error

// Errors of Run and of dead-lettered entries, matched with errors.Is.
var (
	// ErrNotStream means the consumer's key holds another type than a
	// stream (Redis answered WRONGTYPE). Run returns it.
	ErrNotStream = errors.New("idemstream: the key is not a stream")

	// ErrNoGroup means the consumer group, or its stream, was deleted
	// while Run was reading (Redis answered NOGROUP). Run returns it and
	// does not create the group again: a new group would deliver the
	// whole stream again, or skip what was added meanwhile. Calling Run
	// again creates it, starting from the stream's first entry.
	ErrNoGroup = errors.New("idemstream: the consumer group does not exist")

	// ErrNoKey is the reason recorded for an entry whose key function
	// (WithKey) found no key: it is dead-lettered without running the
	// handler.
	ErrNoKey = errors.New("idemstream: the entry has no key")

	// ErrTooManyDeliveries is the reason recorded for an entry delivered
	// more often than WithMaxDeliveries allows without an outcome (its
	// consumers died or hung holding it): it is dead-lettered without
	// running the handler again.
	ErrTooManyDeliveries = errors.New("idemstream: delivered too often without an outcome")
)

// EventIDField is the field that carries an event's id, unique per
// published event: the outbox relays (idemsql.Relay, idempgx's) set it,
// and without WithKey it is the entry's key.
const EventIDField = "idem_event_id"

// defaultKey is the key of an entry without WithKey: its EventIDField, if
// it has a non-empty one, or else its ID.
func defaultKey(m redis.XMessage) string {
	if id, ok := m.Values[EventIDField].(string); ok && id != "" {
		return id
	}
	return m.ID
}

// A Consumer is one member of a Redis Streams consumer group that runs
// each entry's handler through an idem.Client. Create it with New; it
// does nothing until Run.
type Consumer struct {
	keys                   *idem.Client
	rdb                    redis.UniversalClient
	stream, group, name    string
	scope                  string // of the keys given to Do (door.Key)
	cfg                    config
	deadLetter             string
	running                atomic.Bool
	heartbeat, claimPeriod time.Duration
}

// New returns a Consumer named consumer in the consumer group of stream,
// which reads with rdb and runs handlers through client. Give each consumer
// of a group a name of its own that stays the same across restarts: a
// restarted consumer resumes the entries it held at once, while entries
// of a name that never comes back wait WithClaimIdle for another consumer.
// New panics if a client is nil, a name is empty, an option is invalid,
// or the scope leaves no room for a key within the Client's
// idem.WithMaxKeyLen, as those are programming errors, as httpidem's and
// grpcidem's constructors do.
func New(client *idem.Client, rdb redis.UniversalClient, stream, group, consumer string, opts ...Option) *Consumer {
	cfg := defaultConfig(client)
	if client == nil {
		cfg.problem("nil *idem.Client")
	}
	if rdb == nil {
		cfg.problem("nil Redis client")
	}
	for _, n := range []struct{ what, v string }{{"stream", stream}, {"group", group}, {"consumer", consumer}} {
		if n.v == "" {
			cfg.problem("empty %s name", n.what)
		}
	}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Consumer{keys: client, rdb: rdb, stream: stream, group: group, name: consumer, cfg: cfg}
	if cfg.key == nil {
		c.cfg.key = defaultKey
	}
	c.scope = escapeName(stream) + "/" + escapeName(group) + "/"
	if cfg.scope != nil {
		c.scope = *cfg.scope
	}
	if client != nil {
		if _, err := door.FitKeyLen(client, 0, c.scope); err != nil {
			cfg.problem("%v", err)
		}
	}
	if len(cfg.problems) > 0 {
		panic("idemstream: invalid arguments: " + strings.Join(cfg.problems, "; "))
	}
	c.deadLetter = cfg.deadLetter
	if c.deadLetter == "" {
		c.deadLetter = stream + ":dead"
	}
	c.heartbeat = cfg.claimIdle / 4
	c.claimPeriod = cfg.claimIdle / 2
	return c
}

// Run reads the group's entries and hands each to h through idem's Do,
// with the key and fingerprint of the options. It creates the group, with
// its stream, if it is missing (starting at the stream's first entry), and
// first takes back the entries this consumer held when it last stopped.
//
// An entry is acknowledged (XACK) only once its outcome is stored:
// handled, or failed for good (idem.Permanent). After a transient failure
// it is tried again, with backoff (WithBackoff); after WithMaxDeliveries
// it is copied to the dead-letter stream and then acknowledged, as are
// entries that can never be handled (no key, a conflict: see the package
// documentation). Entries that other consumers held without news for
// WithClaimIdle are taken over (XAUTOCLAIM); one whose outcome is stored
// already is acknowledged without running h.
//
// When ctx ends, Run stops reading and returns nil once the handlers
// running have returned (see WithDrainTimeout); the entries it read and
// did not finish stay pending, for its next Run or another consumer. It
// returns an error when it cannot go on: the key is not a stream
// (ErrNotStream), the group was deleted (ErrNoGroup), Redis refuses the
// commands (permissions, a version without XAUTOCLAIM: Redis 6.2 is
// needed), the idem.Client was closed. One Consumer runs one Run at a time.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return errors.New("idemstream: cannot run: nil Handler")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("idemstream: Run called while the Consumer is running")
	}
	defer c.running.Store(false)

	if err := c.createGroup(ctx); err != nil {
		return err
	}
	r := newRun(ctx, c, h)
	r.read()
	r.finish()
	if err := context.Cause(r.rctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// createGroup creates the group, and the stream if missing; a group that
// exists already is kept as it is.
func (c *Consumer) createGroup(ctx context.Context) error {
	err := c.rdb.XGroupCreateMkStream(ctx, c.stream, c.group, "0").Err()
	if err == nil || strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return nil
	}
	if ferr := c.fatal(err); ferr != nil {
		return ferr
	}
	return fmt.Errorf("idemstream: create group %q of stream %q: %w", c.group, c.stream, err)
}

// fatal returns the error Run ends with when err, from a command on the
// stream, means that no retry can help; nil when err may pass.
func (c *Consumer) fatal(err error) error {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return fmt.Errorf("%w: %q holds another type (%v)", ErrNotStream, c.stream, err)
	case strings.HasPrefix(msg, "NOGROUP"):
		return fmt.Errorf("%w: group %q of stream %q is gone, deleted while running? (%v)", ErrNoGroup, c.group, c.stream, err)
	case strings.HasPrefix(msg, "NOPERM"), strings.HasPrefix(msg, "NOAUTH"), strings.HasPrefix(msg, "WRONGPASS"),
		strings.HasPrefix(msg, "ERR unknown command"), strings.HasPrefix(msg, "ERR syntax"):
		return fmt.Errorf("idemstream: stream %q, group %q: %w", c.stream, c.group, err)
	}
	return nil
}

// A run is one call of Run: its reader (Run's goroutine), its workers,
// and the heartbeat that keeps the entries it holds from being taken over.
type run struct {
	c *Consumer
	h Handler

	ctx  context.Context         // Run's: when it ends, reading and retries stop
	rctx context.Context         // reading: ends with ctx, or with a fatal error (its cause)
	stop context.CancelCauseFunc // of rctx
	// hctx is the handlers': Run's values without its cancellation; it
	// ends WithDrainTimeout after ctx.
	hctx    context.Context
	hcancel context.CancelFunc
	drain   func() bool // stops the timer that ends hctx

	readErrors int64 // reads that failed in a row; the reader's own

	jobs    chan job
	workers sync.WaitGroup
	held    held
	beat    chan struct{} // closed to stop the heartbeat
	beating sync.WaitGroup
}

// A job is an entry and how often Redis delivered it.
type job struct {
	m          redis.XMessage
	deliveries int64
}

func newRun(ctx context.Context, c *Consumer, h Handler) *run {
	r := &run{c: c, h: h, ctx: ctx, jobs: make(chan job), beat: make(chan struct{})}
	r.held.ids = make(map[string]struct{})
	r.rctx, r.stop = context.WithCancelCause(ctx)
	r.hctx, r.hcancel = context.WithCancel(context.WithoutCancel(ctx))
	r.drain = context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.cfg.drain, r.hcancel)
		context.AfterFunc(r.hctx, func() { t.Stop() })
	})
	for range c.cfg.workers {
		r.workers.Go(func() {
			for j := range r.jobs {
				r.handle(j)
				r.held.remove(j.m.ID)
			}
		})
	}
	r.beating.Go(r.heartbeat)
	return r
}

// finish waits for the workers, then stops the heartbeat.
func (r *run) finish() {
	close(r.jobs)
	r.workers.Wait()
	close(r.beat)
	r.beating.Wait()
	r.drain()
	r.hcancel()
	r.stop(nil)
}

// read reads until rctx ends: first the entries this consumer held
// already (a restart), then, in turn, entries other consumers left idle
// and new ones.
func (r *run) read() {
	start := "0"
	for r.rctx.Err() == nil {
		msgs, err := r.readGroup(start, -1)
		if r.failed("read the consumer's pending entries", err) {
			continue
		}
		if len(msgs) == 0 {
			break
		}
		start = msgs[len(msgs)-1].ID
		r.dispatch(msgs, r.deliveries(msgs))
	}
	cursor, nextClaim := "0-0", time.Time{}
	for r.rctx.Err() == nil {
		if !time.Now().Before(nextClaim) {
			msgs, next, err := r.c.rdb.XAutoClaim(r.rctx, &redis.XAutoClaimArgs{
				Stream: r.c.stream, Group: r.c.group, Consumer: r.c.name,
				MinIdle: r.c.cfg.claimIdle, Start: cursor, Count: int64(r.c.cfg.batch),
			}).Result()
			if r.failed("take over idle entries (XAUTOCLAIM)", err) {
				continue
			}
			if cursor = next; next == "0-0" {
				nextClaim = time.Now().Add(r.c.claimPeriod)
			}
			if len(msgs) > 0 {
				r.dispatch(msgs, r.deliveries(msgs))
				continue
			}
		}
		msgs, err := r.readGroup(">", r.c.cfg.block)
		if r.failed("read new entries", err) {
			continue
		}
		r.dispatch(msgs, nil)
	}
}

// readGroup reads entries after start (">": new ones), waiting up to block
// for new ones (-1: not at all).
func (r *run) readGroup(start string, block time.Duration) ([]redis.XMessage, error) {
	res, err := r.c.rdb.XReadGroup(r.rctx, &redis.XReadGroupArgs{
		Group: r.c.group, Consumer: r.c.name, Streams: []string{r.c.stream, start},
		Count: int64(r.c.cfg.batch), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) || (err == nil && len(res) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return res[0].Messages, nil
}

// failed reports whether err, of a read, ends this turn of the loop: it
// stops the run when no retry can help, and otherwise pauses before the
// next turn.
func (r *run) failed(what string, err error) bool {
	if err == nil {
		return false
	}
	if r.rctx.Err() != nil {
		return true
	}
	if ferr := r.c.fatal(err); ferr != nil {
		r.stop(ferr)
		return true
	}
	r.readErrors++
	r.c.cfg.logger.Warn("idemstream: "+what+" failed; trying again", "stream", r.c.stream, "group", r.c.group,
		"consumer", r.c.name, "error", err)
	r.sleep(r.c.backoff(r.readErrors))
	return true
}

// deliveries returns how often Redis delivered each of msgs (XPENDING), by
// ID; an entry no longer pending with this consumer is missing.
func (r *run) deliveries(msgs []redis.XMessage) map[string]int64 {
	n := make(map[string]int64, len(msgs))
	pend, err := r.c.rdb.XPendingExt(r.rctx, &redis.XPendingExtArgs{
		Stream: r.c.stream, Group: r.c.group, Consumer: r.c.name,
		Start: msgs[0].ID, End: msgs[len(msgs)-1].ID, Count: int64(len(msgs) + r.held.len() + 64),
	}).Result()
	if err != nil {
		// Count each as one more delivery than the first: a guess that
		// errs towards handling the entry rather than dead-lettering it.
		for _, m := range msgs {
			n[m.ID] = 2
		}
		return n
	}
	for _, p := range pend {
		n[p.ID] = p.RetryCount
	}
	return n
}

// dispatch hands msgs to the workers, each with its delivery count (nil:
// 1 each, new entries). The entries are held, and kept from other
// consumers by the heartbeat, from now until a worker is done with them;
// those not handed over when reading stops stay pending.
func (r *run) dispatch(msgs []redis.XMessage, deliveries map[string]int64) {
	r.readErrors = 0
	for _, m := range msgs {
		r.held.add(m.ID)
	}
	for i, m := range msgs {
		d := int64(1)
		if deliveries != nil {
			var ok bool
			if d, ok = deliveries[m.ID]; !ok {
				r.held.remove(m.ID) // taken by another consumer, or acknowledged meanwhile
				continue
			}
		}
		if r.rctx.Err() == nil {
			select {
			case r.jobs <- job{m: m, deliveries: d}:
				continue
			case <-r.rctx.Done():
			}
		}
		for _, m := range msgs[i:] {
			r.held.remove(m.ID)
		}
		return
	}
}

// heartbeat claims the held entries for this consumer again (XCLAIM
// JUSTID, which does not count a delivery) every quarter of the claim-idle
// time, so that other consumers do not take over entries that are being
// handled or wait for a worker.
func (r *run) heartbeat() {
	t := time.NewTicker(r.c.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-r.beat:
			return
		case <-t.C:
		}
		ids := r.held.list()
		for len(ids) > 0 {
			chunk := ids[:min(len(ids), 1000)]
			ids = ids[len(chunk):]
			ctx, cancel := context.WithTimeout(r.hctx, r.c.heartbeat)
			err := r.c.rdb.XClaimJustID(ctx, &redis.XClaimArgs{
				Stream: r.c.stream, Group: r.c.group, Consumer: r.c.name, Messages: chunk,
			}).Err()
			cancel()
			if err != nil {
				r.c.cfg.logger.Warn("idemstream: renewing the entries held failed; others may take them over", "stream", r.c.stream,
					"group", r.c.group, "consumer", r.c.name, "entries", len(chunk), "error", err)
			}
		}
	}
}

// sleep pauses for d, or until Run's context ends; it reports whether the
// pause was whole.
func (r *run) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.rctx.Done():
		return false
	}
}

// backoff returns the pause before the n-th retry (n >= 1): WithBackoff's
// min doubled n-1 times, capped by its max, less up to half at random.
func (c *Consumer) backoff(n int64) time.Duration {
	d := c.cfg.backoffMin
	for i := int64(1); i < n && d < c.cfg.backoffMax; i++ {
		d *= 2
	}
	d = min(d, c.cfg.backoffMax)
	return d - rand.N(d/2+1)
}

// held is the set of entries a run holds: read and not yet finished.
type held struct {
	mu  sync.Mutex
	ids map[string]struct{} // guarded by mu
}

func (h *held) add(id string) {
	h.mu.Lock()
	h.ids[id] = struct{}{}
	h.mu.Unlock()
}

func (h *held) remove(id string) {
	h.mu.Lock()
	delete(h.ids, id)
	h.mu.Unlock()
}

func (h *held) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids)
}

func (h *held) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.ids))
	for id := range h.ids {
		ids = append(ids, id)
	}
	return ids
}
