// outbox.go: ExerciseOutbox, the scenarios of a driver's outbox (Publish
// and Relay): every committed event reaches its stream, at least once,
// through Redis failures and a relay stopped mid-batch.

package ledgertest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/redis/go-redis/v9"
)

// OutboxDriver is a driver's Publish and Relay under test.
type OutboxDriver struct {
	// Name names the driver in the subtests' names, such as "idempgx".
	Name string

	// Open returns an Outbox on a new database that the driver has
	// migrated. What it opens is closed when tb ends. The suite calls it
	// once per scenario.
	Open func(tb testing.TB) Outbox

	// EventIDField is the field that Relay adds to every entry, the
	// event's id (idemsql.EventIDField).
	EventIDField string

	// SharedRelays says that several relays may run at once on one
	// outbox (FOR UPDATE SKIP LOCKED): the TwoRelays scenario runs.
	SharedRelays bool
}

// Outbox is one database as the outbox scenarios drive it.
type Outbox interface {
	// Publish publishes an event to stream for each of fields, in order,
	// in one transaction (outside any idem call), and commits it, or
	// with rollback rolls it back; it returns the ids Publish returned.
	Publish(ctx context.Context, stream string, fields []map[string]any, rollback bool) (ids []string, err error)

	// Relay runs the driver's Relay on rdb until ctx ends, with batches
	// of batch rows (0: the driver's default), a poll of 10ms and a
	// longest backoff of 200ms; observe, when not nil, is the relay's
	// observer, given the relay's counts after every batch.
	Relay(ctx context.Context, rdb redis.UniversalClient, batch int, observe func(RelayCounts)) error

	// Rows returns how many rows the outbox holds.
	Rows(ctx context.Context) (int, error)
}

// RelayCounts are a relay's counts since it started, as its observer
// gets them (idemsql.RelayStats).
type RelayCounts struct {
	Published, Failures int64
	Lag                 time.Duration
	Err                 error
}

// ExerciseOutbox runs the outbox scenarios on d, each as a subtest of t on
// a database and a redis-server of its own (skipped with a message where
// none is installed, unless IDEM_REQUIRE_REDIS=1):
//
//   - a rolled-back transaction publishes nothing; a committed one its
//     event, with every field in the form Relay writes (numbers in
//     decimal, named string types, bytes) and the event's id;
//   - 1,000 committed events, to two streams: each reaches its stream
//     once, with a distinct id, in the order of its rows;
//   - Redis down in the middle of the relay's work: batches fail and back
//     off, the rows stay, the observer sees the failures and a lag; once
//     Redis is back, every event is published, none twice;
//   - a redis-server with appendonly yes and appendfsync always, killed
//     with SIGKILL and restarted on its port 3 times while the relay moves
//     a steady stream of committed events: after the last restart every
//     event is in the stream at least once and the outbox is empty; when
//     the Outbox also implements Backend (on the same database, with its
//     movements table), two idemstream consumers applying each entry
//     through the ledger, keyed by the event's id, apply each event once;
//   - a relay stopped between its XADDs and its COMMIT: the next publishes
//     that batch again, under the same ids, and nothing else twice;
//   - with SharedRelays, two relays at once: every row published, and the
//     duplicates (none expected) counted.
func ExerciseOutbox(t *testing.T, d OutboxDriver) {
	t.Helper()
	if d.Open == nil || d.EventIDField == "" {
		t.Fatal("ledgertest: OutboxDriver needs Open and EventIDField")
	}
	type scenario struct {
		name  string
		run   func(t *testing.T, o *outboxEnv)
		redis []dbtest.RedisOption
	}
	scenarios := []scenario{
		{name: "PublishRollback", run: publishRollback},
		{name: "RelayThousand", run: relayThousand},
		{name: "RelayRedisDown", run: relayRedisDown},
		{name: "RelayRedisRestarted", run: relayRedisRestarted, redis: []dbtest.RedisOption{dbtest.AppendFsyncAlways()}},
		{name: "RelayStoppedAfterXAdd", run: relayStoppedAfterXAdd},
	}
	if d.SharedRelays {
		scenarios = append(scenarios, scenario{name: "TwoRelays", run: twoRelays})
	}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			r := dbtest.StartRedis(t, s.redis...)
			if r == nil {
				return // skipped: no redis-server
			}
			s.run(t, &outboxEnv{d: d, o: d.Open(t), redis: r})
		})
	}
}

// outboxEnv is one outbox scenario's world.
type outboxEnv struct {
	d     OutboxDriver
	o     Outbox
	redis *dbtest.Redis
}

// client returns a new client of the scenario's Redis, closed when t ends.
func (e *outboxEnv) client(t *testing.T) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: e.redis.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// publish commits n events to stream, with fields n (first, first+1, ...),
// in transactions of per events each; it returns their ids.
func (e *outboxEnv) publish(t *testing.T, stream string, first, n, per int) []string {
	t.Helper()
	var ids []string
	for i := first; i < first+n; i += per {
		var fields []map[string]any
		for j := i; j < min(i+per, first+n); j++ {
			fields = append(fields, map[string]any{"n": j})
		}
		got, err := e.o.Publish(context.Background(), stream, fields, false)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	return ids
}

// rows returns how many rows the outbox holds.
func (e *outboxEnv) rows(t *testing.T) int {
	t.Helper()
	n, err := e.o.Rows(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// relay runs Relay until stop is called, which checks that it returned
// ctx's error.
func (e *outboxEnv) relay(t *testing.T, rdb redis.UniversalClient, batch int, observe func(RelayCounts)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.o.Relay(ctx, rdb, batch, observe) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Relay returned %v, want context.Canceled", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// emptied waits until the outbox is empty.
func (e *outboxEnv) emptied(t *testing.T) {
	t.Helper()
	WaitUntil(t, "the outbox to empty", func() bool { return e.rows(t) == 0 })
}

// ids returns how many entries stream has, and how many carry each event
// id.
func (e *outboxEnv) ids(t *testing.T, rdb redis.UniversalClient, stream string) (entries int, seen map[string]int) {
	t.Helper()
	msgs := StreamEntries(t, rdb, stream)
	return len(msgs), CountIDs(msgs, e.d.EventIDField)
}

// StreamEntries returns stream's entries, read whole (XRANGE - +); an error
// fails tb.
func StreamEntries(tb testing.TB, rdb redis.UniversalClient, stream string) []redis.XMessage {
	tb.Helper()
	msgs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		tb.Fatal(err)
	}
	return msgs
}

// CountIDs returns how many of msgs carry each event id, the value of
// their field idField (the driver's EventIDField).
func CountIDs(msgs []redis.XMessage, idField string) map[string]int {
	seen := map[string]int{}
	for _, m := range msgs {
		id, _ := m.Values[idField].(string)
		seen[id]++
	}
	return seen
}

// WaitUntil calls cond every 10ms until it returns true, and fails tb
// naming what it waited for when a minute passed first.
func WaitUntil(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A rolled-back transaction publishes nothing; a committed one publishes
// its events, with their fields.
func publishRollback(t *testing.T, e *outboxEnv) {
	ctx := context.Background()
	if _, err := e.o.Publish(ctx, "orders", []map[string]any{{"order": "rolled-back"}}, true); err != nil {
		t.Fatal(err)
	}
	type status string
	ids, err := e.o.Publish(ctx, "orders", []map[string]any{{"order": "o-1", "amount": 1250, "rate": 0.5, "status": status("paid"), "raw": []byte{0, 1}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	rdb := e.client(t)
	stop := e.relay(t, rdb, 0, nil)
	e.emptied(t)
	stop()
	msgs := StreamEntries(t, rdb, "orders")
	if len(msgs) != 1 {
		t.Fatalf("%d entries, want 1: %v", len(msgs), msgs)
	}
	got := fmt.Sprint(msgs[0].Values)
	want := fmt.Sprint(map[string]any{"order": "o-1", "amount": "1250", "rate": "0.5", "status": "paid", "raw": "\x00\x01", e.d.EventIDField: ids[0]})
	if got != want {
		t.Errorf("entry %s, want %s", got, want)
	}
}

// 1,000 committed events reach their streams once each, with distinct ids,
// in the order of their rows.
func relayThousand(t *testing.T, e *outboxEnv) {
	ids := append(e.publish(t, "a", 0, 500, 10), e.publish(t, "b", 500, 500, 25)...)
	rdb := e.client(t)
	e.relay(t, rdb, 64, nil)
	e.emptied(t)
	var all []redis.XMessage
	for _, s := range []string{"a", "b"} {
		msgs := StreamEntries(t, rdb, s)
		for i := 1; i < len(msgs); i++ {
			prev, _ := strconv.Atoi(msgs[i-1].Values["n"].(string))
			n, _ := strconv.Atoi(msgs[i].Values["n"].(string))
			if n != prev+1 {
				t.Fatalf("stream %s: entry %d has n=%d after n=%d", s, i, n, prev)
			}
		}
		all = append(all, msgs...)
	}
	seen := CountIDs(all, e.d.EventIDField)
	if len(all) != 1000 || len(seen) != 1000 {
		t.Errorf("%d entries, %d distinct ids; want 1000, 1000", len(all), len(seen))
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("id %s published %d times", id, seen[id])
		}
	}
}

// failing is a go-redis hook that fails every command and pipeline while
// on is set, and calls after (once) after the first pipeline that
// succeeded while armed is set.
type failing struct {
	on    atomic.Bool
	armed atomic.Bool
	after func()
}

var errRedisDown = errors.New("ledgertest: redis is down")

func (f *failing) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failing) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.on.Load() {
			cmd.SetErr(errRedisDown)
			return errRedisDown
		}
		return next(ctx, cmd)
	}
}
func (f *failing) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if f.on.Load() {
			for _, c := range cmds {
				c.SetErr(errRedisDown)
			}
			return errRedisDown
		}
		err := next(ctx, cmds)
		if err == nil && f.armed.CompareAndSwap(true, false) {
			f.after()
		}
		return err
	}
}

var _ redis.Hook = (*failing)(nil)

// Redis down in the middle of the relay's work: batches fail and back off,
// no row is lost, none is published twice; the observer sees the
// failures and the lag.
func relayRedisDown(t *testing.T, e *outboxEnv) {
	rdb := e.client(t)
	hook := &failing{}
	rdb.AddHook(hook)
	var failures, published, lag atomic.Int64
	ids := e.publish(t, "orders", 0, 200, 20)
	e.relay(t, rdb, 50, func(s RelayCounts) {
		failures.Store(s.Failures)
		published.Store(s.Published)
		if s.Failures > 0 {
			lag.Store(int64(s.Lag))
		}
		if s.Published >= 50 && s.Failures == 0 {
			hook.on.Store(true) // down, after the first batch
		}
	})
	WaitUntil(t, "failed batches", func() bool { return failures.Load() >= 3 })
	if n := e.rows(t); n != 150 {
		t.Errorf("%d rows left while Redis is down, want 150", n)
	}
	if lag.Load() <= 0 {
		t.Errorf("lag %v while Redis is down, want above 0", time.Duration(lag.Load()))
	}
	ids = append(ids, e.publish(t, "orders", 200, 100, 20)...)
	hook.on.Store(false)
	e.emptied(t)
	_, seen := e.ids(t, rdb, "orders")
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("id %s published %d times, want 1", id, seen[id])
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("%d ids in the stream, want %d", len(seen), len(ids))
	}
	t.Logf("%d failed batches, %d published", failures.Load(), published.Load())
}

// A relay that stops between its XADDs and its COMMIT leaves its rows:
// the next relay publishes them again, with the same ids. Nothing is lost,
// and exactly that batch is duplicated.
func relayStoppedAfterXAdd(t *testing.T, e *outboxEnv) {
	ids := e.publish(t, "orders", 0, 100, 10)
	rdb := e.client(t)
	hook := &failing{}
	rdb.AddHook(hook)
	ctx, cancel := context.WithCancel(context.Background())
	hook.after = cancel // the XADDs landed; the relay dies before COMMIT
	hook.armed.Store(true)
	if err := e.o.Relay(ctx, rdb, 30, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Relay: %v, want context.Canceled", err)
	}
	if got := e.rows(t); got != 100 {
		t.Fatalf("%d rows left after the stopped batch, want 100", got)
	}
	e.relay(t, rdb, 0, nil)
	e.emptied(t)
	_, seen := e.ids(t, rdb, "orders")
	dup := 0
	for i, id := range ids {
		want := 1
		if i < 30 {
			want = 2 // the stopped batch
		}
		if seen[id] != want {
			t.Errorf("id %d (%s) published %d times, want %d", i, id, seen[id], want)
		}
		dup += seen[id] - 1
	}
	if dup != 30 {
		t.Errorf("%d duplicates, want 30", dup)
	}
}

// Two relays at once share the work: every row is published; the
// duplicates (none expected, with SKIP LOCKED) are counted.
func twoRelays(t *testing.T, e *outboxEnv) {
	rdb := e.client(t)
	var published, failures [2]atomic.Int64
	var lastErr sync.Map
	for i := range published {
		e.relay(t, rdb, 20, func(s RelayCounts) {
			published[i].Store(s.Published)
			failures[i].Store(s.Failures)
			if s.Err != nil {
				lastErr.Store(s.Err.Error(), true)
			}
		})
	}
	var ids []string
	for i := range 10 {
		ids = append(ids, e.publish(t, "orders", i*100, 100, 5)...)
	}
	e.emptied(t)
	entries, seen := e.ids(t, rdb, "orders")
	for _, id := range ids {
		if seen[id] == 0 {
			t.Errorf("id %s not published", id)
		}
	}
	dups := entries - len(seen)
	if dups != 0 {
		t.Errorf("%d rows published twice", dups)
	}
	t.Logf("%d entries, %d distinct, %d duplicates; relays published %d and %d, failed %d and %d batches",
		entries, len(seen), dups, published[0].Load(), published[1].Load(), failures[0].Load(), failures[1].Load())
	lastErr.Range(func(k, _ any) bool { t.Logf("relay error: %s", k); return true })
}
