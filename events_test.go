package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/benchrun"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Every kind of event, each provoked on a real redis-server.

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []idem.Event
}

func (r *recorder) Observe(_ context.Context, e idem.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// take returns the events so far and forgets them.
func (r *recorder) take() []idem.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// kinds is the kinds of events, in order, as "waited,replayed".
func kinds(ev []idem.Event) string {
	var s []string
	for _, e := range ev {
		s = append(s, e.Kind.String())
	}
	return strings.Join(s, ",")
}

var testSecret = []byte("0123456789abcdef-event-secret")

// observed returns a Client on b whose events go to a new recorder.
func observed(t *testing.T, b *idemtest.Backend, opts ...idem.Option) (*idem.Client, *recorder) {
	t.Helper()
	r := &recorder{}
	c := b.Idem(t, append([]idem.Option{idem.WithObserver(r), idem.WithEventKeySecret(testSecret)}, opts...)...)
	return c, r
}

// mustKinds fails the test unless ev has the kinds want.
func mustKinds(t *testing.T, ev []idem.Event, want string) {
	t.Helper()
	if got := kinds(ev); got != want {
		t.Fatalf("events %s (%+v), want %s", got, ev, want)
	}
}

func TestEventExecutedAndReplayed(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c, r := observed(t, b)
	ctx := context.Background()
	var l idemtest.Runs
	if _, err := c.Do(ctx, "order-1", "fp", l.Fn("ok")); err != nil {
		t.Fatal(err)
	}
	ev := r.take()
	mustKinds(t, ev, "executed")
	e := ev[0]
	if e.Attempt != 1 || e.Err != nil || e.Duration <= 0 || e.Owned <= 0 || e.Owned > e.Duration || e.Wait != 0 {
		t.Fatalf("executed: %+v", e)
	}
	if want := idem.EventKeyDigest(testSecret, "order-1"); e.Key != want || len(e.Key) != 32 || e.RawKey != "" {
		t.Fatalf("key %q, raw %q; want the digest %q and no raw key", e.Key, e.RawKey, want)
	}
	if !e.Kind.Ran() || !e.Kind.Outcome() {
		t.Fatalf("executed is not an outcome that ran fn")
	}

	if _, err := c.Do(ctx, "order-1", "fp", l.Fn("again")); err != nil {
		t.Fatal(err)
	}
	ev = r.take()
	mustKinds(t, ev, "replayed")
	if ev[0].Err != nil || ev[0].Owned != 0 || ev[0].Key != e.Key {
		t.Fatalf("replayed: %+v", ev[0])
	}
	if ev[0].Kind.Ran() {
		t.Fatalf("a replay ran fn")
	}
	if n := l.Count("order-1"); n != 1 {
		t.Fatalf("fn ran %d times", n)
	}
}

// Each call reports its own events: the calls made inside fn do not
// change the outer call's (its outcome stays executed although the last
// inner call was a replay), and a call with a nil fn reports an error.
func TestEventsOfCallsInsideFn(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c, r := observed(t, b)
	ctx := context.Background()
	_, err := c.Do(ctx, "outer", "", func(ctx context.Context) ([]byte, error) {
		if _, err := c.Do(ctx, "inner", "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
			return nil, err
		}
		return c.Do(ctx, "inner", "", func(context.Context) ([]byte, error) { return nil, nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := r.take()
	mustKinds(t, ev, "executed,replayed,executed")
	inner, outer := idem.EventKeyDigest(testSecret, "inner"), idem.EventKeyDigest(testSecret, "outer")
	if ev[0].Key != inner || ev[1].Key != inner || ev[2].Key != outer || ev[2].Attempt != 1 {
		t.Fatalf("events %+v: want inner's executed and replayed, then outer's executed", ev)
	}
	if _, err := c.Do(ctx, "outer", "", nil); err == nil {
		t.Fatal("a nil fn was accepted")
	}
	mustKinds(t, r.take(), "error")
}

func TestEventRawKeys(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c, r := observed(t, b, idem.WithRawEventKeys(true))
	if _, err := c.Do(context.Background(), "k\x00{}", "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	ev := r.take()
	if len(ev) != 1 || ev[0].RawKey != "k\x00{}" || ev[0].Key != idem.EventKeyDigest(testSecret, "k\x00{}") {
		t.Fatalf("events %+v", ev)
	}
}

func TestEventConflict(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c, r := observed(t, b)
	ctx := context.Background()
	var l idemtest.Runs
	if _, err := c.Do(ctx, "k", "amount=1", l.Fn("ok")); err != nil {
		t.Fatal(err)
	}
	r.take()
	_, err := c.Do(ctx, "k", "amount=2", l.Fn("other"))
	ev := r.take()
	mustKinds(t, ev, "conflict")
	if !errors.Is(err, idem.ErrConflict) || !errors.Is(ev[0].Err, idem.ErrConflict) {
		t.Fatalf("Do: %v; event: %+v", err, ev[0])
	}
}

// A waiter in another Client waits for the owner, then replays its result;
// one that runs out of wait gets ErrInProgress.
func TestEventWaitedAndInProgress(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	owner := b.Idem(t)
	waiter, r := observed(t, b, idem.WithWait(wakeBudget))
	var l idemtest.Runs
	finish, done := startOwner(t, owner, "k", &l)

	// The budget counts from the call's start: with 100ms, a claim slowed
	// by a loaded machine left no time to wait (TestSuiteBesideBusyGoroutines).
	const budget = time.Second
	short, rs := observed(t, b, idem.WithWait(budget))
	_, err := short.Do(context.Background(), "k", "fp", l.Fn("never"))
	ev := rs.take()
	mustKinds(t, ev, "waited,in_progress")
	if !errors.Is(err, idem.ErrInProgress) || !errors.Is(ev[1].Err, idem.ErrInProgress) {
		t.Fatalf("Do: %v; events %+v", err, ev)
	}
	if ev[0].Attempt != 1 || ev[1].Attempt != 1 || ev[0].Wait < budget/10 || ev[1].Wait != ev[0].Wait || ev[1].Duration < budget {
		t.Fatalf("in progress: events %+v; want attempt 1 and the wait (about %v) on both", ev, budget)
	}

	out := waitFor(waiter, "k", &l)
	awaitSubscribed(t, waiter)
	const held = 50 * time.Millisecond
	time.Sleep(held)
	finish("ok", nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := <-out; got[1] != nil || got[0] != "ok" {
		t.Fatalf("waiter: %v", got)
	}
	ev = r.take()
	mustKinds(t, ev, "waited,replayed")
	if ev[0].Attempt != 1 || ev[0].Wait < held || ev[1].Wait != ev[0].Wait || ev[1].Duration < ev[1].Wait {
		t.Fatalf("waited: %+v", ev)
	}
}

// A duplicate in the same process waits for the leader's call and shares
// its result: for it, a wait and a replay.
func TestEventInProcessDuplicate(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c, r := observed(t, b)
	var l idemtest.Runs
	finish, done := startOwner(t, c, "k", &l)
	out := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), "k", "fp", l.Fn("never"))
		out <- err
	}()
	idemtest.Eventually(t, 10*time.Second, "the duplicate to join the flight", func() bool { return idem.HasFollower(c, "k") })
	time.Sleep(5 * time.Millisecond) // some wait to measure
	finish("ok", nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-out; err != nil {
		t.Fatal(err)
	}
	ev := r.take()
	// The owner's executed and the duplicate's waited and replayed, in an
	// order that the two goroutines decide.
	var got []string
	for _, e := range ev {
		got = append(got, e.Kind.String())
	}
	if s := strings.Join(got, ","); s != "executed,waited,replayed" && s != "waited,replayed,executed" && s != "waited,executed,replayed" {
		t.Fatalf("events %s", s)
	}
	for _, e := range ev {
		if e.Kind == idem.EventReplayed && e.Wait <= 0 {
			t.Fatalf("the duplicate's replay waited %v, want its wait", e.Wait)
		}
	}
}

// The owner of attempt 1 is gone (its lease ended): the next call takes
// over as attempt 2.
func TestEventTookOver(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c, r := observed(t, b)
	ttl := 24 * time.Hour
	b.Do(t, "SET", idem.RecordKey(c, "k"), idemtest.InProgress("gone-owner", 1, ttl, 0), "PX", ttl.Milliseconds())
	var l idemtest.Runs
	if _, err := c.Do(context.Background(), "k", "", l.Fn("ok")); err != nil {
		t.Fatal(err)
	}
	ev := r.take()
	mustKinds(t, ev, "took_over,executed")
	if ev[0].Attempt != 2 || ev[1].Attempt != 2 || ev[0].Duration > ev[1].Duration {
		t.Fatalf("events %+v", ev)
	}
}

// The lease is lost while fn runs: a newer owner's record replaced the
// claim. Whether fn finishes regardless (its completion is refused) or
// gives up when its context ends (the renewal found the newer owner), the
// outcome is lease_lost.
func TestEventLeaseLost(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ttl := 24 * time.Hour
	newer := idemtest.InProgress("newer-owner", 2, ttl, time.Hour)

	t.Run("completion refused", func(t *testing.T) {
		c, r := observed(t, b)
		_, err := c.Do(context.Background(), "k1", "", func(ctx context.Context) ([]byte, error) {
			b.Do(t, "SET", idem.RecordKey(c, "k1"), newer, "PX", ttl.Milliseconds())
			return []byte("late"), nil
		})
		ev := r.take()
		mustKinds(t, ev, "lease_lost")
		if !errors.Is(err, idem.ErrLeaseLost) || !errors.Is(ev[0].Err, idem.ErrLeaseLost) || ev[0].Attempt != 1 || ev[0].Owned <= 0 {
			t.Fatalf("Do: %v; event %+v", err, ev[0])
		}
	})

	t.Run("renewal finds a newer owner", func(t *testing.T) {
		c, r := observed(t, b, idem.WithLease(300*time.Millisecond), idem.WithRetention(time.Hour))
		_, err := c.Do(context.Background(), "k2", "", func(ctx context.Context) ([]byte, error) {
			b.Do(t, "SET", idem.RecordKey(c, "k2"), newer, "PX", ttl.Milliseconds())
			<-ctx.Done() // the renewal, a third of a lease on, cancels it
			return nil, context.Cause(ctx)
		})
		ev := r.take()
		mustKinds(t, ev, "lease_lost")
		if !errors.Is(err, idem.ErrLeaseLost) || ev[0].Attempt != 1 {
			t.Fatalf("Do: %v; event %+v", err, ev[0])
		}
	})
}

func TestEventReleasedAndFailed(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c, r := observed(t, b, idem.WithMaxResultSize(10))
	ctx := context.Background()
	boom := errors.New("downstream said no")

	_, err := c.Do(ctx, "k", "", func(context.Context) ([]byte, error) { return nil, boom })
	ev := r.take()
	mustKinds(t, ev, "released")
	if !errors.Is(err, boom) || ev[0].Err != err || ev[0].Attempt != 1 {
		t.Fatalf("Do: %v; event %+v", err, ev[0])
	}

	// A panic is released too; the event says the call did not return.
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		_, _ = c.Do(ctx, "k", "", func(context.Context) ([]byte, error) { panic("fn broke") })
	}()
	ev = r.take()
	mustKinds(t, ev, "took_over,released")
	if ev[1].Attempt != 2 || ev[1].Err == nil || !strings.Contains(ev[1].Err.Error(), "panicked") {
		t.Fatalf("panic: events %+v", ev)
	}

	_, err = c.Do(ctx, "p", "", func(context.Context) ([]byte, error) { return nil, idem.Permanent(boom) })
	ev = r.take()
	mustKinds(t, ev, "failed")
	if !errors.Is(ev[0].Err, boom) || err == nil {
		t.Fatalf("Do: %v; event %+v", err, ev[0])
	}
	_, err = c.Do(ctx, "p", "", func(context.Context) ([]byte, error) { return nil, nil })
	ev = r.take()
	mustKinds(t, ev, "replayed")
	var se *idem.StoredError
	if !errors.As(ev[0].Err, &se) || !errors.As(err, &se) {
		t.Fatalf("replayed failure: Do %v; event %+v", err, ev[0])
	}

	_, err = c.Do(ctx, "big", "", func(context.Context) ([]byte, error) { return make([]byte, 11), nil })
	ev = r.take()
	mustKinds(t, ev, "failed")
	if !errors.Is(err, idem.ErrTooLarge) || !errors.Is(ev[0].Err, idem.ErrTooLarge) {
		t.Fatalf("too large: Do %v; event %+v", err, ev[0])
	}
}

// Every completion is cut off before it reaches Redis: fn ran, and its
// outcome is not recorded.
func TestEventNotRecorded(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "complete"), Action: faultconn.CloseBefore})
	r := &recorder{}
	c := idemtest.Faulty(t, b, in, nil, idem.WithObserver(r), idem.WithStoreTimeout(200*time.Millisecond))
	var l idemtest.Runs
	_, err := c.Do(context.Background(), "k", "fp", l.Fn("ok"))
	ev := r.take()
	mustKinds(t, ev, "not_recorded")
	if !errors.Is(err, idem.ErrNotRecorded) || !errors.Is(ev[0].Err, idem.ErrNotRecorded) || ev[0].Attempt != 1 {
		t.Fatalf("Do: %v; event %+v", err, ev[0])
	}
}

func TestEventError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("unreachable", func(t *testing.T) {
		addr := redistest.RefusedAddr(t)
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer rdb.Close()
		r := &recorder{}
		c := idem.New(rdb, idem.WithObserver(r), idem.WithLogger(nil))
		defer c.Close()
		var led idemtest.Runs
		_, err := c.Do(ctx, "k", "", led.Fn("never"))
		ev := r.take()
		mustKinds(t, ev, "error")
		if err == nil || !errors.Is(ev[0].Err, err) || strings.Contains(ev[0].Err.Error(), `"k"`) || led.Count("k") != 0 {
			t.Fatalf("Do: %v; event %+v", err, ev[0])
		}
	})
	t.Run("corrupt record and bad key", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{})
		c, r := observed(t, b)
		b.Do(t, "SET", idem.RecordKey(c, "k"), "garbage")
		_, err := c.Do(ctx, "k", "", func(context.Context) ([]byte, error) { return nil, nil })
		ev := r.take()
		mustKinds(t, ev, "error")
		if !errors.Is(err, idem.ErrCorrupt) || !errors.Is(ev[0].Err, idem.ErrCorrupt) {
			t.Fatalf("Do: %v; event %+v", err, ev[0])
		}
		_, err = c.Do(ctx, "", "", func(context.Context) ([]byte, error) { return nil, nil })
		ev = r.take()
		mustKinds(t, ev, "error")
		if !errors.Is(ev[0].Err, idem.ErrInvalidKey) || !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("Do: %v; event %+v", err, ev[0])
		}
	})
}

// spanKey stands for a tracer's span in a context.
type spanKey struct{}

// starter is a CallStarter: what it puts in the call's context reaches fn
// and the observer.
type starter struct {
	recorder
	seen []any
}

func (s *starter) StartCall(ctx context.Context) context.Context {
	return context.WithValue(ctx, spanKey{}, "span")
}

func (s *starter) Observe(ctx context.Context, e idem.Event) {
	s.recorder.Observe(ctx, e)
	s.mu.Lock()
	s.seen = append(s.seen, ctx.Value(spanKey{}))
	s.mu.Unlock()
}

func TestCallStarter(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	s := &starter{}
	c := b.Idem(t, idem.WithObserver(s))
	var inFn any
	_, err := c.Do(context.Background(), "k", "", func(ctx context.Context) ([]byte, error) {
		inFn = ctx.Value(spanKey{})
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if inFn != "span" || fmt.Sprint(s.seen) != "[span]" || kinds(s.take()) != "executed" {
		t.Fatalf("fn saw %v, the observer %v", inFn, s.seen)
	}
}

func TestEventKindNames(t *testing.T) {
	t.Parallel()
	var outcomes []string
	for k := idem.EventKind(1); k.Outcome() || k == idem.EventWaited || k == idem.EventTookOver; k++ {
		if k.Outcome() {
			outcomes = append(outcomes, k.String())
		}
	}
	want := "executed replayed conflict lease_lost released failed not_recorded in_progress error late_retry ledger_replayed parked"
	if got := strings.Join(outcomes, " "); got != want {
		t.Fatalf("outcomes %q, want %q", got, want)
	}
	if s := idem.EventKind(200).String(); s != "EventKind(200)" {
		t.Fatalf("unknown kind: %q", s)
	}
}

// BenchmarkReplayObserved is BenchmarkReplay/100B/idem with an observer
// that does nothing: what taking notes costs a call.
func BenchmarkReplayObserved(b *testing.B) {
	srv := benchRedis(b)
	ctx := context.Background()
	fn := benchResultFn(benchrun.Payload(100))
	for _, tc := range []struct {
		name string
		opts []idem.Option
		ctx  func() context.Context
	}{
		{"observer", []idem.Option{idem.WithObserver(observerFunc(func(context.Context, idem.Event) {}))}, func() context.Context { return ctx }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := benchIdem(b, srv.addr, tc.opts...)
			if _, err := c.Do(ctx, "replay-observed", benchFingerprint, fn); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Do(tc.ctx(), "replay-observed", benchFingerprint, fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestLogObserver(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	var buf syncBuffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := b.Idem(t, idem.WithObserver(idem.LogObserver(l)))
	ttl := 24 * time.Hour
	b.Do(t, "SET", idem.RecordKey(c, "secret-order-77"), idemtest.InProgress("gone-owner", 1, ttl, 0), "PX", ttl.Milliseconds())
	if _, err := c.Do(context.Background(), "secret-order-77", "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	got := buf.String()
	if !strings.Contains(got, "level=WARN") || !strings.Contains(got, `msg="idem: took over"`) || !strings.Contains(got, "attempt=2") ||
		strings.Contains(got, "executed") || strings.Contains(got, "secret-order-77") {
		t.Fatalf("log: %q; want the takeover at WARN, no executed record at DEBUG, no raw key", got)
	}
}
