package idemstream_test

// Helpers that the tests share: a real redis-server, producers, handlers
// that count their applications in Redis, consumers run in goroutines, and
// the checks of a stream's end state.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstream"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// testLease is the idem lease of the tests' Clients: short, so that a dead
// consumer's claims end soon, and at least a second, for a loaded machine.
const testLease = time.Second

// startRedis starts a redis-server for the test and returns its address.
func startRedis(t testing.TB) string {
	t.Helper()
	return redistest.Start(t, redistest.Config{}).Addr()
}

// newClient returns a go-redis client of its own, closed when the test
// ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// newIdem returns an idem.Client on a go-redis client of its own, with the
// tests' lease, closed when the test ends.
func newIdem(t testing.TB, addr string, opts ...idem.Option) *idem.Client {
	t.Helper()
	c := idem.New(newClient(t, addr), append([]idem.Option{idem.WithLease(testLease), idem.WithLogger(nil)}, opts...)...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// quiet discards the Consumer's reports; tests that expect some collect
// them with a logger of their own.
var quiet = idemstream.WithLogger(nil)

// eventKey is the key function of the tests that dedupe producer
// duplicates: the entry's "event" field.
func eventKey(m redis.XMessage) string {
	s, _ := m.Values["event"].(string)
	return s
}

// produce adds one entry per event to stream, in order: event i is
// "ev-<i>" with an amount of i. It returns the entries' IDs.
func produce(t testing.TB, rdb redis.UniversalClient, stream string, events []int) []string {
	t.Helper()
	ctx := context.Background()
	pipe := rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(events))
	for i, ev := range events {
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"event", eventID(ev), "amount", ev}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("XADD: %v", err)
	}
	ids := make([]string, len(events))
	for i, c := range cmds {
		ids[i] = c.Val()
	}
	return ids
}

func eventID(i int) string { return "ev-" + strconv.Itoa(i) }

// applier is a handler that applies events to Redis: one HINCRBY per run
// in the hash applied (event → times applied), and the attempt numbers of
// each in the hash attempts (event → "1,2,..."). It lives in Redis so that
// consumer processes share it and a killed one leaves what it wrote.
type applier struct {
	rdb     redis.UniversalClient
	applied string // hash keys
	attempt string
}

func newApplier(rdb redis.UniversalClient, prefix string) *applier {
	return &applier{rdb: rdb, applied: prefix + ":applied", attempt: prefix + ":attempts"}
}

// apply is the handler.
func (a *applier) apply(ctx context.Context, m redis.XMessage) error {
	ev, _ := m.Values["event"].(string)
	at, _ := idem.AttemptFrom(ctx)
	pipe := a.rdb.TxPipeline()
	pipe.HIncrBy(ctx, a.applied, ev, 1)
	pipe.Eval(ctx, `return redis.call('HSET', KEYS[1], ARGV[1], (redis.call('HGET', KEYS[1], ARGV[1]) or '') .. ARGV[2] .. ',')`,
		[]string{a.attempt}, ev, at.Number)
	_, err := pipe.Exec(ctx)
	return err
}

// counts returns how often each event was applied.
func (a *applier) counts(t testing.TB) map[string]int {
	t.Helper()
	h, err := a.rdb.HGetAll(context.Background(), a.applied).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := make(map[string]int, len(h))
	for k, v := range h {
		n[k], _ = strconv.Atoi(v)
	}
	return n
}

// attempts returns the attempt numbers that applied ev, as "1,2,".
func (a *applier) attempts(t testing.TB, ev string) string {
	t.Helper()
	s, err := a.rdb.HGet(context.Background(), a.attempt, ev).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return s
}

// running is a Consumer's Run in a goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

// start runs c with h until stop or the test's end.
func start(t testing.TB, c *idemstream.Consumer, h idemstream.Handler) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx, h) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the Run and returns its error; it fails the test if Run does
// not return within a minute.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(time.Minute):
		t.Fatalf("Run did not return within a minute of its context's end")
		return nil
	}
}

// wait returns Run's error once it returned by itself, failing the test
// after timeout.
func (r *running) wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		close(r.done)
		return err
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %v", timeout)
		return nil
	}
}

// drained waits until the group has delivered every entry of the stream
// up to last and none is pending, failing the test after timeout.
func drained(t testing.TB, rdb redis.UniversalClient, stream, group, last string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var g redis.XInfoGroup
	for {
		groups, err := rdb.XInfoGroups(context.Background(), stream).Result()
		if err == nil {
			for _, gr := range groups {
				if gr.Name == group {
					g = gr
				}
			}
			if g.Pending == 0 && g.LastDeliveredID == last {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream %s, group %s not drained within %v: %+v (err %v); want everything up to %s delivered and acknowledged",
				stream, group, timeout, g, err, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pending returns the number of entries of the group pending.
func pending(t testing.TB, rdb redis.UniversalClient, stream, group string) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// deadLetters returns the entries of the dead-letter stream.
func deadLetters(t testing.TB, rdb redis.UniversalClient, stream string) []redis.XMessage {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// logs is a slog.Handler that keeps the messages it gets, for tests that
// check what the Consumer reports.
type logs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	s := r.Message
	r.Attrs(func(a slog.Attr) bool { s += fmt.Sprintf(" %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	l.msgs = append(l.msgs, s)
	l.mu.Unlock()
	return nil
}

func (l *logs) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// eventually polls cond until it holds, failing the test after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
