package idem_test

// Leases: takeovers of crashed and stale owners, renewals while fn runs,
// and owner safety under slow replies (rows 27–32 of docs/faults.md): the
// promise checked is the promise itself, not a path through the code. When
// an fn starts, every other fn of its key has a context that is already
// done (owners.enter), whatever replies are held, lost or re-sent.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Row 27: a claim's reply arrives after the lease it granted ended, and
// another caller took the key over meanwhile. The late caller must not
// start fn; it waits for the new owner's outcome instead.
func TestSlowClaimReplyDoesNotStartFn(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	const lease = time.Second
	held := 3 * time.Second
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "claim"), Nth: 1, Action: faultconn.DelayReply, Delay: held})
	slow := idemtest.Faulty(t, b, in, nil, idem.WithLease(lease))
	other := b.Idem(t, idem.WithLease(lease))

	var o idemtest.Owners
	var l idemtest.Runs
	bStarted := make(chan struct{})
	fn := func(name string, hold time.Duration) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			leave := o.Enter(ctx)
			defer leave()
			a := l.Add(ctx)
			if name == "b" {
				close(bStarted)
			}
			select {
			case <-time.After(hold):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			return fmt.Appendf(nil, "%s#%d", name, a.Number), nil
		}
	}
	type result struct {
		res []byte
		err error
	}
	slowDone := make(chan result, 1)
	go func() {
		res, err := slow.Do(context.Background(), "k", "fp", fn("a", 0))
		slowDone <- result{res, err}
	}()
	// The slow caller's claim is on the server; its reply is held.
	idemtest.Eventually(t, 5*time.Second, "the slow caller's claim", func() bool {
		return idemtest.Status(t, b, "k").State == idem.StateInProgress
	})
	idemtest.Eventually(t, 5*time.Second, "the end of the slow caller's lease", func() bool {
		return idemtest.LeaseLeft(t, b, "k") < 0
	})
	// Another caller takes over, and its fn runs until well after the
	// slow caller's reply arrived.
	otherDone := make(chan result, 1)
	go func() {
		res, err := other.Do(context.Background(), "k", "fp", fn("b", held+500*time.Millisecond))
		otherDone <- result{res, err}
	}()
	<-bStarted
	rb := <-otherDone
	ra := <-slowDone
	o.Check(t)
	if rb.err != nil || string(rb.res) != "b#2" {
		t.Fatalf("the new owner got %q, %v; want b#2", rb.res, rb.err)
	}
	if ra.err != nil || string(ra.res) != "b#2" {
		t.Fatalf("the slow caller got %q, %v; want the new owner's b#2", ra.res, ra.err)
	}
	l.Want(t, "k", "[2]")
}

// Row 28: the claim's reply is lost to a read timeout and go-redis sends
// the claim again after the lease ended: the repeat answers "yours" with
// no lease left. fn must not start on that ended lease. Alone, the owner
// renews first and fn starts with most of a lease ahead on the server's
// clock; when another caller took the key over between the repeat and its
// (slow) reply, the renewal fails and the caller waits for the new owner.
func TestResentClaimWithNoLeaseLeft(t *testing.T) {
	t.Parallel()
	for _, thief := range []bool{false, true} {
		t.Run(fmt.Sprintf("thief=%v", thief), func(t *testing.T) {
			b := idemtest.FaultRedis(t, redistest.Config{})
			const lease = time.Second
			claim := idemtest.IsScript(t, "claim")
			count, sent := idemtest.Count(claim)
			in := faultconn.New(count,
				faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DelayReply, Delay: 5 * time.Second},
				faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DelayReply, Delay: 500 * time.Millisecond})
			c := idemtest.Faulty(t, b, in, func(o *redis.Options) { o.ReadTimeout = 1500 * time.Millisecond }, idem.WithLease(lease))
			other := b.Idem(t, idem.WithLease(lease), idem.WithWait(0))

			var o idemtest.Owners
			var l idemtest.Runs
			var leftAtStart time.Duration
			thiefDone := make(chan error, 1)
			if thief {
				go func() {
					for sent.Load() < 2 {
						time.Sleep(time.Millisecond)
					}
					// The repeat ran on the server; its reply is held.
					time.Sleep(50 * time.Millisecond)
					_, err := other.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
						leave := o.Enter(ctx)
						defer leave()
						a := l.Add(ctx)
						time.Sleep(time.Second)
						return fmt.Appendf(nil, "thief#%d", a.Number), nil
					})
					thiefDone <- err
				}()
			} else {
				thiefDone <- nil
			}
			res, err := c.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
				leave := o.Enter(ctx)
				defer leave()
				leftAtStart = idemtest.LeaseLeft(t, b, "k")
				a := l.Add(ctx)
				return fmt.Appendf(nil, "ok#%d", a.Number), nil
			})
			if err := <-thiefDone; err != nil {
				t.Fatalf("thief: %v", err)
			}
			o.Check(t)
			if n := sent.Load(); n < 2 {
				t.Fatalf("the claim was sent %d times, want at least 2 (the first reply timed out)", n)
			}
			if thief {
				if err != nil || string(res) != "thief#2" {
					t.Fatalf("Do: %q, %v; want the new owner's thief#2", res, err)
				}
				l.Want(t, "k", "[2]")
				return
			}
			if err != nil || string(res) != "ok#1" {
				t.Fatalf("Do: %q, %v; want ok#1", res, err)
			}
			if leftAtStart < lease/3 {
				t.Fatalf("fn started with %v of the lease left on the server, want at least a third of %v", leftAtStart, lease)
			}
			l.Want(t, "k", "[1]")
			idemtest.WantStatus(t, b, "k", idem.StateDone, 1)
		})
	}
}

// Row 29: a renewal's reply hangs for several leases. fn's context must end
// at the owner's own lease deadline, before anyone can take the key over,
// even though the renewal call has not come back.
func TestHangingRenewalEndsFnContext(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	// The lease outlasts a claim's round trip on a loaded machine (600 ms
	// did not, beside the busy goroutines: the first fn never started),
	// and the held renewal's reply (4 s) outlasts the lease.
	const lease = 2 * time.Second
	// Every renewal runs on the server, and its reply is held.
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "renew"), Action: faultconn.DelayReply, Delay: 4 * time.Second})
	hung := idemtest.Faulty(t, b, in, func(o *redis.Options) { o.ReadTimeout = 10 * time.Second }, idem.WithLease(lease))
	other := b.Idem(t, idem.WithLease(lease))

	var o idemtest.Owners
	var l idemtest.Runs
	bStarted := make(chan struct{})
	var cause error
	aDone := make(chan error, 1)
	go func() {
		_, err := hung.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			leave := o.Enter(ctx)
			defer leave()
			l.Add(ctx)
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(10 * time.Second):
				return nil, errors.New("fn's context was never cancelled")
			}
			// An fn that does not stop at once: it runs on until the new
			// owner started (or long enough), with its context done.
			select {
			case <-bStarted:
			case <-time.After(10 * time.Second):
			}
			return nil, cause
		})
		aDone <- err
	}()
	idemtest.Eventually(t, 5*time.Second, "the first owner's claim", func() bool {
		return idemtest.Status(t, b, "k").State == idem.StateInProgress
	})
	// The renewals ran on the server (their replies are held), until two
	// were under way: wait for the server's lease to end, and take over.
	time.Sleep(lease / 2)
	idemtest.Eventually(t, 10*time.Second, "the end of the first owner's lease on the server", func() bool {
		return idemtest.LeaseLeft(t, b, "k") < 0
	})
	res, err := other.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
		leave := o.Enter(ctx)
		defer leave()
		close(bStarted)
		a := l.Add(ctx)
		return fmt.Appendf(nil, "b#%d", a.Number), nil
	})
	if err != nil || string(res) != "b#2" {
		t.Fatalf("the new owner got %q, %v; want b#2", res, err)
	}
	errA := <-aDone
	o.Check(t)
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("the first fn's context ended with cause %v, want ErrLeaseLost", cause)
	}
	if !errors.Is(errA, idem.ErrLeaseLost) {
		t.Fatalf("the first owner's Do: %v, want ErrLeaseLost", errA)
	}
	l.Want(t, "k", "[1 2]")
}

// Row 30: many fns renew their leases through one Client's queue while a
// claim's reply is slow. No renewal may be queued past its lease's due
// point: a caller that keeps trying to take the key over never starts fn
// while its owner's context is live.
func TestSlowClaimAmongRenewals(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	const lease = 600 * time.Millisecond
	// The claim of "slow" is the first claim sent; its reply is held.
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "claim"), Nth: 1, Action: faultconn.DelayReply, Delay: 500 * time.Millisecond})
	c := idemtest.Faulty(t, b, in, nil, idem.WithLease(lease))
	thief := b.Idem(t, idem.WithLease(lease), idem.WithWait(0))

	var o idemtest.Owners
	var l idemtest.Runs
	hold := func(d time.Duration) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			leave := o.Enter(ctx)
			defer leave()
			a := l.Add(ctx)
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			return fmt.Appendf(nil, "%s#%d", a.Key, a.Number), nil
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := c.Do(context.Background(), "slow", "", hold(3*lease))
		errs <- err
	}()
	// Other keys claimed after the slow one was sent, and before its reply:
	// their renewals fall due after the slow one's lease ends.
	time.Sleep(420 * time.Millisecond)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Do(context.Background(), fmt.Sprint("other", i), "", hold(3*lease))
			errs <- err
		}()
	}
	// Meanwhile another Client tries to take "slow" over, again and again.
	stop := make(chan struct{})
	var thiefWG sync.WaitGroup
	thiefWG.Add(1)
	go func() {
		defer thiefWG.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = thief.Do(context.Background(), "slow", "", hold(0))
		}
	}()
	wg.Wait()
	close(stop)
	thiefWG.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Do: %v", err)
		}
	}
	o.Check(t)
	if n := o.Started("slow"); n < 1 {
		t.Fatalf("fn of the slow key started %d times", n)
	}
}

// Row 31: fn ends with runtime.Goexit (t.FailNow does that). Like a panic:
// the claim is released, renewals stop, and the next call runs attempt 2.
func TestGoexitInFnReleases(t *testing.T) {
	// Not parallel: it checks for leaked goroutines, which parallel tests would start.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		const lease = 300 * time.Millisecond
		c := b.Idem(t, idem.WithLease(lease))
		var l idemtest.Runs
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = c.Do(context.Background(), "k", "", func(ctx context.Context) ([]byte, error) {
				l.Add(ctx)
				if b.MR == nil {
					time.Sleep(lease / 2) // a renewal falls due
				}
				runtime.Goexit()
				return nil, nil
			})
		}()
		<-done
		if b.MR == nil {
			time.Sleep(lease) // a renewal that went on would keep the record in progress
		}
		idemtest.WantStatus(t, b, "k", idem.StateReleased, 1)
		res, err := c.Do(context.Background(), "k", "", l.Fn("ok"))
		if err != nil || string(res) != "ok#2" {
			t.Fatalf("next call: %q, %v; want ok#2", res, err)
		}
	})
}

// Row 32: Redis stops answering (SIGSTOP). A new key's call returns soon
// after its context ends, though releasing its unknown claim cannot finish;
// a waiter whose context ends while it re-claims gets ErrInProgress with
// the context's error.
func TestRedisHangsCallsEndWithTheirContext(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	const lease = 2 * time.Second
	rdb := b.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	c := idem.New(rdb, idem.WithLease(lease), idem.WithStoreTimeout(30*time.Second), idem.WithPollInterval(20*time.Millisecond))
	t.Cleanup(func() { _ = c.Close() })

	// An owner in another Client holds "busy".
	owner := b.Idem(t, idem.WithLease(lease))
	release := make(chan struct{})
	ownerDone := make(chan error, 1)
	go func() {
		_, err := owner.Do(context.Background(), "busy", "", func(ctx context.Context) ([]byte, error) {
			<-release
			return []byte("done"), nil
		})
		ownerDone <- err
	}()
	idemtest.Eventually(t, 5*time.Second, "the owner's claim", func() bool {
		return idemtest.Status(t, b, "busy").State == idem.StateInProgress
	})
	// A waiter polls "busy" (every 20ms); then the server stops.
	waitCtx, cancelWait := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancelWait()
	waitDone := make(chan error, 1)
	var waitEnded time.Time
	go func() {
		_, err := c.Do(waitCtx, "busy", "", func(context.Context) ([]byte, error) { return nil, errors.New("waiter ran fn") })
		waitEnded = time.Now()
		waitDone <- err
	}()
	time.Sleep(200 * time.Millisecond)
	b.Srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			b.Srv.Resume()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Do(ctx, "new", "", func(context.Context) ([]byte, error) { return nil, errors.New("fn ran on a stopped server") })
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("new key: %v, want an error matching DeadlineExceeded", err)
	}
	// The store timeout is 30s: a call that waited for its release would
	// take that long.
	if took > 3*time.Second {
		t.Errorf("new key: Do returned %v after the call started, its context ended after 300ms", took)
	}
	werr := <-waitDone
	if !errors.Is(werr, idem.ErrInProgress) || !errors.Is(werr, context.DeadlineExceeded) {
		t.Errorf("waiter: %v, want ErrInProgress and DeadlineExceeded", werr)
	}
	if d, _ := waitCtx.Deadline(); waitEnded.Sub(d) > 3*time.Second {
		t.Errorf("waiter returned %v after its context ended", waitEnded.Sub(d))
	}
	b.Srv.Resume()
	resumed = true
	close(release)
	if err := <-ownerDone; err != nil {
		t.Fatalf("owner: %v", err)
	}
}

// Followers in one process share their leader's round to Redis, but not its
// wait budget: each waits for its own WithWait and its own context.
func TestFollowersKeepTheirOwnBudget(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		owner := b.Idem(t)
		release := make(chan struct{})
		ownerDone := make(chan struct{})
		go func() {
			defer close(ownerDone)
			_, _ = owner.Do(context.Background(), "k", "", func(context.Context) ([]byte, error) {
				<-release
				return []byte("done"), nil
			})
		}()
		defer func() { close(release); <-ownerDone }()
		idemtest.Eventually(t, 5*time.Second, "the owner's claim", func() bool {
			return idemtest.Status(t, b, "k").State == idem.StateInProgress
		})

		t.Run("leader's budget ends first", func(t *testing.T) {
			const wait = time.Second
			c := b.Idem(t, idem.WithWait(wait))
			leader := make(chan error, 1)
			go func() {
				_, err := c.Do(context.Background(), "k", "", nil2)
				leader <- err
			}()
			time.Sleep(wait * 8 / 10)
			start := time.Now()
			_, err := c.Do(context.Background(), "k", "", nil2)
			waited := time.Since(start)
			if !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("follower: %v, want ErrInProgress", err)
			}
			if waited < wait*9/10 {
				t.Fatalf("follower waited %v, want its own %v", waited, wait)
			}
			if err := <-leader; !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("leader: %v, want ErrInProgress", err)
			}
		})
		t.Run("leader's context ends first", func(t *testing.T) {
			const wait = 2 * time.Second
			c := b.Idem(t, idem.WithWait(wait))
			lctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			leader := make(chan error, 1)
			go func() {
				_, err := c.Do(lctx, "k", "", nil2)
				leader <- err
			}()
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			_, err := c.Do(context.Background(), "k", "", nil2)
			waited := time.Since(start)
			if !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("follower: %v, want ErrInProgress", err)
			}
			// Its own budget ends 2s after it came; a fresh wait started
			// when the leader gave up would end 3.5s after.
			if waited < wait*9/10 || waited > wait+1200*time.Millisecond {
				t.Fatalf("follower waited %v, want about its own %v", waited, wait)
			}
			if err := <-leader; !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("leader: %v, want DeadlineExceeded", err)
			}
		})
	})
}

// nil2 is an fn for callers that must not run it.
func nil2(context.Context) ([]byte, error) { return nil, errors.New("a waiter ran fn") }

func TestCrashedOwnerTakenOver(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		// A second: with 200ms, on a loaded machine the dead owner's lease
		// ended before the first call, or the takeover's claim came back
		// with too little of its lease (TestSuiteBesideBusyGoroutines).
		const lease = time.Second
		c := b.Idem(t, idem.WithLease(lease), idem.WithWait(0))
		ctx := context.Background()
		rk := idem.RecordKey(c, "k")
		// What an owner that died inside fn leaves behind: a claim whose
		// lease is not renewed.
		b.Do(t, "SET", rk, idemtest.InProgress("dead-owner", 1, time.Minute, lease), "PX", time.Minute.Milliseconds())

		var l idemtest.Runs
		_, err := c.Do(ctx, "k", "fp", l.Fn("x"))
		if !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("during the dead owner's lease: got %v, want ErrInProgress", err)
		}
		b.Advance(t, lease+50*time.Millisecond)
		got, err := c.Do(ctx, "k", "fp", l.Fn("x"))
		if err != nil || string(got) != "x#2" {
			t.Fatalf("after the lease: got %q, %v; want x#2 (a takeover)", got, err)
		}
	})
}

func TestStaleOwnerLosesLease(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithWait(0))
		ctx := context.Background()
		rk := idem.RecordKey(c, "k")
		var l idemtest.Runs
		inFn, resume := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
				l.Add(ctx)
				close(inFn)
				<-resume
				return []byte("stale"), nil
			})
			done <- err
		}()
		<-inFn
		// The owner is paused past its lease: end it, as time would, by
		// bringing the record's TTL down by the lease (the defaults: a
		// 24h retention and a 30s lease).
		b.Do(t, "PEXPIRE", rk, (24*time.Hour - 30*time.Second).Milliseconds())
		got, err := c.Do(ctx, "k", "fp", l.Fn("new"))
		if err != nil || string(got) != "new#2" {
			t.Fatalf("takeover: got %q, %v; want new#2", got, err)
		}
		close(resume)
		if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale owner: got %v, want ErrLeaseLost", err)
		}
		got, err = c.Do(ctx, "k", "fp", l.Fn("again"))
		if err != nil || string(got) != "new#2" {
			t.Fatalf("after the stale completion: got %q, %v; want the newer result new#2", got, err)
		}
	})
}

func TestLeaseLossCancelsFn(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	// A second: with 60ms, on a loaded machine the claim came back with too
	// little of its lease and fn did not run (TestSuiteBesideBusyGoroutines).
	c := b.Idem(t, idem.WithLease(time.Second), idem.WithWait(0))
	ctx := context.Background()
	rk := idem.RecordKey(c, "k")
	cause := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			// Another caller took over behind our back.
			b.Do(t, "SET", rk, idemtest.InProgress("someone-else", 2, time.Minute, time.Minute), "PX", time.Minute.Milliseconds())
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return []byte("late"), nil
		})
		done <- err
	}()
	select {
	case err := <-cause:
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("fn's context cause: %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("fn's context was not cancelled after the lease was lost")
	}
	if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do: got %v, want ErrLeaseLost", err)
	}
}

func TestLeaseRenewedWhileFnRuns(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	// A second: with 90ms, a loaded machine delayed renewals past the lease
	// (TestSuiteBesideBusyGoroutines).
	const lease = time.Second
	c := b.Idem(t, idem.WithLease(lease), idem.WithWait(0))
	ctx := context.Background()
	var l idemtest.Runs
	inFn, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			close(inFn)
			<-finish
			return []byte("slow"), ctx.Err()
		})
		done <- err
	}()
	<-inFn
	// Several leases later, the owner still holds the key.
	time.Sleep(3 * lease)
	if _, err := c.Do(ctx, "k", "fp", l.Fn("dup")); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("during a renewed lease: got %v, want ErrInProgress", err)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := l.Count("k"); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
}

// TestManyLeasesRenewed runs fns that start one after another and overlap:
// every other one lasts several leases, the rest end at once, before their
// first renewal is due, and leave the queue of renewals from its middle.
// One queue and one timer serve a Client's leases (see renew.go); every
// long fn must keep its key, and every fn run once.
func TestManyLeasesRenewed(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	// A lease of two seconds: with 90ms, a loaded machine delayed renewals
	// past the lease and every long fn lost its key
	// (TestSuiteBesideBusyGoroutines); with one second, so did the suite's
	// parallel tests beside the busy goroutines.
	const lease = 2 * time.Second
	c := b.Idem(t, idem.WithLease(lease), idem.WithWait(0))
	ctx := context.Background()
	var l idemtest.Runs
	const n = 12
	long := func(i int) bool { return i%2 == 0 }
	finish := make(chan struct{})
	var started sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		key := fmt.Sprintf("k%d", i)
		started.Add(1)
		go func() {
			_, err := c.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				l.Add(ctx)
				started.Done()
				if long(i) {
					<-finish
				}
				return []byte(key), ctx.Err()
			})
			errs <- err
		}()
		time.Sleep(lease / 10)
	}
	started.Wait()
	time.Sleep(4 * lease)
	for i := range n {
		key := fmt.Sprintf("k%d", i)
		got, err := c.Do(ctx, key, "fp", l.Fn("dup"))
		switch {
		case long(i) && !errors.Is(err, idem.ErrInProgress):
			t.Errorf("%s, after 4 leases of its fn: got %q, %v; want ErrInProgress", key, got, err)
		case !long(i) && (err != nil || string(got) != key):
			t.Errorf("%s, finished: got %q, %v; want the replay %q", key, got, err, key)
		}
	}
	close(finish)
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for i := range n {
		if key := fmt.Sprintf("k%d", i); l.Count(key) != 1 {
			t.Errorf("%s: fn ran %d times, want 1", key, l.Count(key))
		}
	}
}

// fn's context reports the caller's deadline, or none, not the lease's
// (which renewals move): documented at AttemptFrom. It still ends when
// the lease does (TestHangingRenewalEndsFnContext).
func TestFnDeadlineIsTheCallers(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := b.Idem(t, idem.WithLease(time.Second))
	type seen struct {
		at time.Time
		ok bool
	}
	deadlineIn := func(ctx context.Context, key string) seen {
		var s seen
		if _, err := c.Do(ctx, key, "", func(ctx context.Context) ([]byte, error) {
			s.at, s.ok = ctx.Deadline()
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := deadlineIn(context.Background(), "no-deadline"); s.ok {
		t.Errorf("a caller without a deadline: fn's context has one, %v", s.at)
	}
	want := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	if s := deadlineIn(ctx, "deadline"); !s.ok || !s.at.Equal(want) {
		t.Errorf("fn's deadline %v (%v), want the caller's %v", s.at, s.ok, want)
	}
}
