package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// A ledger is the downstream system whose side effect must not repeat: it
// credits each event's amount to its account and counts how often each
// event was applied, so a double application shows as a count of 2. It
// lives in Redis, beside the stream, so that every consumer process shares
// it and a consumer killed with -9 leaves behind exactly what it wrote.
//
// It does not refuse a second application of an event (that would hide
// what the demo measures); it only refuses a stale attempt, one older than
// an attempt of the same event that has begun (the fencing token that
// idem.AttemptFrom hands out).
type ledger struct {
	rdb *redis.Client
	// keys are the applications hash (event → times applied), the fences
	// hash (event → highest attempt begun) and the balances hash (account →
	// sum), in one hash slot so that the scripts also run on a cluster node.
	keys []string
}

// newLedger returns the ledger stored under prefix.
func newLedger(rdb *redis.Client, prefix string) *ledger {
	tag := prefix + "{ledger}:"
	return &ledger{rdb: rdb, keys: []string{tag + "applied", tag + "fences", tag + "balances"}}
}

// applyScript applies one event.
//
// KEYS: applications, fences, balances.
// ARGV: event id, attempt (0: not fenced), account, amount.
// Returns 1 when applied, 0 when refused: a newer attempt has begun.
var applyScript = redis.NewScript(`
local n = tonumber(ARGV[2])
if n < tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') then
	return 0
end
if n > 0 then
	redis.call('HSET', KEYS[2], ARGV[1], n)
end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('HINCRBY', KEYS[3], ARGV[3], ARGV[4])
return 1
`)

// reconcileScript looks an event up for a new attempt.
//
// KEYS: applications, fences.
// ARGV: event id, attempt.
// Raises the event's fence to the attempt, so that an older attempt still
// running cannot apply it any more, and returns how often it was applied.
var reconcileScript = redis.NewScript(`
if tonumber(ARGV[2]) > tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') then
	redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
`)

// errStale is apply's refusal of an attempt older than one that has begun.
var errStale = errors.New("ledger: a newer attempt of the event has begun")

// apply credits ev's amount to its account as attempt n (0 for a handler
// without attempts), in one script: a consumer that dies during the call
// leaves the event applied or not, never half.
func (l *ledger) apply(ctx context.Context, ev event, n int64) error {
	ok, err := applyScript.Run(ctx, l.rdb, l.keys, ev.ID, n, ev.Account, ev.Amount).Int()
	if err != nil {
		return fmt.Errorf("ledger: apply %s: %w", ev.ID, err)
	}
	if ok == 0 {
		return fmt.Errorf("apply %s as attempt %d: %w", ev.ID, n, errStale)
	}
	return nil
}

// reconcile reports whether the event was applied already, and fences off
// the attempts before n.
func (l *ledger) reconcile(ctx context.Context, id string, n int64) (bool, error) {
	times, err := reconcileScript.Run(ctx, l.rdb, l.keys[:2], id, n).Int()
	if err != nil {
		return false, fmt.Errorf("ledger: reconcile %s: %w", id, err)
	}
	return times > 0, nil
}

// applications returns how often each event was applied.
func (l *ledger) applications(ctx context.Context) (map[string]int, error) {
	return l.counts(ctx, l.keys[0])
}

// balances returns each account's sum.
func (l *ledger) balances(ctx context.Context) (map[string]int, error) {
	return l.counts(ctx, l.keys[2])
}

// counts reads a hash of integers.
func (l *ledger) counts(ctx context.Context, key string) (map[string]int, error) {
	h, err := l.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("ledger: read %s: %w", key, err)
	}
	m := make(map[string]int, len(h))
	for k, v := range h {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("ledger: %s[%s] = %q: %w", key, k, v, err)
		}
		m[k] = n
	}
	return m, nil
}
