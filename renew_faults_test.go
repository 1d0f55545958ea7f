package idem_test

// Renewals in flight at once: each renewal that succeeds moves the owner's
// deadline to its own send time plus the lease, never to a later
// renewal's (model/idem.pml, mutant MR3: one shared lastSent).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The first renewal runs on the server and its reply is held; the second,
// sent a third of a lease later while the first is still under way, never
// reaches the server (its connection closes before it is sent). When the
// first reply comes, the server's lease ends one lease after the first
// renewal ran, so the owner's deadline must be the first renewal's send
// time plus the lease: dated by the second's send (the later one), fn's
// context would outlive the server's lease by a third of a lease, and
// another caller that takes the key over when that lease ends would start
// fn beside a live one.
func TestRenewalReplyDatedByItsOwnSend(t *testing.T) {
	t.Parallel()
	b := idemtest.FaultRedis(t, redistest.Config{})
	const (
		lease = 4500 * time.Millisecond
		every = lease / 3 // renewals are sent a third of a lease apart
		// The first renewal's reply is held past the second's send and
		// comes before the deadline that the claim gave (two thirds of a
		// lease after the first renewal was sent): half a period of slack
		// on either side.
		held = every * 3 / 2
	)
	for round := 1; ; round++ {
		built := renewalRound(t, b, fmt.Sprintf("k%d", round), lease, every, held)
		if built || t.Failed() {
			return
		}
		if round == 3 {
			t.Skip("three rounds in a row, the machine was too slow to send the second renewal before the first one's reply, or to take that reply before the claim's deadline; the case was not built")
		}
	}
}

// renewalRound runs the case once on key. It reports whether the case was
// built: the second renewal was sent well before the first one's reply
// came, and that reply moved fn's deadline.
func renewalRound(t *testing.T, b *idemtest.Backend, key string, lease, every, held time.Duration) (built bool) {
	renew := idemtest.IsScript(t, "renew")
	var first, second atomic.Int64 // when each renewal was written (Unix ns)
	stamp := func(at *atomic.Int64) func([]string) bool {
		return func(cmd []string) bool {
			if !renew(cmd) {
				return false
			}
			at.CompareAndSwap(0, time.Now().UnixNano())
			return true
		}
	}
	in := faultconn.New(
		faultconn.Rule{Match: stamp(&first), Nth: 1, Action: faultconn.DelayReply, Delay: held},
		// Every later renewal (go-redis's retries of it included) is lost
		// before the server sees it.
		faultconn.Rule{Match: stamp(&second), Action: faultconn.CloseBefore},
	)
	owner := idemtest.Faulty(t, b, in, func(o *redis.Options) { o.ReadTimeout = 2 * held },
		idem.WithLease(lease), idem.WithLogger(slog.New(slog.DiscardHandler)))
	thief := b.Idem(t, idem.WithLease(lease))

	var o idemtest.Owners
	var l idemtest.Runs
	aCtx := make(chan context.Context, 1)
	var aEnded atomic.Int64 // when fn saw its context done (Unix ns)
	aDone := make(chan error, 1)
	go func() {
		_, err := owner.Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
			leave := o.Enter(ctx)
			defer leave()
			l.Add(ctx)
			aCtx <- ctx
			select {
			case <-ctx.Done():
			case <-time.After(4 * lease):
				return nil, errors.New("fn's context was never cancelled")
			}
			aEnded.Store(time.Now().UnixNano())
			return nil, context.Cause(ctx)
		})
		aDone <- err
	}()
	ctx := <-aCtx

	// No renewal runs on the server after the first: its lease ends one
	// lease after that one ran. Then the owner's context must be done.
	idemtest.Eventually(t, 4*lease, "the end of the owner's lease on the server", func() bool {
		return first.Load() != 0 && idemtest.LeaseLeft(t, b, key) < 0
	})
	liveAfterLease := ctx.Err() == nil
	ended := time.Now()

	// Another caller takes over; its fn must not start beside a live one.
	res, err := thief.Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
		leave := o.Enter(ctx)
		defer leave()
		a := l.Add(ctx)
		return fmt.Appendf(nil, "b#%d", a.Number), nil
	})
	errA := <-aDone

	t1, t2, tEnd := time.Unix(0, first.Load()), time.Unix(0, second.Load()), time.Unix(0, aEnded.Load())
	if second.Load() == 0 || t2.Sub(t1) > held-every/4 || tEnd.Sub(t1) < 2*every+every/4 {
		t.Logf("%s: case not built (second renewal %v after the first, fn's context done %v after it; want the second before %v, and done after %v): running it again",
			key, t2.Sub(t1), tEnd.Sub(t1), held-every/4, 2*every+every/4)
		return false
	}
	if liveAfterLease {
		t.Errorf("fn's context was live after the server's lease ended (first renewal sent at +0, the second at +%v, the lease ended by +%v, fn's context done at +%v): a renewal's reply moved the deadline past its own send time plus the lease",
			t2.Sub(t1), ended.Sub(t1), tEnd.Sub(t1))
	}
	t.Logf("%s: first renewal sent at +0, the second at +%v, the server's lease ended by +%v, fn's context done at +%v",
		key, t2.Sub(t1), ended.Sub(t1), tEnd.Sub(t1))
	o.Check(t)
	if err != nil || string(res) != "b#2" {
		t.Errorf("the new owner got %q, %v; want b#2", res, err)
	}
	if !errors.Is(errA, idem.ErrLeaseLost) {
		t.Errorf("the first owner's Do: %v, want ErrLeaseLost", errA)
	}
	l.Want(t, key, "[1 2]")
	return true
}
