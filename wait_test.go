package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

// owner starts a Do on c whose fn blocks until the returned finish is
// called with fn's outcome; it returns once fn has started.
func startOwner(t *testing.T, c *idem.Client, key string, l *idemtest.Runs) (finish func(res string, err error), done <-chan error) {
	t.Helper()
	started := make(chan struct{})
	outcome := make(chan [2]any, 1)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
			if l != nil {
				l.Add(ctx)
			}
			close(started)
			o := <-outcome
			err, _ := o[1].(error)
			return []byte(o[0].(string)), err
		})
		errc <- err
	}()
	<-started
	var once sync.Once
	finish = func(res string, err error) { once.Do(func() { outcome <- [2]any{res, err} }) }
	t.Cleanup(func() { finish("cleanup", nil) })
	return finish, errc
}

func TestDuplicatesWaitForTheResult(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		const dups = 50
		clients := []*idem.Client{b.Idem(t), b.Idem(t)} // two service instances
		var l idemtest.Runs
		var wg sync.WaitGroup
		start := make(chan struct{})
		results := make([]string, dups)
		errs := make([]error, dups)
		for i := range dups {
			wg.Go(func() {
				<-start
				res, err := clients[i%2].Do(context.Background(), "pay-1", "fp", func(ctx context.Context) ([]byte, error) {
					a := l.Add(ctx)
					time.Sleep(50 * time.Millisecond)
					return []byte(fmt.Sprintf("receipt-%d-%d", i, a.Number)), nil
				})
				results[i], errs[i] = string(res), err
			})
		}
		close(start)
		wg.Wait()
		if n := l.Count("pay-1"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		for i := range dups {
			if errs[i] != nil || results[i] != results[0] {
				t.Errorf("caller %d: got %q, %v; want %q like caller 0", i, results[i], errs[i], results[0])
			}
		}
	})
}

func TestWaiterContextCancelled(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		owner, waiter := b.Idem(t), b.Idem(t, idem.WithWait(time.Minute))
		var l idemtest.Runs
		finish, ownerDone := startOwner(t, owner, "k", &l)

		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := waiter.Do(ctx, "k", "fp", l.Fn("dup"))
			errc <- err
		}()
		// Cancel once the waiter waits: it has seen the owner busy and
		// subscribed (a cancel during its first claim is another case).
		awaitSubscribed(t, waiter)
		cancel()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) || !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("got %v, want an error matching context.Canceled and ErrInProgress", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter did not return after its context was cancelled")
		}
		finish("ok", nil)
		if err := <-ownerDone; err != nil {
			t.Fatalf("owner: %v", err)
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
	})
}

func TestNoWait(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithWait(0))
		var l idemtest.Runs
		finish, done := startOwner(t, c, "k", &l)
		_, err := c.Do(context.Background(), "k", "fp", l.Fn("dup"))
		if !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("got %v, want ErrInProgress", err)
		}
		finish("ok", nil)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

func TestWaitBudgetEnds(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithWait(150*time.Millisecond))
		var l idemtest.Runs
		finish, done := startOwner(t, c, "k", &l)
		// From the same Client (shared flight) and from another one.
		for _, w := range []*idem.Client{c, b.Idem(t, idem.WithWait(150*time.Millisecond))} {
			_, err := w.Do(context.Background(), "k", "fp", l.Fn("dup"))
			if !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("got %v, want ErrInProgress", err)
			}
		}
		finish("ok", nil)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
	})
}

// waitFor runs a Do on c in the background and returns its outcome channel.
func waitFor(c *idem.Client, key string, l *idemtest.Runs) <-chan [2]any {
	out := make(chan [2]any, 1)
	go func() {
		res, err := c.Do(context.Background(), key, "fp", l.Fn("waiter"))
		out <- [2]any{string(res), err}
	}()
	return out
}

// A waiter that relies on pub/sub alone (NoPolling) claims again only when
// woken, or at the end of its wait budget. These tests give it a long
// budget and fail when it was not woken well before the budget ended.
const (
	wakeBudget = 20 * time.Second
	wakeLimit  = wakeBudget / 2
)

func mustBeWoken(t *testing.T, since time.Time) {
	t.Helper()
	if d := time.Since(since); d > wakeLimit {
		t.Fatalf("the waiter returned after %v: it was not woken, only its wait budget of %v ended", d, wakeBudget)
	}
}

// awaitSubscribed returns once the server has confirmed waiter's one
// subscription and the recheck after that confirmation has had time to
// pass. It waits for the confirmation, not for the Watch: under load the
// SUBSCRIBE can reach the server well after the Watch is registered, and a
// test that then kills the pub/sub connection, or publishes, would find no
// subscription on the server (TestPubSubKilledWhileWaiting's "killed 0
// pub/sub connections" came from there).
func awaitSubscribed(t *testing.T, waiter *idem.Client) {
	t.Helper()
	idemtest.Eventually(t, 10*time.Second, "the waiter's subscription, confirmed by the server", func() bool {
		return idem.Subscribed(waiter) == 1 && idem.Confirmed(waiter) == 1
	})
	time.Sleep(20 * time.Millisecond)
}

// woken receives a waiter's outcome from out, failing the test if the
// waiter was not woken well before its wait budget ended.
func woken(t *testing.T, out <-chan [2]any) [2]any {
	t.Helper()
	t0 := time.Now()
	got := <-out
	mustBeWoken(t, t0)
	return got
}

func TestWokenByPubSubAlone(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		owner := b.Idem(t)
		waiter := b.Idem(t, idem.WithWait(wakeBudget))
		idem.NoPolling(waiter)
		var l idemtest.Runs
		finish, done := startOwner(t, owner, "k", &l)
		out := waitFor(waiter, "k", &l)
		awaitSubscribed(t, waiter)
		finish("ok", nil)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		got := woken(t, out)
		if got[1] != nil || got[0] != "ok" {
			t.Fatalf("waiter: got %v; want the owner's result (a wake-up by pub/sub, not the wait's end)", got)
		}
		idemtest.Eventually(t, 5*time.Second, "the unsubscribe", func() bool { return idem.Subscribed(waiter) == 0 })
	})
}

func TestPubSubKilledWhileWaiting(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	owner := b.Idem(t)
	waiter := b.Idem(t, idem.WithWait(wakeBudget))
	idem.NoPolling(waiter)
	var l idemtest.Runs
	finish, done := startOwner(t, owner, "k", &l)
	out := waitFor(waiter, "k", &l)
	awaitSubscribed(t, waiter)
	if n := b.Srv.KillPubSub(t); n != 1 {
		t.Fatalf("killed %d pub/sub connections, want 1", n)
	}
	// The owner completes while the subscriber is reconnecting: its
	// notification is lost, the recheck after the resubscribe finds it.
	finish("ok", nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := woken(t, out)
	if got[1] != nil || got[0] != "ok" {
		t.Fatalf("waiter: got %v; want the owner's result", got)
	}
}

func TestLostPublishEndsByPolling(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		owner := b.Idem(t)
		idem.LosePublishes(owner)
		waiter := b.Idem(t, idem.WithWait(10*time.Second), idem.WithPollInterval(50*time.Millisecond))
		var l idemtest.Runs
		finish, done := startOwner(t, owner, "k", &l)
		out := waitFor(waiter, "k", &l)
		idemtest.Eventually(t, 5*time.Second, "the waiter's subscription", func() bool { return idem.Subscribed(waiter) == 1 })
		time.Sleep(100 * time.Millisecond)
		finish("ok", nil)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		got := <-out
		if got[1] != nil || got[0] != "ok" {
			t.Fatalf("waiter: got %v; want the owner's result", got)
		}
		t.Logf("%s: the waiter found the result %v after the completion (poll interval 50ms)", b.Name, time.Since(t0))
	})
}

func TestNotificationInTheSubscribeGap(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		owner := b.Idem(t)
		waiter := b.Idem(t, idem.WithWait(wakeBudget))
		idem.NoPolling(waiter)
		var l idemtest.Runs
		finish, done := startOwner(t, owner, "k", &l)
		// After the waiter saw "busy" and before it subscribes, the owner
		// completes and publishes to nobody.
		idem.SetBeforeSubscribe(waiter, func(string) {
			finish("ok", nil)
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
		t0 := time.Now()
		res, err := waiter.Do(context.Background(), "k", "fp", l.Fn("waiter"))
		mustBeWoken(t, t0)
		if err != nil || string(res) != "ok" {
			t.Fatalf("waiter: got %q, %v; want the owner's result from the recheck after subscribing", res, err)
		}
	})
}

func TestReleaseHandsOverToAWaiter(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		owner, waiter := b.Idem(t), b.Idem(t, idem.WithWait(wakeBudget))
		idem.NoPolling(waiter)
		var l idemtest.Runs
		finish, done := startOwner(t, owner, "k", &l)
		out := waitFor(waiter, "k", &l)
		awaitSubscribed(t, waiter)
		boom := errors.New("downstream unavailable")
		finish("", boom)
		if err := <-done; !errors.Is(err, boom) {
			t.Fatalf("owner: %v", err)
		}
		got := woken(t, out)
		if got[1] != nil || got[0] != "waiter#2" {
			t.Fatalf("waiter: got %v; want it to take over as attempt 2", got)
		}
		if runs := fmt.Sprint(l.Of("k")); runs != "[1 2]" {
			t.Fatalf("attempts that ran: %s, want [1 2]", runs)
		}
	})
}

func TestCloseEndsWaiters(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		owner := b.Idem(t)
		waiter := idem.New(b.Client(t), idem.WithWait(time.Minute))
		var l idemtest.Runs
		finish, done := startOwner(t, owner, "k", &l)
		out := waitFor(waiter, "k", &l)
		idemtest.Eventually(t, 5*time.Second, "the waiter's subscription", func() bool { return idem.Subscribed(waiter) == 1 })
		if err := waiter.Close(); err != nil {
			t.Fatal(err)
		}
		got := <-out
		if err, _ := got[1].(error); !errors.Is(err, idem.ErrClosed) {
			t.Fatalf("waiter: got %v, want ErrClosed", got)
		}
		finish("ok", nil)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

func TestRecordExpiresWhileWaiting(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c := b.Idem(t, idem.WithWait(10*time.Second), idem.WithPollInterval(20*time.Millisecond))
	rk := idem.RecordKey(c, "k")
	// A dead owner's claim with an hour of lease left, deleted a second
	// after the waiter started (by Forget, or evicted under a volatile-*
	// policy). The Client is warm (connected, scripts loaded), so that its
	// claim comes before the delete: with a cold Client and 200ms, a
	// loaded machine (load 21) deleted the record first, and fn ran.
	var l idemtest.Runs
	if _, err := c.Do(context.Background(), "warm", "fp", l.Fn("warm")); err != nil {
		t.Fatal(err)
	}
	b.Do(t, "SET", rk, idemtest.InProgress("dead", 3, 2*time.Hour, time.Hour), "PX", 2*time.Hour.Milliseconds())
	rdb := b.Client(t)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(time.Second, func() {
		if err := rdb.Del(context.Background(), rk).Err(); err != nil {
			t.Errorf("delete the record: %v", err)
		}
	})
	_, err := c.Do(context.Background(), "k", "fp", l.Fn("x"))
	if !errors.Is(err, idem.ErrExpired) || !strings.Contains(err.Error(), "attempt 3") {
		t.Fatalf("got %v, want ErrExpired naming attempt 3", err)
	}
	if n := l.Count("k"); n != 0 {
		t.Fatalf("fn ran %d times, want 0", n)
	}
}

func TestManyWaitersShareOneSubscriber(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("5,000 waiters: skipped in -short")
	}
	b := idemtest.Redis(t, redistest.Config{})
	const keys = 5000
	// Margins for a loaded machine, where 10,000 completions and claims
	// can take many seconds: the owners' lease is long, so that a waiter's
	// first poll (capped by the lease left) comes minutes after any
	// wake-up by pub/sub, and their outcomes have minutes to be stored.
	owner := b.Idem(t, idem.WithLease(5*time.Minute), idem.WithStoreTimeout(2*time.Minute))
	waiter := b.Idem(t, idem.WithWait(10*time.Minute))
	idem.NoPolling(waiter)
	var l idemtest.Runs
	release := make(chan struct{})
	var owners, waiters sync.WaitGroup
	started := make(chan struct{}, keys)
	for i := range keys {
		owners.Go(func() {
			_, err := owner.Do(context.Background(), fmt.Sprint("k", i), "fp", func(ctx context.Context) ([]byte, error) {
				l.Add(ctx)
				started <- struct{}{}
				<-release
				return []byte(fmt.Sprint("r", i)), nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	for range keys {
		<-started
	}
	errs := make(chan error, keys)
	for i := range keys {
		waiters.Go(func() {
			res, err := waiter.Do(context.Background(), fmt.Sprint("k", i), "fp", l.Fn("dup"))
			if err == nil && string(res) != fmt.Sprint("r", i) {
				err = fmt.Errorf("key k%d: got %q", i, res)
			}
			errs <- err
		})
	}
	idemtest.Eventually(t, 2*time.Minute, "5,000 subscriptions", func() bool { return idem.Subscribed(waiter) == keys })
	list := b.Do(t, "CLIENT", "LIST", "TYPE", "pubsub").(string)
	if n := strings.Count(list, "\n"); n != 1 {
		t.Fatalf("%d pub/sub connections, want 1:\n%s", n, list)
	}
	close(release)
	t0 := time.Now()
	owners.Wait()
	waiters.Wait()
	// A waiter that was not woken polls first when the lease is nearly
	// over, minutes later.
	if d := time.Since(t0); d > 2*time.Minute {
		t.Fatalf("the waiters took %v after the owners finished: they were not woken", d)
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range keys {
		if n := l.Count(fmt.Sprint("k", i)); n != 1 {
			t.Fatalf("key k%d: fn ran %d times", i, n)
		}
	}
	idemtest.Eventually(t, 10*time.Second, "all unsubscribed", func() bool { return idem.Subscribed(waiter) == 0 })
}

// A waiter trusts an outcome in a notification only from the owner it saw
// busy: a finished record of another owner's attempt on the key's channel
// (a stale one, or anyone's PUBLISH) only makes it claim again, and it
// goes on waiting until its owner's own outcome comes.
func TestNotificationOutcomeOnlyFromTheOwner(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		owner := b.Idem(t)
		// No polling: the first poll an hour away (NoPolling), and the
		// later ones too (a wait after the first backs off to the poll
		// interval).
		waiter, wc := countedIdem(t, b.Client(t), idem.WithWait(time.Minute), idem.WithPollInterval(time.Hour))
		idem.NoPolling(waiter)
		var l idemtest.Runs
		finish, done := startOwner(t, owner, "k", &l)
		w0 := wc.snapshot()
		out := waitFor(waiter, "k", &l)
		awaitSubscribed(t, waiter)
		idemtest.Eventually(t, 10*time.Second, "the waiter's claim after its subscription", func() bool {
			return wc.snapshot().since(w0).cmds["evalsha claim"] >= 2
		})
		// A finished record as complete.lua publishes it, of attempt 1 by
		// another owner (its token is 16 bytes, as newToken's are).
		forged := "1d\x00\x10" + strings.Repeat("o", 16) + "1:forged"
		b.Do(t, "PUBLISH", idem.ChannelKey(waiter, "k"), forged)
		idemtest.Eventually(t, 10*time.Second, "the waiter's claim after the forged notification", func() bool {
			return wc.snapshot().since(w0).cmds["evalsha claim"] >= 3
		})
		select {
		case got := <-out:
			t.Fatalf("the waiter returned %v on another owner's notification", got)
		case <-time.After(300 * time.Millisecond):
		}
		finish("real", nil)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := <-out; got[1] != nil || got[0] != "real" {
			t.Fatalf("waiter: got %v, want the owner's result", got)
		}
		l.Want(t, "k", "[1]")
		if n := wc.snapshot().since(w0).cmds["evalsha claim"]; n != 3 {
			t.Errorf("the waiter claimed %d times; want 3 (busy, after the subscription, after the forged notification): its owner's notification carries the outcome", n)
		}
	})
}
