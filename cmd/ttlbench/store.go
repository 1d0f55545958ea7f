package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// A store is the Redis that one policy's run keeps its records in, with
// the run's clock.
type store interface {
	// client is what the policy's idem.Client talks to.
	client() redis.UniversalClient
	// prefix is the key prefix for the policy's idem.Client (WithPrefix).
	prefix() string
	// scale is how much faster than virtual time the store's time runs:
	// durations given to the library are divided by it.
	scale() float64
	// wait moves the store's clock to virtual time at (from the start of
	// the plan); at never decreases.
	wait(ctx context.Context, at time.Duration) error
	// refresh sets a live record's TTL to what is left of it, just before a
	// script touches the record; expire removes a record whose time is up.
	// Both are needed only where Redis does not keep time by itself.
	refresh(key string, left time.Duration)
	expire(key string)
	// inspect reports whether key exists, its TTL in the store's time, and
	// its size in bytes (see policyResult.BytesMethod).
	inspect(ctx context.Context, key string) (ttl time.Duration, size int64, ok bool, err error)
	// check compares the number of live records the run tracked with the
	// store's own count, where that is cheap.
	check(tracked int) error
	// close deletes what the run stored and closes the connections.
	close() error
}

// memStore is an embedded miniredis on a virtual clock.
//
// Its clock is set (SetTime) to each event's virtual time. TTLs, from
// which the library's scripts read leases, are another matter: miniredis
// counts them down only in FastForward, which walks and sorts
// every key, so calling it at each event makes a long retention cost time
// quadratic in the operations. Instead the run (see records) keeps each
// record's expiry in virtual time, brings a record's TTL up to date just
// before a script touches it (refresh), and deletes it once its time is up
// (expire): what a key sees is what FastForward would have shown it, at the
// cost of one map lookup per script.
type memStore struct {
	mr    *miniredis.Miniredis
	rdb   *redis.Client
	start time.Time
}

var _ store = (*memStore)(nil)

// newMemStore starts a miniredis with its clock at start; hook sees every
// command the policy's Client sends.
func newMemStore(start time.Time, hook redis.Hook) (*memStore, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		return nil, fmt.Errorf("start miniredis: %w", err)
	}
	mr.SetTime(start)
	rdb := redis.NewClient(&redis.Options{
		Addr: mr.Addr(),
		// An in-memory pipe to the server rather than its TCP socket halves
		// the cost of a Do (measured): the run is bound by round trips and
		// miniredis's Lua, not by the library.
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			c, s := net.Pipe()
			mr.Server().ServeConn(s)
			return c, nil
		},
		DisableIdentity: true,
	})
	rdb.AddHook(hook)
	return &memStore{mr: mr, rdb: rdb, start: start}, nil
}

// client returns the client connected to the miniredis.
func (s *memStore) client() redis.UniversalClient { return s.rdb }

// recordPrefix is the key prefix of records on miniredis: idem's default,
// so that the bytes counted are those of a default Client's records.
const recordPrefix = "idem"

// prefix is idem's default: the miniredis holds nothing else.
func (s *memStore) prefix() string { return recordPrefix }

// scale is 1: virtual time is the store's time.
func (s *memStore) scale() float64 { return 1 }

// wait sets the server's clock to virtual time at.
func (s *memStore) wait(_ context.Context, at time.Duration) error {
	s.mr.SetTime(s.start.Add(at))
	return nil
}

// refresh sets key's TTL to what is left of it: what FastForward would
// have made of it by now.
func (s *memStore) refresh(key string, left time.Duration) { s.mr.SetTTL(key, left) }

// expire deletes a record whose TTL has run out, as Redis would.
func (s *memStore) expire(key string) { s.mr.Del(key) }

// inspect sizes a record as the bytes of its name and its value: the
// payload, without Redis's overhead.
func (s *memStore) inspect(_ context.Context, key string) (time.Duration, int64, bool, error) {
	if !s.mr.Exists(key) {
		return 0, 0, false, nil
	}
	size := int64(len(key))
	if t := s.mr.Type(key); t != "string" {
		return 0, 0, false, fmt.Errorf("record %q is a %s, not a string", key, t)
	}
	v, err := s.mr.Get(key)
	if err != nil {
		return 0, 0, false, err
	}
	size += int64(len(v))
	return s.mr.TTL(key), size, true, nil
}

// check compares the tracked records with the keys miniredis holds: if
// they differ, the library wrote keys outside its scripts' KEYS, or this
// harness lost count, and the peaks cannot be trusted.
func (s *memStore) check(tracked int) error {
	if n := len(s.mr.Keys()); n != tracked {
		return fmt.Errorf("internal error: miniredis holds %d keys, ttlbench tracked %d records", n, tracked)
	}
	return nil
}

// close stops the miniredis and its client.
func (s *memStore) close() error {
	err := s.rdb.Close()
	s.mr.Close()
	return err
}

// redisStore is a real Redis, on which time runs scale times faster than
// virtual time: the run sleeps until each event's scaled time, and Redis
// expires records by itself.
type redisStore struct {
	rdb    *redis.Client
	pfx    string
	start  time.Time // the wall-clock time of virtual time 0
	factor float64
}

var _ store = (*redisStore)(nil)

// newRedisStore connects to the Redis at addr ("host:port" or a redis://
// URL) for one policy's run, with a key prefix of its own.
func newRedisStore(ctx context.Context, addr, runID string, policy int, start time.Time, scale float64, hook redis.Hook) (*redisStore, error) {
	opt, err := redisOptions(addr)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("cannot reach Redis at %s: %w", addr, err)
	}
	rdb.AddHook(hook)
	return &redisStore{
		rdb:    rdb,
		pfx:    fmt.Sprintf("ttlbench-%s-%d", runID, policy),
		start:  start,
		factor: scale,
	}, nil
}

// redisOptions parses -redis: a redis:// or rediss:// URL, or host:port.
func redisOptions(addr string) (*redis.Options, error) {
	if strings.Contains(addr, "://") {
		opt, err := redis.ParseURL(addr)
		if err != nil {
			return nil, fmt.Errorf("-redis %q: %w", addr, err)
		}
		return opt, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("-redis %q: want host:port or a redis:// URL: %w", addr, err)
	}
	return &redis.Options{Addr: addr}, nil
}

// newRunID returns a random name for one run, so that its keys cannot be
// confused with anyone else's (ttlbench deletes only keys with its prefix).
func newRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return hex.EncodeToString(b[:])
}

// client returns the client connected to the Redis.
func (s *redisStore) client() redis.UniversalClient { return s.rdb }

// prefix is the run's and policy's own, ttlbench-<run>-<policy>.
func (s *redisStore) prefix() string { return s.pfx }

// scale is -time-scale.
func (s *redisStore) scale() float64 { return s.factor }

// wait sleeps until the scaled wall-clock time of virtual time at; if the
// run is behind, it goes on at once.
func (s *redisStore) wait(ctx context.Context, at time.Duration) error {
	d := time.Until(s.start.Add(time.Duration(float64(at) / s.factor)))
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// refresh does nothing: Redis counts TTLs down by itself.
func (s *redisStore) refresh(string, time.Duration) {}

// expire does nothing: Redis expires records by itself.
func (s *redisStore) expire(string) {}

// inspect sizes a record by MEMORY USAGE: what Redis spends on it,
// overhead included.
func (s *redisStore) inspect(ctx context.Context, key string) (time.Duration, int64, bool, error) {
	var ttl *redis.DurationCmd
	var mem *redis.IntCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		ttl = p.PTTL(ctx, key)
		mem = p.MemoryUsage(ctx, key, 0)
		return nil
	})
	if errors.Is(err, redis.Nil) || ttl.Val() == -2 { // -2: no such key
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("inspect %q: %w", key, err)
	}
	if ttl.Val() < 0 {
		return 0, mem.Val(), true, nil // no TTL: reported by the caller
	}
	return ttl.Val(), mem.Val(), true, nil
}

// check does nothing: counting the keys of a shared Redis is not cheap.
func (s *redisStore) check(int) error { return nil }

// close deletes the run's keys, found by SCAN MATCH on its own prefix,
// never anything else, and closes the connection.
func (s *redisStore) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	iter := s.rdb.Scan(ctx, 0, s.pfx+":*", 1000).Iterator()
	var batch []string
	flush := func() {
		if len(batch) > 0 {
			if err := s.rdb.Unlink(ctx, batch...).Err(); err != nil {
				errs = append(errs, err)
			}
			batch = batch[:0]
		}
	}
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			flush()
		}
	}
	flush()
	if err := iter.Err(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		errs = []error{fmt.Errorf("delete keys %s:*: %w", s.pfx, err)}
	}
	return errors.Join(append(errs, s.rdb.Close())...)
}

// keyTap is a go-redis hook that records which keys the library's scripts
// touch (the KEYS of EVAL and EVALSHA), so that ttlbench learns the names
// of records from the wire rather than by copying how idem builds them.
// before, when set, runs for each such key just before the first script of
// a request that touches it is sent (take ends a request).
type keyTap struct {
	before func(key string)

	mu   sync.Mutex
	keys []string // guarded by mu; touched since the last take
}

var _ redis.Hook = (*keyTap)(nil)

// DialHook leaves dialing alone.
func (t *keyTap) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook notes the keys of a script call.
func (t *keyTap) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t.note(cmd.Args())
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook notes the keys of the script calls in a pipeline.
func (t *keyTap) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			t.note(c.Args())
		}
		return next(ctx, cmds)
	}
}

// note records the keys of a command, if it is a script call.
func (t *keyTap) note(args []any) {
	keys := scriptKeys(args)
	if len(keys) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		// Only before the first script of a request that touches k: a
		// later one must see what the earlier one wrote.
		if t.before != nil && !slices.Contains(t.keys, k) {
			t.before(k)
		}
		t.keys = append(t.keys, k)
	}
}

// take returns the distinct keys touched since the last take.
func (t *keyTap) take() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, k := range t.keys {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	t.keys = t.keys[:0]
	return out
}

// scriptKeys returns the KEYS of an EVAL-family command: its name, the
// script or its SHA, the number of keys, then the keys.
func scriptKeys(args []any) []string {
	if len(args) < 3 {
		return nil
	}
	name, _ := args[0].(string)
	switch strings.ToLower(name) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
	default:
		return nil
	}
	var n int
	switch v := args[2].(type) {
	case int:
		n = v
	case int64:
		n = int(v)
	default:
		_, _ = fmt.Sscan(fmt.Sprint(v), &n)
	}
	if n <= 0 || 3+n > len(args) {
		return nil
	}
	keys := make([]string, 0, n)
	for _, k := range args[3 : 3+n] {
		if s, ok := k.(string); ok {
			keys = append(keys, s)
		}
	}
	return keys
}
