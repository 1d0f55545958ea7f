// handle.go: one entry's way through a worker: Do, then acknowledge,
// retry, or dead-letter.

package idemstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
	"github.com/redis/go-redis/v9"
)

// The fields that a dead-lettered entry carries besides its own.
const (
	// FieldID holds the entry's ID in its stream.
	FieldID = "dead-letter:id"
	// FieldStream holds the stream the entry was read from.
	FieldStream = "dead-letter:stream"
	// FieldGroup holds the consumer group that gave up on it.
	FieldGroup = "dead-letter:group"
	// FieldConsumer holds the consumer that dead-lettered it.
	FieldConsumer = "dead-letter:consumer"
	// FieldDeliveries holds how often Redis had delivered it.
	FieldDeliveries = "dead-letter:deliveries"
	// FieldError holds the last error, or why it could not be handled.
	FieldError = "dead-letter:error"
)

// DeadLetter describes an entry that was copied to the dead-letter stream
// and acknowledged.
type DeadLetter struct {
	// Message is the entry as it was read.
	Message redis.XMessage
	// Deliveries is how often Redis had delivered it.
	Deliveries int64
	// Err is the last error, or why the entry could not be handled
	// (ErrNoKey, ErrTooManyDeliveries, idem.ErrInvalidKey, ...).
	Err error
	// ID is the ID of its copy in the dead-letter stream.
	ID string
}

// opTimeout bounds the commands that finish an entry (XACK, XADD to the
// dead-letter stream, XCLAIM), which run detached from Run's context.
const opTimeout = 10 * time.Second

// handle runs one entry through Do until its outcome is stored (then it
// is acknowledged), it is dead-lettered, or Run stops (then it stays
// pending).
func (r *run) handle(j job) {
	m, d := j.m, j.deliveries
	if len(m.Values) == 0 {
		// Deleted from the stream (XDEL, XTRIM) while pending: nothing is
		// left to handle.
		r.ack(m)
		return
	}
	key := r.c.cfg.key(m)
	if key == "" {
		r.deadLetter(m, d, "", fmt.Errorf("%w (WithKey found none in entry %s)", ErrNoKey, m.ID))
		return
	}
	key = door.Key(r.c.scope, key)
	fp := r.c.cfg.fingerprint(m)
	var waits int64 // tries in a row that were not deliveries
	for {
		ran := false
		fn := func(ctx context.Context) ([]byte, error) {
			ran = true
			return nil, r.h(ctx, m)
		}
		if d > r.c.cfg.maxDeliveries {
			// Its consumers died or hung holding it: run it no more, unless
			// its outcome is stored (Do replays it) or under way elsewhere.
			fn = func(context.Context) ([]byte, error) { return nil, errTooMany }
		}
		err, ok := r.do(key, fp, fn)
		if !ok {
			msg := "idemstream: handler abandoned: still running a second after its timeout (WithHandlerTimeout); the entry stays pending, for redelivery"
			if r.hctx.Err() != nil {
				msg = "idemstream: handler abandoned: still running when the drain timeout ended; the entry stays pending, for redelivery"
			}
			r.c.cfg.logger.LogAttrs(context.WithoutCancel(r.hctx), slog.LevelWarn, msg,
				append([]slog.Attr{slog.String("stream", r.c.stream), slog.String("group", r.c.group),
					slog.String("consumer", r.c.name), slog.String("id", m.ID)}, r.c.keys.LogAttrs(key, nil)...)...)
			return
		}
		// What Do's error means (idem.VerdictOf), as in every door.
		v := idem.VerdictOf(err)
		switch {
		case errors.Is(err, errTooMany):
			r.deadLetter(m, d, key, fmt.Errorf("%w: delivered %d times, WithMaxDeliveries is %d", ErrTooManyDeliveries, d, r.c.cfg.maxDeliveries))
			return
		case v == idem.VerdictConflict, v.DeadLetter():
			// A conflict: stored for the key is another entry's outcome,
			// and this one was not handled; an invalid key or an unusable
			// record: no retry changes them. Keep it where an operator
			// sees it.
			r.deadLetter(m, d, key, err)
			return
		case v.Settled():
			r.ack(m)
			return
		case errors.Is(err, idem.ErrClosed):
			r.stop(fmt.Errorf("idemstream: the idem.Client was closed: %w", err))
			return
		}
		if r.rctx.Err() != nil {
			return // Run is ending: the entry stays pending
		}
		if !ran || v == idem.VerdictNotRecorded {
			// Not the handler's failure: the key in progress elsewhere,
			// Redis failing, a record that expired while this try waited
			// (idem.ErrExpired), an outcome that could not be stored or
			// replicated (the next try finds it, or takes over after the
			// lease). Not a delivery.
			waits++
			if !r.sleep(r.c.backoff(waits)) {
				return
			}
			continue
		}
		waits = 0
		if d >= r.c.cfg.maxDeliveries {
			r.deadLetter(m, d, key, err)
			return
		}
		if !r.sleep(r.c.backoff(d)) || !r.redeliver(m) {
			return
		}
		d++
	}
}

// abandonGrace is how long a worker waits, after a handler's context
// ended at its timeout, for the handler to return before it abandons it.
const abandonGrace = time.Second

// do runs one try of an entry through Do, on a context that ends at the
// handler timeout (WithHandlerTimeout) or when the drain ends, and waits
// for it: ok is false when the handler went on past that end (a second
// more at its timeout, none once the drain ended), and Do is left to
// finish alone; the entry's outcome, if it gets one, is found by its
// redelivery.
func (r *run) do(key, fp string, fn func(context.Context) ([]byte, error)) (err error, ok bool) {
	ctx, cancel := r.hctx, context.CancelFunc(func() {})
	if d := r.c.cfg.handlerTime; d > 0 {
		ctx, cancel = context.WithTimeout(r.hctx, d)
	}
	done := make(chan error, 1)
	go func() {
		defer cancel()
		_, err := r.c.keys.Do(ctx, key, fp, fn)
		done <- err
	}()
	select {
	case err := <-done:
		return err, true
	case <-ctx.Done():
	}
	if r.hctx.Err() == nil {
		// The handler's timeout: one that honours it returns now.
		t := time.NewTimer(abandonGrace)
		defer t.Stop()
		select {
		case err := <-done:
			return err, true
		case <-t.C:
		case <-r.hctx.Done():
		}
	}
	select {
	case err := <-done:
		return err, true
	default:
		return nil, false
	}
}

// errTooMany is what Do's fn returns in place of the handler for an entry
// delivered too often.
var errTooMany = errors.New("idemstream: not run: delivered too often")

// redeliver counts one more delivery of m in Redis (XCLAIM to this
// consumer), so that a crash does not reset it. It reports false when m is
// no longer pending (acknowledged by another consumer, deleted) or Redis
// failed: then the worker lets it go, and it comes back if still pending.
func (r *run) redeliver(m redis.XMessage) bool {
	ctx, cancel := context.WithTimeout(r.hctx, opTimeout)
	defer cancel()
	msgs, err := r.c.rdb.XClaim(ctx, &redis.XClaimArgs{
		Stream: r.c.stream, Group: r.c.group, Consumer: r.c.name, Messages: []string{m.ID},
	}).Result()
	if err != nil {
		r.c.cfg.logger.Warn("idemstream: counting a redelivery failed; the entry comes back later", "stream", r.c.stream,
			"group", r.c.group, "consumer", r.c.name, "id", m.ID, "error", err)
		return false
	}
	return len(msgs) == 1
}

// ack acknowledges m. A failure leaves it pending: it comes back, and its
// stored outcome is replayed then.
func (r *run) ack(m redis.XMessage) {
	ctx, cancel := context.WithTimeout(r.hctx, opTimeout)
	defer cancel()
	if err := r.c.rdb.XAck(ctx, r.c.stream, r.c.group, m.ID).Err(); err != nil {
		r.c.cfg.logger.Warn("idemstream: acknowledging failed; the entry comes back and its outcome is replayed", "stream", r.c.stream,
			"group", r.c.group, "consumer", r.c.name, "id", m.ID, "error", err)
	}
}

// deadLetter copies m to the dead-letter stream with why, then
// acknowledges it: in that order, so that a crash between the two leaves
// a duplicate in the dead-letter stream, never a loss. If the copy fails,
// m stays pending and comes back. key is the entry's key given to Do ("" if
// it has none): the log names it by its digest, as the Client does.
func (r *run) deadLetter(m redis.XMessage, deliveries int64, key string, why error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), opTimeout)
	defer cancel()
	fields := make([]string, 0, len(m.Values))
	for f := range m.Values {
		fields = append(fields, f)
	}
	slices.Sort(fields)
	values := make([]any, 0, 2*len(fields)+12)
	for _, f := range fields {
		values = append(values, f, m.Values[f])
	}
	values = append(values, FieldID, m.ID, FieldStream, r.c.stream, FieldGroup, r.c.group,
		FieldConsumer, r.c.name, FieldDeliveries, strconv.FormatInt(deliveries, 10), FieldError, why.Error())
	id, err := r.c.rdb.XAdd(ctx, &redis.XAddArgs{Stream: r.c.deadLetter, Values: values}).Result()
	if err != nil {
		r.c.cfg.logger.Warn("idemstream: dead-lettering failed; the entry stays pending and comes back", "stream", r.c.stream,
			"group", r.c.group, "consumer", r.c.name, "id", m.ID, "dead_letter", r.c.deadLetter, "error", err)
		return
	}
	attrs := []slog.Attr{slog.String("stream", r.c.stream), slog.String("group", r.c.group), slog.String("consumer", r.c.name),
		slog.String("id", m.ID), slog.String("dead_letter", r.c.deadLetter), slog.String("dead_letter_id", id),
		slog.Int64("deliveries", deliveries)}
	if key != "" {
		attrs = append(attrs, r.c.keys.LogAttrs(key, why)...)
	} else {
		attrs = append(attrs, slog.Any("error", why))
	}
	r.c.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemstream: entry dead-lettered", attrs...)
	if err := r.c.rdb.XAck(ctx, r.c.stream, r.c.group, m.ID).Err(); err != nil {
		r.c.cfg.logger.Warn("idemstream: acknowledging a dead-lettered entry failed; it may be dead-lettered again", "stream", r.c.stream,
			"group", r.c.group, "consumer", r.c.name, "id", m.ID, "error", err)
		return
	}
	if f := r.c.cfg.onDeadLetter; f != nil {
		f(context.WithoutCancel(r.ctx), DeadLetter{Message: m, Deliveries: deliveries, Err: why, ID: id})
	}
}
