// recover.go: recovery of unfinished registered operations: the index that
// finds them (pendingKey), the Recover loop that runs them again, and
// Retry, which un-parks one.

package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The index of unfinished registered operations has one bucket per hash
// slot on Cluster (it must live in its records' slot), and singleBuckets
// elsewhere, by slot (as the tombstones' buckets): enough that each stays a small listpack (at most
// 128 members: zset-max-listpack-entries) up to some 100,000 unfinished
// operations. See lua/record.lua, "The index".
const singleBuckets = 1024

// parkedField is lua/record.lua's PARKED: the field of a record's
// checkpoints that marks its operation parked.
var parkedField = strings.Repeat("!", 257)

// pendingSuffix follows a bucket's hash tag in its key.
const pendingSuffix = "}:pending"

// sweepBatch bounds the due operations a sweep reads from one bucket.
const sweepBatch = 64

// maxRecovering bounds the recoveries one Recover loop runs at once.
const maxRecovering = 8

// errNothingToRecover is a recovery's claim that found no record, or no
// stored input, to recover: its index entry is gone.
var errNothingToRecover = errors.New("idem: nothing to recover")

// pendingKey returns the key of the index bucket of the record at rk.
func (c *Client) pendingKey(rk string) string {
	return c.bucketKey(int(slot(rk)) % c.buckets())
}

// bucketKey returns the key of bucket b of the index.
func (c *Client) bucketKey(b int) string {
	return c.cfg.prefix + ":{" + slotTags()[b] + pendingSuffix
}

// buckets returns the number of the index's buckets.
func (c *Client) buckets() int {
	if c.cluster {
		return 16384
	}
	return singleBuckets
}

// Recover sweeps the index of unfinished registered operations until ctx
// ends, and then returns ctx's error (ErrClosed when the Client is
// closed). An operation whose caller did not finish it (its lease ended,
// or fn failed transiently, and WithRecoverAfter passed) is taken over by
// the sweep as the next attempt, in the same fenced takeover as a caller's
// (its steps resume, the ledger is looked up, the stale owner is refused),
// and its fn runs with the stored input; a later Do or Result of its key
// gets the outcome. Only operations registered on c (Register) are run;
// those of other names are left alone. After WithMaxRecoveries recoveries
// that did not finish it, an operation is parked (Retry).
//
// A sweep runs every half WithRecoverAfter (at most 10 s apart); each
// recovery's fn runs detached from ctx, bounded by WithDetach's max when
// set, else by ten leases, and Recover waits for the recoveries under way
// before it returns. Any number of Recover loops may run, in any number of
// processes: each operation has one owner at a time. A sweep that fails
// (Redis unreachable) is logged at Warn (WithLogger) and tried again at
// the next.
func (c *Client) Recover(ctx context.Context) error {
	if c == nil || c.rdb == nil {
		return errors.New("idem: Client has no Redis client (use idem.New with a non-nil client)")
	}
	every := min(max(c.cfg.recoverAfter/2, 10*time.Millisecond), 10*time.Second)
	var running sync.WaitGroup
	defer running.Wait()
	sem := make(chan struct{}, maxRecovering)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if c.closed.Load() {
			return ErrClosed
		}
		if err := c.sweep(ctx, sem, &running); err != nil && ctx.Err() == nil {
			c.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idem: a sweep of the unfinished operations failed; the next one tries again", slog.Any("error", err))
		}
		t.Reset(every)
	}
}

// due is an operation a sweep found due.
type due struct {
	key, rk string
}

// sweep reads the operations due now from every bucket, and starts the
// recovery of those registered on c.
func (c *Client) sweep(ctx context.Context, sem chan struct{}, running *sync.WaitGroup) error {
	now, err := c.rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	upTo := strconv.FormatInt(now.UnixMilli(), 10)
	n := c.buckets()
	cmds := make([]*redis.StringSliceCmd, n)
	pipe := c.rdb.Pipeline()
	for b := range n {
		cmds[b] = pipe.ZRangeByScore(ctx, c.bucketKey(b), &redis.ZRangeBy{Min: "-inf", Max: upTo, Count: sweepBatch})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	var found []due
	for _, cmd := range cmds {
		for _, key := range cmd.Val() {
			found = append(found, due{key: key, rk: c.recordKey(key)})
		}
	}
	if len(found) == 0 {
		return nil
	}
	// Whose is each? The name, from the stored input's header only.
	heads := make([]*redis.StringCmd, len(found))
	pipe = c.rdb.Pipeline()
	for i, d := range found {
		heads[i] = pipe.GetRange(ctx, d.rk+inputSuffix, 0, 257)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for i, d := range found {
		name, _, _, ok := parseInput([]byte(heads[i].Val()))
		if !ok {
			continue // no input (the claim of a recovery would drop it), or not ours to read
		}
		c.opsMu.Lock()
		op := c.ops[name]
		c.opsMu.Unlock()
		if op == nil {
			continue // registered elsewhere: left alone
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		running.Add(1)
		go func() {
			defer running.Done()
			defer func() { <-sem }()
			c.recoverOne(ctx, op, d)
		}()
	}
	return nil
}

// recoverOne runs the recovery of d by op, detached from ctx (see Recover),
// and tells the observers how it ended.
func (c *Client) recoverOne(ctx context.Context, op recoverer, d due) {
	bound := c.cfg.detach
	if bound == 0 {
		bound = 10 * c.cfg.lease
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	in, err := c.rdb.Get(rctx, d.rk+inputSuffix).Bytes()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			c.warnKey(ctx, "idem: could not read the stored input of an operation to recover", d.key, err)
		}
		return
	}
	_, _, b, ok := parseInput(in)
	if !ok {
		return
	}
	// A recovery that parked the operation ended with EventParked, its
	// call's own outcome; one that found it finished or owned did nothing.
	if n, err := op.recover(rctx, d.key, b); n > 0 && (err == nil || IsPermanent(err)) {
		c.emitRecovered(ctx, d.key, n)
	}
}

// emitRecovered tells the observers that a recovery finished key's
// operation (EventRecovered) with attempt n.
func (c *Client) emitRecovered(ctx context.Context, key string, n int64) {
	if !c.observed() {
		return
	}
	e := Event{Kind: EventRecovered, Key: c.eventKey(key), Attempt: n}
	if c.cfg.rawEventKeys {
		e.RawKey = key
	}
	c.emit(ctx, e)
}

// Retry un-parks key's operation, parked after WithMaxRecoveries
// recoveries did not finish it: its recoveries count from 0 again, and the
// next Recover sweep (or the next Do of its key) runs it. It returns an
// error naming the reason when key has no record, when its operation is
// finished, when it is not parked, or when a checked step parked it
// (settle that step with Resolve or ResolveNotApplied instead).
func (c *Client) Retry(ctx context.Context, key string) error {
	if err := c.checkCall(ctx, key); err != nil {
		return err
	}
	rk := c.recordKey(key)
	n, err := c.scripts.Run(ctx, retryScript, []string{rk, rk + stepsSuffix, rk + inputSuffix, c.pendingKey(rk)}, key).Int64()
	if err != nil {
		return fmt.Errorf("idem: retry key %q: %w", key, err)
	}
	switch n {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("idem: retry key %q: no such record", key)
	case 2:
		return fmt.Errorf("idem: retry key %q: the operation is finished", key)
	case 3:
		return fmt.Errorf("idem: retry key %q: the operation is not parked", key)
	case 4:
		return fmt.Errorf("idem: retry key %q: a checked step parked the operation: settle it with Resolve or ResolveNotApplied", key)
	}
	return fmt.Errorf("%w: retry key %q: unexpected reply %d", ErrCorrupt, key, n)
}

// Pending is an unfinished registered operation as the index lists it
// (see Client.Pending).
type Pending struct {
	// Key is the idempotency key.
	Key string
	// Name is the operation's name (Register); "" when its stored input
	// is gone or unreadable.
	Name string
	// Due is when a Recover loop takes it over, on the server's clock;
	// zero when Parked.
	Due time.Time
	// Parked reports that the operation is parked: Recover leaves it.
	Parked bool
	// Recoveries is how many recoveries took it over since a caller last
	// claimed it (WithMaxRecoveries).
	Recoveries int
}

// parkedDue is lua/record.lua's PARKED_DUE: the score of a parked entry.
const parkedDue = 1 << 52

// Pending lists up to limit unfinished registered operations from the index
// (see Recover), whatever their names, soonest due first within each
// bucket; parked ones too. It reads every bucket, and the head of each
// listed operation's stored input, without SCAN. It is for operators
// (idemctl pending); it changes nothing.
func (c *Client) Pending(ctx context.Context, limit int) ([]Pending, error) {
	if c == nil || c.rdb == nil {
		return nil, errors.New("idem: Client has no Redis client (use idem.New with a non-nil client)")
	}
	if limit <= 0 {
		return nil, nil
	}
	n := c.buckets()
	cmds := make([]*redis.ZSliceCmd, n)
	pipe := c.rdb.Pipeline()
	for b := range n {
		cmds[b] = pipe.ZRangeWithScores(ctx, c.bucketKey(b), 0, int64(limit)-1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("idem: pending: %w", err)
	}
	var list []Pending
	for _, cmd := range cmds {
		for _, z := range cmd.Val() {
			if len(list) == limit {
				break
			}
			key, _ := z.Member.(string)
			p := Pending{Key: key}
			if z.Score >= parkedDue {
				p.Parked = true
			} else {
				p.Due = time.UnixMilli(int64(z.Score))
			}
			list = append(list, p)
		}
	}
	if len(list) == 0 {
		return list, nil
	}
	heads := make([]*redis.StringCmd, len(list))
	pipe = c.rdb.Pipeline()
	for i, p := range list {
		heads[i] = pipe.GetRange(ctx, c.recordKey(p.Key)+inputSuffix, 0, 257)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("idem: pending: %w", err)
	}
	for i := range list {
		if name, r, _, ok := parseInput([]byte(heads[i].Val())); ok {
			list[i].Name, list[i].Recoveries = name, r
		}
	}
	return list, nil
}
