package idem_test

// Faults of the claim, each on a real redis-server: its reply lost, its
// outcome unknown, the server out of memory or busy (rows 3, 4, 20, 24 of
// docs/faults.md, which maps every row to its tests). The other families:
// owner_faults_test.go (after fn ran), lua_faults_test.go (restarts,
// script flushes), owner_lease_test.go (slow replies and leases), wait_test.go
// (waiters), owner_process_test.go (owners in a child process, rows 6 and 7).
//
// The shared invariant, checked in every test: fn runs at most once per key
// (idemtest.Runs; more only where a row says so), and every Do that returns no
// error returns the same bytes for one key.
//
// Faults on the wire come from internal/faultconn: a rule acts on the Nth
// run of a script, matched by its SHA-1 (idemtest.IsScript).
// The scripts are loaded first (idemtest.FaultRedis), so that no rule acts on
// an EVALSHA that only answered NOSCRIPT.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Row 3: the claim's reply is lost and go-redis (MaxRetries 3, the
// default) sends the script again: the repeat, with the same owner token,
// answers "yours", and fn runs once as attempt 1.
func TestClaimReplyLostIsRetried(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	claim := idemtest.IsScript(t, "claim")
	count, claims := idemtest.Count(claim)
	in := faultconn.New(count, faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DropReply})
	// A short wait: were the repeat not "yours", Do would wait for itself.
	c := idemtest.Faulty(t, b, in, nil, idem.WithWait(2*time.Second))
	var l idemtest.Runs

	res, err := c.Do(context.Background(), "k", "fp", l.Fn("ok"))
	if err != nil || string(res) != "ok#1" {
		t.Fatalf("got %q, %v; want ok#1", res, err)
	}
	if n := in.Hits(); n != 1 {
		t.Fatalf("%d replies dropped, want 1", n)
	}
	if n := claims.Load(); n != 2 {
		t.Fatalf("the claim was sent %d times, want 2 (the one whose reply was lost, and go-redis's retry)", n)
	}
	l.Want(t, "k", "[1]")
	idemtest.WantStatus(t, b, "k", idem.StateDone, 1)
	idemtest.Replay(t, b, "k", "ok#1", &l)
}

// Row 4: the claim's outcome is unknown: its reply was lost with no retry
// left, or the caller's deadline passed after the claim was written. fn does
// not run, the error is returned, and the claim is given back if (and only
// if) it is ours: the next call runs at once as attempt 2, instead of
// waiting out the lease (30s here).
func TestClaimOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	claim := idemtest.IsScript(t, "claim")
	ctx := context.Background()
	var l idemtest.Runs

	// afterwards checks the state a failed claim left behind. Once the
	// caller's context has ended, the claim is given back in the
	// background (Do does not wait for it): wait for it here.
	afterwards := func(t *testing.T, key string) {
		t.Helper()
		l.Want(t, key, "[]")
		idemtest.Eventually(t, 5*time.Second, "the claim given back", func() bool {
			return idemtest.Status(t, b, key).State == idem.StateReleased
		})
		idemtest.WantStatus(t, b, key, idem.StateReleased, 1)
		// WithWait(0): a key still claimed would give ErrInProgress.
		res, err := b.Idem(t, idem.WithWait(0)).Do(ctx, key, "fp", l.Fn("next"))
		if err != nil || string(res) != "next#2" {
			t.Fatalf("the next call: got %q, %v; want next#2 at once", res, err)
		}
	}

	t.Run("reply lost, no retries", func(t *testing.T) {
		in := faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DropReply})
		c := idemtest.Faulty(t, b, in, idemtest.NoRetry)
		_, err := c.Do(ctx, "lost", "fp", l.Fn("never"))
		if !errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "claim") {
			t.Fatalf("got %v, want the claim's io.EOF", err)
		}
		afterwards(t, "lost")
	})

	// go-redis applies a context's deadline to its reads only with
	// ContextTimeoutEnabled; the reply then comes too late.
	t.Run("deadline after the write", func(t *testing.T) {
		// A deadline of a second leaves time to write the claim on a loaded
		// machine: with 100ms, it sometimes passed before the write, and
		// there was no claim to give back (TestSuiteBesideBusyGoroutines).
		in := faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DelayReply, Delay: 4 * time.Second})
		c := idemtest.Faulty(t, b, in, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		t0 := time.Now()
		_, err := c.Do(dctx, "deadline", "fp", l.Fn("never"))
		if err == nil || !strings.Contains(err.Error(), "claim") {
			t.Fatalf("got %v, want the claim's error", err)
		}
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("got %v, want a deadline error", err)
		}
		if d := time.Since(t0); d > 3500*time.Millisecond {
			t.Fatalf("Do returned after %v: it waited for the delayed reply", d)
		}
		afterwards(t, "deadline")
	})

	// Without ContextTimeoutEnabled (the go-redis default) the claim's
	// reply arrives whole, after the caller's deadline: the caller has
	// given up, so fn must not start.
	t.Run("deadline passed when the claim returns", func(t *testing.T) {
		// As above, a deadline of a second leaves time for the write.
		in := faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DelayReply, Delay: 2 * time.Second})
		c := idemtest.Faulty(t, b, in, nil)
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.Do(dctx, "late", "fp", l.Fn("ran-after-the-deadline"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v, want context.DeadlineExceeded", err)
		}
		afterwards(t, "late")
	})

	// The lost reply said "busy": the claim was never ours, and giving it
	// back must not release the owner's.
	t.Run("busy reply lost", func(t *testing.T) {
		owner := b.Idem(t)
		finish, done := startOwner(t, owner, "busy", &l)
		in := faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DropReply})
		c := idemtest.Faulty(t, b, in, idemtest.NoRetry)
		_, err := c.Do(ctx, "busy", "fp", l.Fn("never"))
		if !errors.Is(err, io.EOF) {
			t.Fatalf("got %v, want the claim's io.EOF", err)
		}
		idemtest.WantStatus(t, b, "busy", idem.StateInProgress, 1)
		finish("owner's", nil)
		if err := <-done; err != nil {
			t.Fatalf("owner: %v (its claim was released by a caller that did not own it?)", err)
		}
		l.Want(t, "busy", "[1]")
		idemtest.Replay(t, b, "busy", "owner's", &l)
	})
}

// Row 20: Redis is out of memory (noeviction). Claims fail whole with
// Redis's OOM error, fn does not run, nothing is half-written; replays,
// which write nothing, still work; and once memory is back, the keys carry
// on where they were.
func TestOutOfMemoryClaimFailsWhole(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c := b.Idem(t, idem.WithWait(0))
	ctx := context.Background()
	var l idemtest.Runs
	if _, err := c.Do(ctx, "done", "fp", l.Fn("ok")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "released", "fp", func(ctx context.Context) ([]byte, error) {
		l.Add(ctx)
		return nil, errors.New("transient")
	}); err == nil {
		t.Fatal("no error from a failing fn")
	}
	releasedBefore := fmt.Sprint(b.Do(t, "GET", idem.RecordKey(c, "released")))

	// Fill the server up to a limit just above what it used.
	used := idemtest.Info(t, b, "memory", "used_memory")
	b.Do(t, "CONFIG", "SET", "maxmemory", used+256<<10)
	fill := b.Client(t, idemtest.NoRetry)
	for i := 0; ; i++ {
		err := fill.Set(ctx, fmt.Sprint("filler-", i), strings.Repeat("x", 4<<10), 0).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM") {
			break
		}
		if err != nil || i > 1000 {
			t.Fatalf("filling: %v after %d values", err, i)
		}
	}
	// A full server hovers at its limit: a small write may still fit
	// after a large one was refused, and the server frees memory of its
	// own (a client's buffers shrink), more than 64 KiB on a loaded
	// machine. Pin the limit at half of what it uses: well below use,
	// every write is refused, whatever it frees.
	b.Do(t, "CONFIG", "SET", "maxmemory", idemtest.Info(t, b, "memory", "used_memory")/2)

	for _, key := range []string{"new", "released"} {
		_, err := c.Do(ctx, key, "fp", l.Fn("oom"))
		if err == nil || !strings.Contains(err.Error(), "OOM") || !strings.Contains(err.Error(), "claim") {
			t.Fatalf("key %q: got %v, want the claim's OOM error", key, err)
		}
	}
	if n := b.Do(t, "EXISTS", idem.RecordKey(c, "new")); n != int64(0) {
		t.Fatal("a record was written for the refused claim")
	}
	if got := fmt.Sprint(b.Do(t, "GET", idem.RecordKey(c, "released"))); got != releasedBefore {
		t.Fatalf("the released record changed under a refused claim:\n%s\nwas\n%s", got, releasedBefore)
	}
	if res, err := c.Do(ctx, "done", "fp", l.Fn("again")); err != nil || string(res) != "ok#1" {
		t.Fatalf("replay while out of memory: got %q, %v", res, err)
	}
	l.Want(t, "new", "[]")
	l.Want(t, "released", "[1]")

	b.Do(t, "CONFIG", "SET", "maxmemory", 0)
	if res, err := c.Do(ctx, "new", "fp", l.Fn("later")); err != nil || string(res) != "later#1" {
		t.Fatalf("after memory is back: got %q, %v; want later#1", res, err)
	}
	if res, err := c.Do(ctx, "released", "fp", l.Fn("later")); err != nil || string(res) != "later#2" {
		t.Fatalf("after memory is back: got %q, %v; want later#2", res, err)
	}
}

// Row 24: a slow server. A BUSY reply (a long script holds the server) is
// an error, never an absent record: fn does not run. A server that does not
// answer within the read timeout (DEBUG SLEEP) leaves the claim's outcome
// unknown: fn does not run, and what the claim did once the server wakes
// is either nothing or a claim nobody holds, which the next caller takes
// over after the lease.
func TestSlowServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("BUSY", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{Extra: []string{"busy-reply-threshold 50"}})
		c := b.Idem(t, idem.WithWait(0))
		var l idemtest.Runs
		if _, err := c.Do(ctx, "warm", "fp", l.Fn("warm")); err != nil {
			t.Fatal(err)
		}
		loop := b.Client(t, idemtest.NoRetry, func(o *redis.Options) { o.ReadTimeout = -1 })
		looped := make(chan error, 1)
		go func() {
			looped <- loop.Eval(context.Background(), "local i = 0 while true do i = i + 1 end", nil).Err()
		}()
		var once sync.Once
		kill := func() {
			once.Do(func() {
				b.Do(t, "SCRIPT", "KILL")
				<-looped
			})
		}
		defer kill()
		probe := b.Client(t, idemtest.NoRetry)
		idemtest.Eventually(t, 5*time.Second, "BUSY replies", func() bool {
			err := probe.Ping(ctx).Err()
			return err != nil && strings.HasPrefix(err.Error(), "BUSY")
		})

		_, err := c.Do(ctx, "k", "fp", l.Fn("never"))
		if err == nil || !strings.Contains(err.Error(), "BUSY") {
			t.Fatalf("got %v, want the claim's BUSY error", err)
		}
		if _, err := c.Status(ctx, "k"); err == nil {
			t.Fatal("Status while BUSY: no error (an absent record?)")
		}
		kill()
		l.Want(t, "k", "[]")
		idemtest.WantStatus(t, b, "k", idem.StateAbsent, 0) // BUSY: the claim did not run
		if res, err := c.Do(ctx, "k", "fp", l.Fn("ok")); err != nil || string(res) != "ok#1" {
			t.Fatalf("after the script: got %q, %v", res, err)
		}
	})

	t.Run("DEBUG SLEEP", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{})
		const lease = 300 * time.Millisecond
		rdb := b.Client(t, idemtest.NoRetry, func(o *redis.Options) { o.ReadTimeout = 100 * time.Millisecond })
		c := idem.New(rdb, idem.WithLease(lease), idem.WithWait(0))
		t.Cleanup(func() { _ = c.Close() })
		var l idemtest.Runs
		// The warm-up (a connection, the scripts loaded) may take more
		// than the short lease on a loaded machine: it tries again, with
		// a key of its own each time, until one call succeeds.
		warm := 0
		idemtest.Eventually(t, 30*time.Second, "a warm-up call", func() bool {
			warm++
			_, err := c.Do(ctx, fmt.Sprintf("warm%d", warm), "fp", l.Fn("warm"))
			return err == nil
		})
		sleeper := b.Client(t, idemtest.NoRetry, func(o *redis.Options) { o.ReadTimeout = 10 * time.Second })
		if err := sleeper.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		slept := make(chan error, 1)
		go func() { slept <- sleeper.Do(context.Background(), "DEBUG", "SLEEP", "1").Err() }()
		probe := b.Client(t, idemtest.NoRetry, func(o *redis.Options) { o.ReadTimeout = 20 * time.Millisecond })
		idemtest.Eventually(t, 5*time.Second, "the server's sleep", func() bool { return probe.Ping(ctx).Err() != nil })

		t0 := time.Now()
		_, err := c.Do(ctx, "k", "fp", l.Fn("never"))
		d := time.Since(t0)
		if err == nil || !strings.Contains(err.Error(), "claim") {
			t.Fatalf("got %v, want the claim's timeout", err)
		}
		if err := <-slept; err != nil {
			t.Fatalf("DEBUG SLEEP: %v", err)
		}
		if d > 700*time.Millisecond {
			t.Fatalf("Do took %v: it did not decide while the server slept", d)
		}
		l.Want(t, "k", "[]")
		st := idemtest.Status(t, b, "k")
		t.Logf("after the sleep, the unknown claim left the key %v (attempt %d)", st.State, st.Attempt)
		want := "ok#1"
		switch {
		case st.State == idem.StateAbsent:
		case (st.State == idem.StateInProgress || st.State == idem.StateReleased) && st.Attempt == 1:
			want = "ok#2"
		default:
			t.Fatalf("state %v attempt %d after an unknown claim", st.State, st.Attempt)
		}
		res, err := b.Idem(t, idem.WithLease(lease), idem.WithWait(5*lease)).Do(ctx, "k", "fp", l.Fn("ok"))
		if err != nil || string(res) != want {
			t.Fatalf("the next call: got %q, %v; want %s", res, err, want)
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
	})
}
