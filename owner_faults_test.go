package idem_test

// Faults after fn ran, each on a real redis-server: the completion's reply
// lost, storing the outcome failing, the owner's context ending, fn
// panicking, a result too large (rows 5, 8, 14, 15, 17 of docs/faults.md).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Row 5: the completion's reply is lost. Completion is compare-and-set on
// the owner token, so its repeat (by go-redis, or by Do's own retry when
// go-redis has none left) is a no-op that succeeds: Do returns the result,
// fn ran once.
func TestCompletionReplyLost(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	complete := idemtest.IsScript(t, "complete")
	ctx := context.Background()
	var l idemtest.Runs

	for _, tc := range []struct {
		name string
		ro   func(*redis.Options)
	}{
		{"go-redis retries", nil},
		{"Do retries", idemtest.NoRetry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.name
			count, completions := idemtest.Count(complete)
			in := faultconn.New(count, faultconn.Rule{Match: complete, Nth: 1, Action: faultconn.DropReply})
			c := idemtest.Faulty(t, b, in, tc.ro)
			// A waiter in another Client gets the result too.
			waiter := b.Idem(t)
			finishGate := make(chan struct{})
			out := make(chan [2]any, 1)
			go func() {
				<-finishGate
				res, err := waiter.Do(ctx, key, "fp", l.Fn("waiter"))
				out <- [2]any{string(res), err}
			}()
			res, err := c.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				a := l.Add(ctx)
				close(finishGate)
				time.Sleep(20 * time.Millisecond) // let the waiter find the key busy
				return []byte(fmt.Sprint("ok#", a.Number)), nil
			})
			if err != nil || string(res) != "ok#1" {
				t.Fatalf("got %q, %v; want ok#1", res, err)
			}
			if n := in.Hits(); n != 1 {
				t.Fatalf("%d replies dropped, want 1", n)
			}
			if n := completions.Load(); n != 2 {
				t.Fatalf("the completion was sent %d times, want 2", n)
			}
			if got := <-out; got[1] != nil || got[0] != "ok#1" {
				t.Fatalf("waiter: got %v, want ok#1", got)
			}
			l.Want(t, key, "[1]")
			idemtest.WantStatus(t, b, key, idem.StateDone, 1)
			idemtest.Replay(t, b, key, "ok#1", &l)
		})
	}

	// Every reply lost until the store timeout: the outcome was stored,
	// but Do cannot know it and says it may not be. Nothing runs twice.
	t.Run("every reply lost", func(t *testing.T) {
		in := faultconn.New(faultconn.Rule{Match: complete, Action: faultconn.DropReply})
		c := idemtest.Faulty(t, b, in, idemtest.NoRetry, idem.WithStoreTimeout(200*time.Millisecond))
		res, err := c.Do(ctx, "all", "fp", l.Fn("ok"))
		if !errors.Is(err, idem.ErrNotRecorded) || string(res) != "ok#1" {
			t.Fatalf("got %q, %v; want fn's result with ErrNotRecorded", res, err)
		}
		if n := in.Hits(); n < 2 {
			t.Fatalf("the completion was tried %d times, want retries", n)
		}
		idemtest.WantStatus(t, b, "all", idem.StateDone, 1)
		idemtest.Replay(t, b, "all", "ok#1", &l)
		l.Want(t, "all", "[1]")
	})
}

// faultTakeoverAfterLease checks what a claim whose outcome was not
// recorded must leave: the key stays claimed (a call that does not wait
// gets ErrInProgress), and once the lease has ended the next call runs fn
// as attempt 2.
func faultTakeoverAfterLease(t *testing.T, b *idemtest.Backend, key string, lease time.Duration, l *idemtest.Runs) {
	t.Helper()
	ctx := context.Background()
	st := idemtest.WantStatus(t, b, key, idem.StateInProgress, 1)
	_, err := b.Idem(t, idem.WithWait(0), idem.WithLease(lease)).Do(ctx, key, "fp", l.Fn("too-early"))
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("during the lease: got %v, want ErrInProgress", err)
	}
	var started time.Time
	res, err := b.Idem(t, idem.WithWait(5*lease), idem.WithLease(lease)).Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
		started = time.Now()
		a := l.Add(ctx)
		return []byte(fmt.Sprint("next#", a.Number)), nil
	})
	if err != nil || string(res) != "next#2" {
		t.Fatalf("after the lease: got %q, %v; want next#2", res, err)
	}
	if early := st.LeaseEnds.Sub(started); early > 20*time.Millisecond {
		t.Fatalf("the next attempt started %v before the lease ended", early)
	}
}

// Row 8: fn ran, but its outcome cannot be stored. Do never releases the
// key (fn has acted), retries with a detached context until the store
// timeout, and returns fn's result with an error wrapping ErrNotRecorded.
// The key stays claimed until the lease ends; then attempt 2 runs.
func TestStoreFailsAfterFnRan(t *testing.T) {
	t.Parallel()
	// Three seconds: beside busy loops, a killed server's restart took
	// most of a one-second lease.
	const lease = 3 * time.Second
	ctx := context.Background()

	// The connection is cut before every completion (but not before a
	// release): a Do that gave the key back would leave it released.
	t.Run("connection cut", func(t *testing.T) {
		b := idemtest.FaultRedis(t, redistest.Config{})
		complete := idemtest.IsScript(t, "complete")
		count, completions := idemtest.Count(complete)
		in := faultconn.New(count, faultconn.Rule{Match: complete, Action: faultconn.CloseBefore})
		c := idemtest.Faulty(t, b, in, nil, idem.WithLease(lease), idem.WithStoreTimeout(300*time.Millisecond))
		var l idemtest.Runs
		res, err := c.Do(ctx, "k", "fp", l.Fn("ok"))
		if !errors.Is(err, idem.ErrNotRecorded) || string(res) != "ok#1" {
			t.Fatalf("got %q, %v; want fn's result with ErrNotRecorded", res, err)
		}
		// go-redis sends it 4 times (MaxRetries 3) per try of Do.
		if n := completions.Load(); n < 8 {
			t.Fatalf("the completion was sent %d times: Do did not retry it", n)
		}
		faultTakeoverAfterLease(t, b, "k", lease, &l)
		l.Want(t, "k", "[1 2]")
	})

	// Redis runs out of memory inside fn, and the result is large: the
	// completion's HSET is refused.
	t.Run("out of memory", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{})
		c := b.Idem(t, idem.WithLease(lease), idem.WithStoreTimeout(300*time.Millisecond))
		var l idemtest.Runs
		big := make([]byte, 512<<10)
		res, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			used := idemtest.Info(t, b, "memory", "used_memory")
			b.Do(t, "CONFIG", "SET", "maxmemory", used+256<<10)
			return big, nil
		})
		b.Do(t, "CONFIG", "SET", "maxmemory", 0)
		if !errors.Is(err, idem.ErrNotRecorded) || !strings.Contains(err.Error(), "OOM") || len(res) != len(big) {
			t.Fatalf("got %d bytes, %v; want fn's result with ErrNotRecorded naming OOM", len(res), err)
		}
		faultTakeoverAfterLease(t, b, "k", lease, &l)
		l.Want(t, "k", "[1 2]")
	})

	// The server dies inside fn and comes back with its append-only file:
	// the claim is still there, unreleased.
	t.Run("server killed", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{AppendOnly: true})
		c := b.Idem(t, idem.WithLease(lease), idem.WithStoreTimeout(200*time.Millisecond))
		var l idemtest.Runs
		res, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			b.Srv.Kill()
			return []byte("ok"), nil
		})
		if !errors.Is(err, idem.ErrNotRecorded) || string(res) != "ok" {
			t.Fatalf("got %q, %v; want fn's result with ErrNotRecorded", res, err)
		}
		b.Srv.Restart(t)
		faultTakeoverAfterLease(t, b, "k", lease, &l)
		l.Want(t, "k", "[1 2]")
	})
}

// Row 14: the owner's context ends while fn runs or while its outcome is
// being stored: the outcome is recorded all the same, with a detached
// context. The client honours context deadlines on reads
// (ContextTimeoutEnabled) and every completion's reply is slow, so a
// completion that used the caller's context would fail.
func TestOwnerContextEndsDuringFn(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "complete"), Action: faultconn.DelayReply, Delay: 150 * time.Millisecond})
	c := idemtest.Faulty(t, b, in, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	var l idemtest.Runs

	for _, tc := range []struct {
		name string
		// ctx returns the caller's context; fn runs inside fn, before it
		// returns its result.
		ctx func() (context.Context, context.CancelFunc)
		fn  func(ctx context.Context, cancel context.CancelFunc)
	}{
		{"cancelled in fn",
			func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			func(_ context.Context, cancel context.CancelFunc) { cancel() }},
		{"deadline passes in fn",
			func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 100*time.Millisecond)
			},
			func(ctx context.Context, _ context.CancelFunc) { <-ctx.Done() }},
		{"cancelled while storing",
			func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			func(_ context.Context, cancel context.CancelFunc) { time.AfterFunc(30*time.Millisecond, cancel) }},
		{"deadline passes while storing",
			func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 300*time.Millisecond)
			},
			func(ctx context.Context, _ context.CancelFunc) {
				dl, _ := ctx.Deadline()
				time.Sleep(time.Until(dl) - 50*time.Millisecond)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.name
			ctx, cancel := tc.ctx()
			defer cancel()
			res, err := c.Do(ctx, key, "fp", func(fctx context.Context) ([]byte, error) {
				a := l.Add(fctx)
				tc.fn(fctx, cancel)
				return []byte(fmt.Sprint("r#", a.Number)), nil
			})
			if err != nil || string(res) != "r#1" {
				t.Fatalf("got %q, %v; want r#1 recorded", res, err)
			}
			idemtest.WantStatus(t, b, key, idem.StateDone, 1)
			idemtest.Replay(t, b, key, "r#1", &l)
			l.Want(t, key, "[1]")
		})
	}

	// The caller's deadline at random points: before the claim, during it,
	// during fn (which sometimes obeys it and fails), during the storing.
	t.Run("random points", func(t *testing.T) {
		in.Reset()
		seed := time.Now().UnixNano()
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(uint64(seed), 0))
		for i := range 40 {
			key := fmt.Sprint("random-", i)
			if rng.IntN(2) == 0 {
				in.Reset()
				in.Add(faultconn.Rule{Match: idemtest.IsScript(t, "complete"), Action: faultconn.DelayReply,
					Delay: time.Duration(rng.IntN(20)) * time.Millisecond})
			}
			timeout := time.Duration(rng.IntN(8000)) * time.Microsecond
			work := time.Duration(rng.IntN(8000)) * time.Microsecond
			obey := rng.IntN(2) == 0
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			var ret string // what fn returned: a result, "error", or "" if it did not run
			res, err := c.Do(ctx, key, "fp", func(fctx context.Context) ([]byte, error) {
				a := l.Add(fctx)
				select {
				case <-time.After(work):
				case <-fctx.Done():
					if obey {
						ret = "error"
						return nil, fctx.Err()
					}
					time.Sleep(work)
				}
				ret = fmt.Sprint("r#", a.Number)
				return []byte(ret), nil
			})
			cancel()
			st := idemtest.Status(t, b, key)
			what := fmt.Sprintf("key %s (timeout %v, work %v, obey %v): Do got %q, %v; state %v",
				key, timeout, work, obey, res, err, st.State)
			switch ret {
			case "":
				if err == nil || l.Count(key) != 0 {
					t.Fatalf("%s; fn did not run, want an error", what)
				}
				// A claim made after the deadline is given back in the
				// background: Do does not wait for it.
				deadline := time.Now().Add(5 * time.Second)
				for st.State == idem.StateInProgress && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
					st = idemtest.Status(t, b, key)
				}
				if st.State != idem.StateAbsent && st.State != idem.StateReleased {
					t.Fatalf("%s; want the claim not made or given back (now %v)", what, st.State)
				}
			case "error":
				if !errors.Is(err, context.DeadlineExceeded) || st.State != idem.StateReleased {
					t.Fatalf("%s; want fn's error and the key released", what)
				}
			default:
				if err != nil || string(res) != ret || st.State != idem.StateDone {
					t.Fatalf("%s; want fn's result %q, recorded", what, ret)
				}
				idemtest.Replay(t, b, key, ret, &l)
			}
			if n := l.Count(key); n > 1 {
				t.Fatalf("%s; fn ran %d times", what, n)
			}
		}
	})
}

// Row 15: fn panics. The claim is released and the waiters woken: a waiter
// in another Client (pub/sub alone, no polling) and one in the owner's
// Client take over as attempt 2 at once, not after the 30s lease; the panic
// goes on in the owner; no goroutine is left behind.
func TestPanicWakesWaiters(t *testing.T) {
	// Not parallel: it checks for leaked goroutines, which parallel tests would start.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the other cleanups
	b := idemtest.Redis(t, redistest.Config{})
	owner := b.Idem(t)
	other := b.Idem(t, idem.WithWait(wakeBudget))
	idem.NoPolling(other)
	var l idemtest.Runs
	type boom struct{ why string }
	inFn, explode := make(chan struct{}), make(chan struct{})
	recovered := make(chan any, 1)
	go func() {
		defer func() { recovered <- recover() }()
		_, _ = owner.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			close(inFn)
			<-explode
			panic(boom{"fn exploded"})
		})
	}()
	<-inFn
	outOther := waitFor(other, "k", &l)
	outSame := waitFor(owner, "k", &l)
	idemtest.Eventually(t, 5*time.Second, "the waiter's subscription", func() bool { return idem.Subscribed(other) == 1 })
	time.Sleep(20 * time.Millisecond) // let the confirmation's recheck pass
	t0 := time.Now()
	close(explode)
	if p := <-recovered; p != (boom{"fn exploded"}) {
		t.Fatalf("the owner recovered %v, want fn's panic", p)
	}
	gotOther, gotSame := <-outOther, <-outSame
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("the waiters took %v: they were not woken by the release", d)
	}
	if gotOther[1] != nil || gotSame[1] != nil || gotOther[0] != "waiter#2" || gotSame[0] != "waiter#2" {
		t.Fatalf("waiters got %v and %v; want both waiter#2", gotOther, gotSame)
	}
	l.Want(t, "k", "[1 2]")
}

// Row 17, literally: a 10 MiB result against a 1 MiB cap. It is stored as a
// permanent failure (never run again); the 10 MiB never reach Redis, and
// the notification carries the small failure record, not the result.
func TestHugeResult(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c := b.Idem(t, idem.WithMaxResultSize(1<<20))
	ctx := context.Background()
	var l idemtest.Runs
	ps := b.Client(t).Subscribe(ctx, idem.ChannelKey(c, "huge"))
	defer ps.Close()
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	in0 := idemtest.Info(t, b, "stats", "total_net_input_bytes")

	huge := func(ctx context.Context) ([]byte, error) {
		l.Add(ctx)
		return make([]byte, 10<<20), nil
	}
	res, err := c.Do(ctx, "huge", "fp", huge)
	if !errors.Is(err, idem.ErrTooLarge) || res != nil {
		t.Fatalf("owner: got %d bytes, %v; want no result and ErrTooLarge", len(res), err)
	}
	m, err := ps.ReceiveTimeout(ctx, 5*time.Second)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	if msg, ok := m.(*redis.Message); !ok || len(msg.Payload) > 4096 || !strings.Contains(msg.Payload, "10485760 bytes") {
		t.Fatalf("notification %T %.100v, want the failure record, at most 4096 bytes", m, m)
	}
	if in := idemtest.Info(t, b, "stats", "total_net_input_bytes") - in0; in > 64<<10 {
		t.Fatalf("Redis received %d bytes for the call: the result was sent", in)
	}
	if n := b.Do(t, "MEMORY", "USAGE", idem.RecordKey(c, "huge")).(int64); n > 4<<10 {
		t.Fatalf("the record takes %d bytes", n)
	}
	_, err = b.Idem(t).Do(ctx, "huge", "fp", huge)
	var se *idem.StoredError
	if !errors.As(err, &se) || !strings.Contains(se.Message, "10485760 bytes") {
		t.Fatalf("replay: got %v, want the stored failure naming the size", err)
	}
	l.Want(t, "huge", "[1]")
}
