package idemstream_test

// The Consumer on a real redis-server: every event once under producer
// duplicates and concurrent consumers, permanent and transient failures,
// dead consumers, stopping, and the heartbeat.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
	"github.com/idem-go/idem/idemstream"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestEveryEventOnce: 3,000 events, one in ten sent twice by the
// producer (a second entry with the same event id, some right after the
// first, some later), half of them before the consumers start; 2
// consumers of 4 workers each apply every event exactly once and leave
// nothing pending.
func TestEveryEventOnce(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	const events = 3000
	rng := rand.New(rand.NewPCG(1, 2))
	var entries, later []int
	for ev := range events {
		entries = append(entries, ev)
		switch rng.IntN(20) {
		case 0:
			entries = append(entries, ev) // sent again at once
		case 1:
			later = append(later, ev)
		}
	}
	for _, ev := range later { // sent again up to 200 entries later
		at := slices.Index(entries, ev) + 1 + rng.IntN(200)
		entries = slices.Insert(entries, min(at, len(entries)), ev)
	}
	half := len(entries) / 2
	produce(t, rdb, "events", entries[:half])

	a := newApplier(rdb, "app")
	for i := range 2 {
		c := idemstream.New(newIdem(t, addr), newClient(t, addr), "events", "appliers", fmt.Sprint("consumer-", i),
			idemstream.WithKey(eventKey), idemstream.WithWorkers(4), quiet)
		start(t, c, a.apply)
	}
	ids := produce(t, rdb, "events", entries[half:])
	drained(t, rdb, "events", "appliers", ids[len(ids)-1], 3*time.Minute)

	counts := a.counts(t)
	if len(counts) != events {
		t.Errorf("%d events applied, want %d", len(counts), events)
	}
	for ev := range events {
		if n := counts[eventID(ev)]; n != 1 {
			t.Errorf("event %s applied %d times, want 1", eventID(ev), n)
		}
	}
	if n := pending(t, rdb, "events", "appliers"); n != 0 {
		t.Errorf("XPENDING: %d entries pending, want 0", n)
	}
	if dl := deadLetters(t, rdb, "events:dead"); len(dl) != 0 {
		t.Errorf("%d entries dead-lettered, want none: %v", len(dl), dl)
	}
	t.Logf("%d entries for %d events", len(entries), events)
}

// TestPermanentFailure: a handler that fails for good runs once; the entry
// is acknowledged, not dead-lettered, and a second entry of the same event
// replays the failure without running the handler.
func TestPermanentFailure(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	var runs atomic.Int64
	h := func(ctx context.Context, m redis.XMessage) error {
		if eventKey(m) == "ev-1" {
			runs.Add(1)
			return idem.Permanent(errors.New("account closed"))
		}
		return nil
	}
	produce(t, rdb, "s", []int{0, 1, 2})
	c := idemstream.New(newIdem(t, addr), rdb, "s", "g", "c1", idemstream.WithKey(eventKey),
		idemstream.WithClaimIdle(200*time.Millisecond), idemstream.WithBackoff(10*time.Millisecond, 50*time.Millisecond), quiet)
	r := start(t, c, h)
	ids := produce(t, rdb, "s", []int{3, 1})
	drained(t, rdb, "s", "g", ids[1], time.Minute)
	// Long enough for a redelivery, had the entry been left pending.
	time.Sleep(time.Second)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the failing handler ran %d times, want 1", n)
	}
	if n := pending(t, rdb, "s", "g"); n != 0 {
		t.Errorf("%d entries pending, want 0", n)
	}
	if dl := deadLetters(t, rdb, "s:dead"); len(dl) != 0 {
		t.Errorf("dead-lettered %v, want nothing: a permanent failure is an outcome", dl)
	}
}

// TestTransientFailures: an entry whose handler always fails transiently
// is tried WithMaxDeliveries times, then copied to the dead-letter stream
// with its fields, ID, delivery count and last error, and acknowledged;
// one that fails twice and then succeeds is acknowledged, not
// dead-lettered.
func TestTransientFailures(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	errDown := errors.New("downstream unavailable")
	var mu sync.Mutex
	runs := map[string][]int64{} // event → attempt numbers
	h := func(ctx context.Context, m redis.XMessage) error {
		a, _ := idem.AttemptFrom(ctx)
		mu.Lock()
		defer mu.Unlock()
		ev := eventKey(m)
		runs[ev] = append(runs[ev], a.Number)
		switch {
		case ev == "ev-1":
			return fmt.Errorf("apply %s: %w", ev, errDown)
		case ev == "ev-2" && len(runs[ev]) < 3:
			return errDown
		}
		return nil
	}
	hook := make(chan idemstream.DeadLetter, 10)
	ids := produce(t, rdb, "s", []int{0, 1, 2, 3})
	c := idemstream.New(newIdem(t, addr), rdb, "s", "g", "c1", idemstream.WithKey(eventKey),
		idemstream.WithMaxDeliveries(3), idemstream.WithBackoff(10*time.Millisecond, 40*time.Millisecond),
		idemstream.WithOnDeadLetter(func(_ context.Context, d idemstream.DeadLetter) { hook <- d }), quiet)
	r := start(t, c, h)
	drained(t, rdb, "s", "g", ids[3], time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	if got := fmt.Sprint(runs["ev-1"]); got != "[1 2 3]" {
		t.Errorf("ev-1 ran as attempts %s, want [1 2 3]", got)
	}
	if got := fmt.Sprint(runs["ev-2"]); got != "[1 2 3]" {
		t.Errorf("ev-2 ran as attempts %s, want [1 2 3]", got)
	}
	mu.Unlock()

	dl := deadLetters(t, rdb, "s:dead")
	if len(dl) != 1 {
		t.Fatalf("dead letters: %v, want exactly ev-1's", dl)
	}
	want := map[string]any{
		"event": "ev-1", "amount": "1",
		idemstream.FieldID: ids[1], idemstream.FieldStream: "s", idemstream.FieldGroup: "g",
		idemstream.FieldConsumer: "c1", idemstream.FieldDeliveries: "3",
	}
	for f, v := range want {
		if dl[0].Values[f] != v {
			t.Errorf("dead letter's %s = %v, want %v (all: %v)", f, dl[0].Values[f], v, dl[0].Values)
		}
	}
	if e, _ := dl[0].Values[idemstream.FieldError].(string); !strings.Contains(e, "apply ev-1: downstream unavailable") {
		t.Errorf("dead letter's %s = %q, want the handler's last error", idemstream.FieldError, e)
	}
	select {
	case d := <-hook:
		if d.Message.ID != ids[1] || d.Deliveries != 3 || !errors.Is(d.Err, errDown) || d.ID != dl[0].ID {
			t.Errorf("hook got %+v, want entry %s, 3 deliveries, errDown, dead-letter ID %s", d, ids[1], dl[0].ID)
		}
	default:
		t.Error("the dead-letter hook was not called")
	}
	if len(hook) != 0 {
		t.Errorf("the dead-letter hook was called %d more times", len(hook))
	}
	if n := pending(t, rdb, "s", "g"); n != 0 {
		t.Errorf("%d entries pending, want 0", n)
	}
}

// TestDeadConsumerTakenOver: a consumer read entries and died without
// acknowledging them; one of them it had handled through Do. Another
// consumer takes them over once they were idle WithClaimIdle: it runs the
// handler for those not handled, acknowledges the handled one with its
// replayed outcome, and takes none over before its time.
func TestDeadConsumerTakenOver(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	const idle = time.Second
	keys := newIdem(t, addr)
	ids := produce(t, rdb, "s", []int{0, 1, 2, 3})
	if err := rdb.XGroupCreate(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// The dead consumer: reads three entries, handles ev-1 through Do, and
	// acknowledges nothing.
	read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{"s", ">"}, Count: 3, Block: -1}).Result()
	if err != nil || len(read[0].Messages) != 3 {
		t.Fatalf("the dead consumer's read: %v, %v", read, err)
	}
	readAt := time.Now()
	if _, err := keys.Do(ctx, door.Key("s/g/", "ev-1"), idem.Fingerprint(read[0].Messages[1].Values), func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	ran := map[string]time.Duration{} // event → when, after the dead consumer's read
	h := func(ctx context.Context, m redis.XMessage) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := ran[eventKey(m)]; ok {
			t.Errorf("%s handled twice", eventKey(m))
		}
		ran[eventKey(m)] = time.Since(readAt)
		return nil
	}
	c := idemstream.New(keys, rdb, "s", "g", "alive", idemstream.WithKey(eventKey), idemstream.WithClaimIdle(idle), quiet)
	r := start(t, c, h)
	drained(t, rdb, "s", "g", ids[3], time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if _, ok := ran["ev-1"]; ok {
		t.Error("ev-1, handled by the dead consumer, ran again")
	}
	for _, ev := range []string{"ev-0", "ev-2"} {
		if d, ok := ran[ev]; !ok || d < idle*9/10 {
			t.Errorf("%s, held by the dead consumer: ran %v after its read (%v), want once, no earlier than the claim idle %v", ev, d, ok, idle)
		}
	}
	if _, ok := ran["ev-3"]; !ok {
		t.Error("ev-3, never read, was not handled")
	}
}

// TestOverDelivered: an entry whose consumers kept dying while they held
// it (Redis delivered it more than WithMaxDeliveries times) is
// dead-lettered without running its handler, unless its outcome is
// stored: then it is acknowledged.
func TestOverDelivered(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	keys := newIdem(t, addr)
	ids := produce(t, rdb, "s", []int{0, 1})
	if err := rdb.XGroupCreate(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "crashed", Streams: []string{"s", ">"}, Count: 2, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	for range 3 { // deliveries 2, 3, 4: crashes, as XAUTOCLAIM counts them
		if err := rdb.XClaim(ctx, &redis.XClaimArgs{Stream: "s", Group: "g", Consumer: "crashed", Messages: ids}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := keys.Do(ctx, door.Key("s/g/", "ev-1"), "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	c := idemstream.New(keys, rdb, "s", "g", "c1", idemstream.WithKey(eventKey), idemstream.WithFingerprint(func(redis.XMessage) string { return "" }),
		idemstream.WithMaxDeliveries(3), idemstream.WithClaimIdle(100*time.Millisecond), quiet)
	r := start(t, c, func(context.Context, redis.XMessage) error { runs.Add(1); return nil })
	drained(t, rdb, "s", "g", ids[1], time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times, want 0", n)
	}
	dl := deadLetters(t, rdb, "s:dead")
	if len(dl) != 1 || dl[0].Values[idemstream.FieldID] != ids[0] || dl[0].Values[idemstream.FieldDeliveries] != "5" ||
		!strings.Contains(dl[0].Values[idemstream.FieldError].(string), idemstream.ErrTooManyDeliveries.Error()) {
		t.Errorf("dead letters %v, want ev-0's, delivered 5 times, ErrTooManyDeliveries", dl)
	}
}

// TestStopping: when Run's context ends, Run waits for the handler that
// runs, which finishes and is acknowledged; the entries read and not
// started stay pending, and the next Run under the same name takes them
// back at once. With a short drain timeout, the handler's context is
// cancelled, and its entry stays pending too.
func TestStopping(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	keys := newIdem(t, addr)
	ids := produce(t, rdb, "s", []int{0, 1, 2, 3, 4})
	started, release := make(chan string, 10), make(chan struct{})
	h := func(ctx context.Context, m redis.XMessage) error {
		started <- eventKey(m)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := idemstream.New(keys, rdb, "s", "g", "c1", idemstream.WithKey(eventKey), quiet)
	r := start(t, c, h)
	if ev := <-started; ev != "ev-0" {
		t.Fatalf("first handled %s, want ev-0", ev)
	}
	r.cancel()
	select {
	case err := <-r.done:
		t.Fatalf("Run returned (%v) while its handler ran", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := pending(t, rdb, "s", "g"); n != 4 {
		t.Errorf("%d entries pending after the stop, want the 4 read and not started", n)
	}

	// A drain timeout that cuts the handler short.
	release = make(chan struct{})
	c = idemstream.New(keys, rdb, "s", "g", "c1", idemstream.WithKey(eventKey), idemstream.WithDrainTimeout(200*time.Millisecond), quiet)
	r = start(t, c, h)
	if ev := <-started; ev != "ev-1" {
		t.Fatalf("the restarted consumer first handled %s, want ev-1, which it held", ev)
	}
	r.cancel()
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := pending(t, rdb, "s", "g"); n != 4 {
		t.Errorf("%d entries pending after the drain timeout, want 4", n)
	}

	close(release)
	r = start(t, idemstream.New(keys, rdb, "s", "g", "c1", idemstream.WithKey(eventKey), quiet), h)
	drained(t, rdb, "s", "g", ids[4], time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := []string{}
	for len(started) > 0 {
		got = append(got, <-started)
	}
	if fmt.Sprint(got) != "[ev-1 ev-2 ev-3 ev-4]" {
		t.Errorf("the last run handled %v, want ev-1 to ev-4 in order", got)
	}
}

// TestHeartbeat: a handler that runs for several claim-idle times keeps its
// entry, and the entry waiting behind it: another consumer takes neither
// over, and Redis counts one delivery each.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	const idle = 400 * time.Millisecond
	ids := produce(t, rdb, "s", []int{0, 1})
	var mu sync.Mutex
	by := map[string][]string{} // event → consumers that ran it
	handler := func(name string) idemstream.Handler {
		return func(ctx context.Context, m redis.XMessage) error {
			mu.Lock()
			by[eventKey(m)] = append(by[eventKey(m)], name)
			mu.Unlock()
			if eventKey(m) == "ev-0" {
				time.Sleep(5 * idle)
			}
			return nil
		}
	}
	opts := []idemstream.Option{idemstream.WithKey(eventKey), idemstream.WithClaimIdle(idle), quiet}
	r1 := start(t, idemstream.New(newIdem(t, addr), newClient(t, addr), "s", "g", "slow", opts...), handler("slow"))
	eventually(t, 10*time.Second, "the slow consumer to start ev-0", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(by["ev-0"]) == 1
	})
	r2 := start(t, idemstream.New(newIdem(t, addr), newClient(t, addr), "s", "g", "other", opts...), handler("other"))
	time.Sleep(3 * idle)
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: "s", Group: "g", Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range p {
		if e.Consumer != "slow" || e.RetryCount != 1 {
			t.Errorf("while ev-0 runs: entry %s pending with %s, delivered %d times; want with slow, once", e.ID, e.Consumer, e.RetryCount)
		}
	}
	drained(t, rdb, "s", "g", ids[1], time.Minute)
	for _, r := range []*running{r1, r2} {
		if err := r.stop(t); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(by) != "map[ev-0:[slow] ev-1:[slow]]" {
		t.Errorf("handled by %v, want both by the slow consumer, once", by)
	}
}

// TestRedisRestarts: the stream's Redis is killed while the consumer
// waits for entries, and restarted from its append-only file: Run goes on
// and reports the failed reads through its logger. Then idem's Redis (a
// server of its own) is killed while entries arrive: Do fails before the
// handler runs, which is not a delivery, so with WithMaxDeliveries(1)
// nothing is dead-lettered; the entries are handled once it is back.
func TestRedisRestarts(t *testing.T) {
	t.Parallel()
	streams := redistest.Start(t, redistest.Config{AppendOnly: true})
	records := redistest.Start(t, redistest.Config{AppendOnly: true})
	rdb := newClient(t, streams.Addr())
	a := newApplier(rdb, "app")
	var l logs
	// idem's client gives up on a dead server at once, so that Do fails
	// while it is down.
	fast := redis.NewClient(&redis.Options{Addr: records.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = fast.Close() })
	keys := idem.New(fast, idem.WithLease(testLease), idem.WithLogger(nil))
	t.Cleanup(func() { _ = keys.Close() })
	c := idemstream.New(keys, newClient(t, streams.Addr()), "s", "g", "c1", idemstream.WithKey(eventKey),
		idemstream.WithMaxDeliveries(1), idemstream.WithBackoff(10*time.Millisecond, 200*time.Millisecond),
		idemstream.WithLogger(slog.New(&l)))
	r := start(t, c, a.apply)
	ids := produce(t, rdb, "s", []int{0, 1, 2})
	drained(t, rdb, "s", "g", ids[2], time.Minute)

	streams.Kill()
	time.Sleep(1500 * time.Millisecond)
	streams.Restart(t)
	ids = produce(t, rdb, "s", []int{3, 4, 5})
	drained(t, rdb, "s", "g", ids[2], time.Minute)
	reported := false
	for _, m := range l.all() {
		reported = reported || strings.Contains(m, "read new entries failed; trying again")
	}
	if !reported {
		t.Errorf("the failed reads were not reported; the logger got %q", l.all())
	}

	records.Kill()
	ids = produce(t, rdb, "s", []int{6, 7, 8})
	time.Sleep(1500 * time.Millisecond)
	records.Restart(t)
	drained(t, rdb, "s", "g", ids[2], time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	counts := a.counts(t)
	for ev := range 9 {
		if n := counts[eventID(ev)]; n != 1 {
			t.Errorf("%s applied %d times, want 1", eventID(ev), n)
		}
	}
	if dl := deadLetters(t, rdb, "s:dead"); len(dl) != 0 {
		t.Errorf("dead-lettered %v, want nothing: Redis's failures before the handler are not deliveries", dl)
	}
}
