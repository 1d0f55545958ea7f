package idem_test

// The rows of docs/faults.md that no other file covers, each on a real
// redis-server (docs/faults.md maps every row to its tests). Rows 6 and 7,
// whose owner runs in a child process, are in child_test.go.
//
// The shared invariant, checked in every test: fn runs at most once per key
// (the ledger; more only where a row says so), and every Do that returns no
// error returns the same bytes for one key.
//
// Faults on the wire come from internal/faultconn: a rule acts on the Nth
// run of a script, matched by its SHA-1 (faultSHA). The scripts are loaded
// first (faultLoadScripts), so that no rule acts on an EVALSHA that only
// answered NOSCRIPT.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// faultScripts are the scripts in lua/, by file name.
var faultScripts = []string{"claim", "complete", "release", "renew", "status"}

// faultSHA returns the SHA-1 of the script built from lua/<name>.lua,
// which is what go-redis sends in EVALSHA.
func faultSHA(t testing.TB, name string) string {
	t.Helper()
	return idem.ScriptSHA(name)
}

// faultLoadScripts loads every script into the server's cache.
func faultLoadScripts(t testing.TB, b *backend) {
	t.Helper()
	for _, name := range faultScripts {
		if got := b.do(t, "SCRIPT", "LOAD", idem.ScriptSource(name)); got != faultSHA(t, name) {
			t.Fatalf("SCRIPT LOAD %s answered %v", name, got)
		}
	}
}

// faultCount returns a rule that never acts but counts the commands that
// match: add it before the rules that act, which hide what they act on
// from the rules after them.
func faultCount(match func([]string) bool) (faultconn.Rule, *atomic.Int64) {
	n := new(atomic.Int64)
	return faultconn.Rule{Action: faultconn.DropReply, Match: func(cmd []string) bool {
		if match(cmd) {
			n.Add(1)
		}
		return false
	}}, n
}

// faultyClient returns an idem.Client whose connections to b obey in,
// closed when the test ends. ro, if not nil, adjusts the go-redis options
// (MaxRetries, timeouts).
func faultyClient(t testing.TB, b *backend, in *faultconn.Injector, ro func(*redis.Options), opts ...idem.Option) *idem.Client {
	t.Helper()
	rdb := b.client(t, func(o *redis.Options) {
		o.Dialer = in.Dialer(b.addr)
		o.MinRetryBackoff = time.Millisecond
		o.MaxRetryBackoff = 2 * time.Millisecond
		if ro != nil {
			ro(o)
		}
	})
	c := idem.New(rdb, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func noRetry(o *redis.Options) { o.MaxRetries = -1 }

// faultStatus returns key's Status, read with a clean client.
func faultStatus(t testing.TB, b *backend, key string) idem.Status {
	t.Helper()
	st, err := b.idem(t).Status(context.Background(), key)
	if err != nil {
		t.Fatalf("Status(%q): %v", key, err)
	}
	return st
}

// faultWantStatus fails the test unless key's record is in state with
// attempt n.
func faultWantStatus(t testing.TB, b *backend, key string, state idem.State, n int64) idem.Status {
	t.Helper()
	st := faultStatus(t, b, key)
	if st.State != state || st.Attempt != n {
		t.Fatalf("key %q: status %v attempt %d, want %v attempt %d", key, st.State, st.Attempt, state, n)
	}
	return st
}

// faultReplay checks that a call from a new Client replays want without
// running fn.
func faultReplay(t testing.TB, b *backend, key, want string, l *ledger) {
	t.Helper()
	before := l.count(key)
	res, err := b.idem(t).Do(context.Background(), key, "fp", l.fn("replay-ran-fn"))
	if err != nil || string(res) != want {
		t.Fatalf("key %q: replay got %q, %v; want %q", key, res, err, want)
	}
	if n := l.count(key); n != before {
		t.Fatalf("key %q: the replay ran fn", key)
	}
}

// faultRuns fails the test unless the attempts that ran fn for key are
// want, such as "[1 2]".
func faultRuns(t testing.TB, l *ledger, key, want string) {
	t.Helper()
	if got := fmt.Sprint(l.runs(key)); got != want {
		t.Fatalf("key %q: attempts that ran fn: %s, want %s", key, got, want)
	}
}

// faultInfo returns a field of the server's INFO section.
func faultInfo(t testing.TB, b *backend, section, field string) int64 {
	t.Helper()
	info := b.do(t, "INFO", section).(string)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %q", section, line)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// Row 3: the claim's reply is lost and go-redis (MaxRetries 3, the
// default) sends the script again: the repeat, with the same owner token,
// answers "yours", and fn runs once as attempt 1.
func TestClaimReplyLostIsRetried(t *testing.T) {
	b := newRedis(t, redistest.Config{})
	faultLoadScripts(t, b)
	claim := faultConnScript(t, "claim")
	count, claims := faultCount(claim)
	in := faultconn.New(count, faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DropReply})
	// A short wait: were the repeat not "yours", Do would wait for itself.
	c := faultyClient(t, b, in, nil, idem.WithWait(2*time.Second))
	var l ledger

	res, err := c.Do(context.Background(), "k", "fp", l.fn("ok"))
	if err != nil || string(res) != "ok#1" {
		t.Fatalf("got %q, %v; want ok#1", res, err)
	}
	if n := in.Hits(); n != 1 {
		t.Fatalf("%d replies dropped, want 1", n)
	}
	if n := claims.Load(); n != 2 {
		t.Fatalf("the claim was sent %d times, want 2 (the one whose reply was lost, and go-redis's retry)", n)
	}
	faultRuns(t, &l, "k", "[1]")
	faultWantStatus(t, b, "k", idem.StateDone, 1)
	faultReplay(t, b, "k", "ok#1", &l)
}

// faultConnScript matches runs of lua/<name>.lua.
func faultConnScript(t testing.TB, name string) func([]string) bool {
	return faultconn.IsScript(faultSHA(t, name))
}

// Row 4: the claim's outcome is unknown: its reply was lost with no retry
// left, or the caller's deadline passed after the claim was written. fn does
// not run, the error is returned, and the claim is given back if (and only
// if) it is ours: the next call runs at once as attempt 2, instead of
// waiting out the lease (30s here).
func TestClaimOutcomeUnknown(t *testing.T) {
	b := newRedis(t, redistest.Config{})
	faultLoadScripts(t, b)
	claim := faultConnScript(t, "claim")
	ctx := context.Background()
	var l ledger

	// afterwards checks the state a failed claim left behind. Once the
	// caller's context has ended, the claim is given back in the
	// background (Do does not wait for it): wait for it here.
	afterwards := func(t *testing.T, key string) {
		t.Helper()
		faultRuns(t, &l, key, "[]")
		eventually(t, 5*time.Second, "the claim given back", func() bool {
			return faultStatus(t, b, key).State == idem.StateReleased
		})
		faultWantStatus(t, b, key, idem.StateReleased, 1)
		// WithWait(0): a key still claimed would give ErrInProgress.
		res, err := b.idem(t, idem.WithWait(0)).Do(ctx, key, "fp", l.fn("next"))
		if err != nil || string(res) != "next#2" {
			t.Fatalf("the next call: got %q, %v; want next#2 at once", res, err)
		}
	}

	t.Run("reply lost, no retries", func(t *testing.T) {
		in := faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DropReply})
		c := faultyClient(t, b, in, noRetry)
		_, err := c.Do(ctx, "lost", "fp", l.fn("never"))
		if !errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "claim") {
			t.Fatalf("got %v, want the claim's io.EOF", err)
		}
		afterwards(t, "lost")
	})

	// go-redis applies a context's deadline to its reads only with
	// ContextTimeoutEnabled; the reply then comes too late.
	t.Run("deadline after the write", func(t *testing.T) {
		in := faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DelayReply, Delay: time.Second})
		c := faultyClient(t, b, in, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		_, err := c.Do(dctx, "deadline", "fp", l.fn("never"))
		if err == nil || !strings.Contains(err.Error(), "claim") {
			t.Fatalf("got %v, want the claim's error", err)
		}
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("got %v, want a deadline error", err)
		}
		if d := time.Since(t0); d > 900*time.Millisecond {
			t.Fatalf("Do returned after %v: it waited for the delayed reply", d)
		}
		afterwards(t, "deadline")
	})

	// Without ContextTimeoutEnabled (the go-redis default) the claim's
	// reply arrives whole, after the caller's deadline: the caller has
	// given up, so fn must not start.
	t.Run("deadline passed when the claim returns", func(t *testing.T) {
		in := faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DelayReply, Delay: 300 * time.Millisecond})
		c := faultyClient(t, b, in, nil)
		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := c.Do(dctx, "late", "fp", l.fn("ran-after-the-deadline"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v, want context.DeadlineExceeded", err)
		}
		afterwards(t, "late")
	})

	// The lost reply said "busy": the claim was never ours, and giving it
	// back must not release the owner's.
	t.Run("busy reply lost", func(t *testing.T) {
		owner := b.idem(t)
		finish, done := startOwner(t, owner, "busy", &l)
		in := faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DropReply})
		c := faultyClient(t, b, in, noRetry)
		_, err := c.Do(ctx, "busy", "fp", l.fn("never"))
		if !errors.Is(err, io.EOF) {
			t.Fatalf("got %v, want the claim's io.EOF", err)
		}
		faultWantStatus(t, b, "busy", idem.StateInProgress, 1)
		finish("owner's", nil)
		if err := <-done; err != nil {
			t.Fatalf("owner: %v (its claim was released by a caller that did not own it?)", err)
		}
		faultRuns(t, &l, "busy", "[1]")
		faultReplay(t, b, "busy", "owner's", &l)
	})
}

// Row 5: the completion's reply is lost. Completion is compare-and-set on
// the owner token, so its repeat (by go-redis, or by Do's own retry when
// go-redis has none left) is a no-op that succeeds: Do returns the result,
// fn ran once.
func TestCompletionReplyLost(t *testing.T) {
	b := newRedis(t, redistest.Config{})
	faultLoadScripts(t, b)
	complete := faultConnScript(t, "complete")
	ctx := context.Background()
	var l ledger

	for _, tc := range []struct {
		name string
		ro   func(*redis.Options)
	}{
		{"go-redis retries", nil},
		{"Do retries", noRetry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.name
			count, completions := faultCount(complete)
			in := faultconn.New(count, faultconn.Rule{Match: complete, Nth: 1, Action: faultconn.DropReply})
			c := faultyClient(t, b, in, tc.ro)
			// A waiter in another Client gets the result too.
			waiter := b.idem(t)
			finishGate := make(chan struct{})
			out := make(chan [2]any, 1)
			go func() {
				<-finishGate
				res, err := waiter.Do(ctx, key, "fp", l.fn("waiter"))
				out <- [2]any{string(res), err}
			}()
			res, err := c.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				a := l.add(ctx)
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
			faultRuns(t, &l, key, "[1]")
			faultWantStatus(t, b, key, idem.StateDone, 1)
			faultReplay(t, b, key, "ok#1", &l)
		})
	}

	// Every reply lost until the store timeout: the outcome was stored,
	// but Do cannot know it and says it may not be. Nothing runs twice.
	t.Run("every reply lost", func(t *testing.T) {
		in := faultconn.New(faultconn.Rule{Match: complete, Action: faultconn.DropReply})
		c := faultyClient(t, b, in, noRetry, idem.WithStoreTimeout(200*time.Millisecond))
		res, err := c.Do(ctx, "all", "fp", l.fn("ok"))
		if !errors.Is(err, idem.ErrNotRecorded) || string(res) != "ok#1" {
			t.Fatalf("got %q, %v; want fn's result with ErrNotRecorded", res, err)
		}
		if n := in.Hits(); n < 2 {
			t.Fatalf("the completion was tried %d times, want retries", n)
		}
		faultWantStatus(t, b, "all", idem.StateDone, 1)
		faultReplay(t, b, "all", "ok#1", &l)
		faultRuns(t, &l, "all", "[1]")
	})
}

// faultTakeoverAfterLease checks what a claim whose outcome was not
// recorded must leave: the key stays claimed (a call that does not wait
// gets ErrInProgress), and once the lease has ended the next call runs fn
// as attempt 2.
func faultTakeoverAfterLease(t *testing.T, b *backend, key string, lease time.Duration, l *ledger) {
	t.Helper()
	ctx := context.Background()
	st := faultWantStatus(t, b, key, idem.StateInProgress, 1)
	_, err := b.idem(t, idem.WithWait(0), idem.WithLease(lease)).Do(ctx, key, "fp", l.fn("too-early"))
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("during the lease: got %v, want ErrInProgress", err)
	}
	var started time.Time
	res, err := b.idem(t, idem.WithWait(5*lease), idem.WithLease(lease)).Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
		started = time.Now()
		a := l.add(ctx)
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
	const lease = time.Second
	ctx := context.Background()

	// The connection is cut before every completion (but not before a
	// release): a Do that gave the key back would leave it released.
	t.Run("connection cut", func(t *testing.T) {
		b := newRedis(t, redistest.Config{})
		faultLoadScripts(t, b)
		complete := faultConnScript(t, "complete")
		count, completions := faultCount(complete)
		in := faultconn.New(count, faultconn.Rule{Match: complete, Action: faultconn.CloseBefore})
		c := faultyClient(t, b, in, nil, idem.WithLease(lease), idem.WithStoreTimeout(300*time.Millisecond))
		var l ledger
		res, err := c.Do(ctx, "k", "fp", l.fn("ok"))
		if !errors.Is(err, idem.ErrNotRecorded) || string(res) != "ok#1" {
			t.Fatalf("got %q, %v; want fn's result with ErrNotRecorded", res, err)
		}
		// go-redis sends it 4 times (MaxRetries 3) per try of Do.
		if n := completions.Load(); n < 8 {
			t.Fatalf("the completion was sent %d times: Do did not retry it", n)
		}
		faultTakeoverAfterLease(t, b, "k", lease, &l)
		faultRuns(t, &l, "k", "[1 2]")
	})

	// Redis runs out of memory inside fn, and the result is large: the
	// completion's HSET is refused.
	t.Run("out of memory", func(t *testing.T) {
		b := newRedis(t, redistest.Config{})
		c := b.idem(t, idem.WithLease(lease), idem.WithStoreTimeout(300*time.Millisecond))
		var l ledger
		big := make([]byte, 512<<10)
		res, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.add(ctx)
			used := faultInfo(t, b, "memory", "used_memory")
			b.do(t, "CONFIG", "SET", "maxmemory", used+256<<10)
			return big, nil
		})
		b.do(t, "CONFIG", "SET", "maxmemory", 0)
		if !errors.Is(err, idem.ErrNotRecorded) || !strings.Contains(err.Error(), "OOM") || len(res) != len(big) {
			t.Fatalf("got %d bytes, %v; want fn's result with ErrNotRecorded naming OOM", len(res), err)
		}
		faultTakeoverAfterLease(t, b, "k", lease, &l)
		faultRuns(t, &l, "k", "[1 2]")
	})

	// The server dies inside fn and comes back with its append-only file:
	// the claim is still there, unreleased.
	t.Run("server killed", func(t *testing.T) {
		b := newRedis(t, redistest.Config{AppendOnly: true})
		c := b.idem(t, idem.WithLease(lease), idem.WithStoreTimeout(200*time.Millisecond))
		var l ledger
		res, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.add(ctx)
			b.srv.Kill()
			return []byte("ok"), nil
		})
		if !errors.Is(err, idem.ErrNotRecorded) || string(res) != "ok" {
			t.Fatalf("got %q, %v; want fn's result with ErrNotRecorded", res, err)
		}
		b.srv.Restart(t)
		faultTakeoverAfterLease(t, b, "k", lease, &l)
		faultRuns(t, &l, "k", "[1 2]")
	})
}

// Row 14: the owner's context ends while fn runs or while its outcome is
// being stored: the outcome is recorded all the same, with a detached
// context. The client honours context deadlines on reads
// (ContextTimeoutEnabled) and every completion's reply is slow, so a
// completion that used the caller's context would fail.
func TestOwnerContextEndsDuringFn(t *testing.T) {
	b := newRedis(t, redistest.Config{})
	faultLoadScripts(t, b)
	in := faultconn.New(faultconn.Rule{Match: faultConnScript(t, "complete"), Action: faultconn.DelayReply, Delay: 150 * time.Millisecond})
	c := faultyClient(t, b, in, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	var l ledger

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
				a := l.add(fctx)
				tc.fn(fctx, cancel)
				return []byte(fmt.Sprint("r#", a.Number)), nil
			})
			if err != nil || string(res) != "r#1" {
				t.Fatalf("got %q, %v; want r#1 recorded", res, err)
			}
			faultWantStatus(t, b, key, idem.StateDone, 1)
			faultReplay(t, b, key, "r#1", &l)
			faultRuns(t, &l, key, "[1]")
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
				in.Add(faultconn.Rule{Match: faultConnScript(t, "complete"), Action: faultconn.DelayReply,
					Delay: time.Duration(rng.IntN(20)) * time.Millisecond})
			}
			timeout := time.Duration(rng.IntN(8000)) * time.Microsecond
			work := time.Duration(rng.IntN(8000)) * time.Microsecond
			obey := rng.IntN(2) == 0
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			var ret string // what fn returned: a result, "error", or "" if it did not run
			res, err := c.Do(ctx, key, "fp", func(fctx context.Context) ([]byte, error) {
				a := l.add(fctx)
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
			st := faultStatus(t, b, key)
			what := fmt.Sprintf("key %s (timeout %v, work %v, obey %v): Do got %q, %v; state %v",
				key, timeout, work, obey, res, err, st.State)
			switch ret {
			case "":
				if err == nil || l.count(key) != 0 {
					t.Fatalf("%s; fn did not run, want an error", what)
				}
				// A claim made after the deadline is given back in the
				// background: Do does not wait for it.
				deadline := time.Now().Add(5 * time.Second)
				for st.State == idem.StateInProgress && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
					st = faultStatus(t, b, key)
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
				faultReplay(t, b, key, ret, &l)
			}
			if n := l.count(key); n > 1 {
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
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the other cleanups
	b := newRedis(t, redistest.Config{})
	owner := b.idem(t)
	other := b.idem(t, idem.WithWait(wakeBudget))
	idem.NoPolling(other)
	var l ledger
	type boom struct{ why string }
	inFn, explode := make(chan struct{}), make(chan struct{})
	recovered := make(chan any, 1)
	go func() {
		defer func() { recovered <- recover() }()
		_, _ = owner.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.add(ctx)
			close(inFn)
			<-explode
			panic(boom{"fn exploded"})
		})
	}()
	<-inFn
	outOther := waitFor(other, "k", &l)
	outSame := waitFor(owner, "k", &l)
	eventually(t, 5*time.Second, "the waiter's subscription", func() bool { return idem.Subscribed(other) == 1 })
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
	faultRuns(t, &l, "k", "[1 2]")
}

// Row 17, literally: a 10 MiB result against a 1 MiB cap. It is stored as a
// permanent failure (never run again); the 10 MiB never reach Redis, and
// the notification is a one-byte state.
func TestHugeResult(t *testing.T) {
	b := newRedis(t, redistest.Config{})
	c := b.idem(t, idem.WithMaxResultSize(1<<20))
	ctx := context.Background()
	var l ledger
	ps := b.client(t).Subscribe(ctx, idem.ChannelKey(c, "huge"))
	defer ps.Close()
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	in0 := faultInfo(t, b, "stats", "total_net_input_bytes")

	huge := func(ctx context.Context) ([]byte, error) {
		l.add(ctx)
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
	if msg, ok := m.(*redis.Message); !ok || len(msg.Payload) > 16 {
		t.Fatalf("notification %T %.100v, want a message of a few bytes", m, m)
	}
	if in := faultInfo(t, b, "stats", "total_net_input_bytes") - in0; in > 64<<10 {
		t.Fatalf("Redis received %d bytes for the call: the result was sent", in)
	}
	if n := b.do(t, "MEMORY", "USAGE", idem.RecordKey(c, "huge")).(int64); n > 4<<10 {
		t.Fatalf("the record takes %d bytes", n)
	}
	_, err = b.idem(t).Do(ctx, "huge", "fp", huge)
	var se *idem.StoredError
	if !errors.As(err, &se) || !strings.Contains(se.Message, "10485760 bytes") {
		t.Fatalf("replay: got %v, want the stored failure naming the size", err)
	}
	faultRuns(t, &l, "huge", "[1]")
}

// Row 20: Redis is out of memory (noeviction). Claims fail whole with
// Redis's OOM error, fn does not run, nothing is half-written; replays,
// which write nothing, still work; and once memory is back, the keys carry
// on where they were.
func TestOutOfMemoryClaimFailsWhole(t *testing.T) {
	b := newRedis(t, redistest.Config{})
	c := b.idem(t, idem.WithWait(0))
	ctx := context.Background()
	var l ledger
	if _, err := c.Do(ctx, "done", "fp", l.fn("ok")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "released", "fp", func(ctx context.Context) ([]byte, error) {
		l.add(ctx)
		return nil, errors.New("transient")
	}); err == nil {
		t.Fatal("no error from a failing fn")
	}
	releasedBefore := fmt.Sprint(b.do(t, "GET", idem.RecordKey(c, "released")))

	// Fill the server up to a limit just above what it used.
	used := faultInfo(t, b, "memory", "used_memory")
	b.do(t, "CONFIG", "SET", "maxmemory", used+256<<10)
	fill := b.client(t, noRetry)
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
	// after a large one was refused. Pin the limit a little below use.
	b.do(t, "CONFIG", "SET", "maxmemory", faultInfo(t, b, "memory", "used_memory")-64<<10)

	for _, key := range []string{"new", "released"} {
		_, err := c.Do(ctx, key, "fp", l.fn("oom"))
		if err == nil || !strings.Contains(err.Error(), "OOM") || !strings.Contains(err.Error(), "claim") {
			t.Fatalf("key %q: got %v, want the claim's OOM error", key, err)
		}
	}
	if n := b.do(t, "EXISTS", idem.RecordKey(c, "new")); n != int64(0) {
		t.Fatal("a record was written for the refused claim")
	}
	if got := fmt.Sprint(b.do(t, "GET", idem.RecordKey(c, "released"))); got != releasedBefore {
		t.Fatalf("the released record changed under a refused claim:\n%s\nwas\n%s", got, releasedBefore)
	}
	if res, err := c.Do(ctx, "done", "fp", l.fn("again")); err != nil || string(res) != "ok#1" {
		t.Fatalf("replay while out of memory: got %q, %v", res, err)
	}
	faultRuns(t, &l, "new", "[]")
	faultRuns(t, &l, "released", "[1]")

	b.do(t, "CONFIG", "SET", "maxmemory", 0)
	if res, err := c.Do(ctx, "new", "fp", l.fn("later")); err != nil || string(res) != "later#1" {
		t.Fatalf("after memory is back: got %q, %v; want later#1", res, err)
	}
	if res, err := c.Do(ctx, "released", "fp", l.fn("later")); err != nil || string(res) != "later#2" {
		t.Fatalf("after memory is back: got %q, %v; want later#2", res, err)
	}
}

// Row 21: Redis is killed (-9) and restarted on its data directory.
func TestRedisRestart(t *testing.T) {
	// With the append-only file (appendfsync always), under load from two
	// Clients, half of it on new keys: every result a Do returned survives
	// and replays, and no key's fn starts after a Do returned its result.
	t.Run("under load", func(t *testing.T) {
		b := newRedis(t, redistest.Config{AppendOnly: true})
		const workers = 6
		opts := []idem.Option{idem.WithLease(300 * time.Millisecond), idem.WithStoreTimeout(3 * time.Second),
			idem.WithWait(2 * time.Second), idem.WithPollInterval(50 * time.Millisecond)}
		clients := []*idem.Client{b.idem(t, opts...), b.idem(t, opts...)}
		var (
			seq     atomic.Int64 // orders fn starts and Do returns
			newKeys atomic.Int64
			mu      sync.Mutex
			runs    = map[string][][2]int64{} // key -> {seq, attempt} of each fn start
			firstOK = map[string]int64{}      // key -> seq of the first Do that returned a result
			results = map[string]string{}     // key -> that result
			errs    = map[string]int{}        // kind of error -> how many
			oks     int
			kills   []time.Time
			across  int // calls in flight across a kill
		)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for {
					select {
					case <-stop:
						return
					default:
					}
					var key string
					if n := newKeys.Load(); n == 0 || rng.IntN(2) == 0 {
						key = fmt.Sprint("k", newKeys.Add(1))
					} else {
						key = fmt.Sprint("k", 1+rng.Int64N(n))
					}
					start := time.Now()
					res, err := clients[w%2].Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
						a, _ := idem.AttemptFrom(ctx)
						mu.Lock()
						runs[key] = append(runs[key], [2]int64{seq.Add(1), a.Number})
						mu.Unlock()
						time.Sleep(time.Duration(1000+rng.IntN(9000)) * time.Microsecond)
						return []byte(fmt.Sprintf("%s#%d", key, a.Number)), nil
					})
					mu.Lock()
					for _, k := range kills {
						if start.Before(k) {
							across++
						}
					}
					switch {
					case err == nil:
						oks++
						if prev, ok := results[key]; ok && prev != string(res) {
							t.Errorf("key %s: Do returned %q and %q", key, prev, res)
						}
						if _, ok := firstOK[key]; !ok {
							firstOK[key], results[key] = seq.Add(1), string(res)
						}
					case errors.Is(err, idem.ErrNotRecorded):
						errs["not recorded"]++
					case errors.Is(err, idem.ErrLeaseLost):
						errs["lease lost"]++
					case errors.Is(err, idem.ErrInProgress):
						errs["in progress"]++
					case strings.Contains(err.Error(), "claim"):
						errs["claim failed"]++
					default:
						errs[err.Error()]++
					}
					mu.Unlock()
					if err != nil {
						time.Sleep(5 * time.Millisecond)
					}
				}
			})
		}
		for range 2 {
			time.Sleep(250 * time.Millisecond)
			mu.Lock()
			kills = append(kills, time.Now())
			mu.Unlock()
			b.srv.Kill()
			time.Sleep(300 * time.Millisecond)
			b.srv.Restart(t)
		}
		time.Sleep(300 * time.Millisecond)
		close(stop)
		wg.Wait()
		t.Logf("%d keys; %d calls returned a result, %d were in flight across a kill; errors: %v",
			newKeys.Load(), oks, across, errs)
		if across == 0 || len(results) < 50 {
			t.Fatalf("%d keys done, %d calls across a kill: the load did not straddle the restarts", len(results), across)
		}
		replayer := b.idem(t)
		for key, want := range results {
			var attempts []int64
			for _, r := range runs[key] {
				if r[0] > firstOK[key] {
					t.Errorf("key %s: fn started (attempt %d) after a Do had returned %q", key, r[1], want)
				}
				if len(attempts) > 0 && r[1] <= attempts[len(attempts)-1] {
					t.Errorf("key %s: attempt %d ran after attempt %d", key, r[1], attempts[len(attempts)-1])
				}
				attempts = append(attempts, r[1])
			}
			res, err := replayer.Do(context.Background(), key, "fp", func(context.Context) ([]byte, error) {
				return nil, errors.New("fn ran on replay")
			})
			if err != nil || string(res) != want {
				t.Errorf("key %s after the restarts: got %q, %v; want %q", key, res, err, want)
			}
		}
	})

	// Without persistence, a restart loses an in-progress record. The
	// stale owner's completion must not succeed: neither over the result
	// of a newer owner, nor on its own as a record without a claim.
	t.Run("in-progress record lost", func(t *testing.T) {
		b := newRedis(t, redistest.Config{})
		owner := b.idem(t)
		ctx := context.Background()
		var l ledger

		finish, done := startOwner(t, owner, "taken", &l)
		b.srv.Restart(t)
		res, err := b.idem(t).Do(ctx, "taken", "fp", l.fn("new"))
		if err != nil || string(res) != "new#1" {
			t.Fatalf("new owner: got %q, %v; want new#1 (the record was lost)", res, err)
		}
		finish("stale", nil)
		if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale owner: got %v, want ErrLeaseLost", err)
		}
		faultReplay(t, b, "taken", "new#1", &l)
		faultRuns(t, &l, "taken", "[1 1]") // two runs: the row's exception

		finish, done = startOwner(t, owner, "alone", &l)
		b.srv.Restart(t)
		finish("stale", nil)
		if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale owner alone: got %v, want ErrLeaseLost", err)
		}
		if n := b.do(t, "EXISTS", idem.RecordKey(owner, "alone")); n != int64(0) {
			t.Fatalf("the stale completion wrote a record: %v", b.do(t, "GET", idem.RecordKey(owner, "alone")))
		}
	})
}

// Row 22: the script cache is flushed (SCRIPT FLUSH, or a restart) between
// calls and between a claim and its completion: EVALSHA answers NOSCRIPT
// and the scripts are sent whole, also in the pipeline of WithReplicas.
func TestScriptCacheFlushed(t *testing.T) {
	ctx := context.Background()
	// calls returns how many times the server ran cmd.
	calls := func(t *testing.T, b *backend, cmd string) int64 {
		t.Helper()
		info := b.do(t, "INFO", "commandstats").(string)
		for _, line := range strings.Split(info, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
				return n
			}
		}
		return 0
	}
	flushing := func(t *testing.T, b *backend, l *ledger, result string, err error) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			a := l.add(ctx)
			b.do(t, "SCRIPT", "FLUSH")
			if err != nil {
				return nil, err
			}
			return []byte(fmt.Sprint(result, "#", a.Number)), nil
		}
	}
	check := func(t *testing.T, b *backend, c *idem.Client) {
		t.Helper()
		var l ledger
		if res, err := c.Do(ctx, "k1", "fp", l.fn("a")); err != nil || string(res) != "a#1" {
			t.Fatalf("first call: %q, %v", res, err)
		}
		b.do(t, "SCRIPT", "FLUSH")
		evals := calls(t, b, "eval")
		// Claim after a flush, completion after another.
		if res, err := c.Do(ctx, "k2", "fp", flushing(t, b, &l, "b", nil)); err != nil || string(res) != "b#1" {
			t.Fatalf("after SCRIPT FLUSH: %q, %v", res, err)
		}
		if n := calls(t, b, "eval") - evals; n < 2 {
			t.Fatalf("%d EVALs: the claim and the completion did not fall back to EVAL", n)
		}
		b.do(t, "SCRIPT", "FLUSH")
		if res, err := c.Do(ctx, "k1", "fp", l.fn("again")); err != nil || string(res) != "a#1" {
			t.Fatalf("replay after SCRIPT FLUSH: %q, %v", res, err)
		}
		// A release after a flush.
		boom := errors.New("transient")
		if _, err := c.Do(ctx, "k3", "fp", flushing(t, b, &l, "c", boom)); !errors.Is(err, boom) {
			t.Fatalf("failing fn: %v", err)
		}
		b.do(t, "SCRIPT", "FLUSH")
		faultWantStatus(t, b, "k3", idem.StateReleased, 1)
		faultRuns(t, &l, "k1", "[1]")
		faultRuns(t, &l, "k2", "[1]")
	}
	t.Run("single", func(t *testing.T) {
		b := newRedis(t, redistest.Config{})
		check(t, b, b.idem(t))
	})
	t.Run("WithReplicas pipeline", func(t *testing.T) {
		b := newRedis(t, redistest.Config{Extra: []string{"repl-diskless-sync-delay 0"}})
		replica := redistest.Start(t, redistest.Config{Extra: []string{"replicaof 127.0.0.1 " + portOf(b.addr)}})
		eventually(t, 10*time.Second, "the replica's sync", func() bool {
			return strings.Contains(fmt.Sprint(replica.Do(t, "INFO", "replication")), "master_link_status:up")
		})
		c := b.idem(t, idem.WithReplicas(1, time.Second))
		check(t, b, c)
		if got := fmt.Sprint(replica.Do(t, "GET", idem.RecordKey(c, "k2"))); !strings.HasSuffix(got, ":b#1") {
			t.Fatalf("the replica holds %v, want the result", got)
		}
	})
}

// Row 24: a slow server. A BUSY reply (a long script holds the server) is
// an error, never an absent record: fn does not run. A server that does not
// answer within the read timeout (DEBUG SLEEP) leaves the claim's outcome
// unknown: fn does not run, and what the claim did once the server wakes
// is either nothing or a claim nobody holds, which the next caller takes
// over after the lease.
func TestSlowServer(t *testing.T) {
	ctx := context.Background()

	t.Run("BUSY", func(t *testing.T) {
		b := newRedis(t, redistest.Config{Extra: []string{"busy-reply-threshold 50"}})
		c := b.idem(t, idem.WithWait(0))
		var l ledger
		if _, err := c.Do(ctx, "warm", "fp", l.fn("warm")); err != nil {
			t.Fatal(err)
		}
		loop := b.client(t, noRetry, func(o *redis.Options) { o.ReadTimeout = -1 })
		looped := make(chan error, 1)
		go func() {
			looped <- loop.Eval(context.Background(), "local i = 0 while true do i = i + 1 end", nil).Err()
		}()
		var once sync.Once
		kill := func() {
			once.Do(func() {
				b.do(t, "SCRIPT", "KILL")
				<-looped
			})
		}
		defer kill()
		probe := b.client(t, noRetry)
		eventually(t, 5*time.Second, "BUSY replies", func() bool {
			err := probe.Ping(ctx).Err()
			return err != nil && strings.HasPrefix(err.Error(), "BUSY")
		})

		_, err := c.Do(ctx, "k", "fp", l.fn("never"))
		if err == nil || !strings.Contains(err.Error(), "BUSY") {
			t.Fatalf("got %v, want the claim's BUSY error", err)
		}
		if _, err := c.Status(ctx, "k"); err == nil {
			t.Fatal("Status while BUSY: no error (an absent record?)")
		}
		kill()
		faultRuns(t, &l, "k", "[]")
		faultWantStatus(t, b, "k", idem.StateAbsent, 0) // BUSY: the claim did not run
		if res, err := c.Do(ctx, "k", "fp", l.fn("ok")); err != nil || string(res) != "ok#1" {
			t.Fatalf("after the script: got %q, %v", res, err)
		}
	})

	t.Run("DEBUG SLEEP", func(t *testing.T) {
		b := newRedis(t, redistest.Config{})
		const lease = 300 * time.Millisecond
		rdb := b.client(t, noRetry, func(o *redis.Options) { o.ReadTimeout = 100 * time.Millisecond })
		c := idem.New(rdb, idem.WithLease(lease), idem.WithWait(0))
		t.Cleanup(func() { _ = c.Close() })
		var l ledger
		if _, err := c.Do(ctx, "warm", "fp", l.fn("warm")); err != nil {
			t.Fatal(err)
		}
		sleeper := b.client(t, noRetry, func(o *redis.Options) { o.ReadTimeout = 10 * time.Second })
		if err := sleeper.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		slept := make(chan error, 1)
		go func() { slept <- sleeper.Do(context.Background(), "DEBUG", "SLEEP", "1").Err() }()
		probe := b.client(t, noRetry, func(o *redis.Options) { o.ReadTimeout = 20 * time.Millisecond })
		eventually(t, 5*time.Second, "the server's sleep", func() bool { return probe.Ping(ctx).Err() != nil })

		t0 := time.Now()
		_, err := c.Do(ctx, "k", "fp", l.fn("never"))
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
		faultRuns(t, &l, "k", "[]")
		st := faultStatus(t, b, "k")
		t.Logf("after the sleep, the unknown claim left the key %v (attempt %d)", st.State, st.Attempt)
		want := "ok#1"
		switch {
		case st.State == idem.StateAbsent:
		case (st.State == idem.StateInProgress || st.State == idem.StateReleased) && st.Attempt == 1:
			want = "ok#2"
		default:
			t.Fatalf("state %v attempt %d after an unknown claim", st.State, st.Attempt)
		}
		res, err := b.idem(t, idem.WithLease(lease), idem.WithWait(5*lease)).Do(ctx, "k", "fp", l.fn("ok"))
		if err != nil || string(res) != want {
			t.Fatalf("the next call: got %q, %v; want %s", res, err, want)
		}
		if n := l.count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
	})
}
