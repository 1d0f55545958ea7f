package idemsql_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/redis/go-redis/v9"
)

// cutHook fails every command of a go-redis client once cut is set: the
// client's Redis is gone, as for an owner cut off by a partition.
type cutHook struct{ cut atomic.Bool }

var errCut = errors.New("test: connection to Redis cut")

func (h *cutHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.cut.Load() {
			cmd.SetErr(errCut)
			return errCut
		}
		return next(ctx, cmd)
	}
}

func (h *cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.cut.Load() {
			for _, c := range cmds {
				c.SetErr(errCut)
			}
			return errCut
		}
		return next(ctx, cmds)
	}
}

// Two live owners: owner A's renewals fail, its lease ends, and B takes
// over; A ignores its cancelled context and commits its change anyway. The
// ledger's key lets one commit stand: the change is applied once, the
// loser's transaction is rolled back, and both calls return the winner's
// outcome.
func TestTwoLiveOwners(t *testing.T) {
	for _, order := range []string{"A commits after B", "A commits while B runs"} {
		t.Run(order, func(t *testing.T) {
			eachBank(t, func(t *testing.T, b *bank) {
				testTwoLiveOwners(t, b, order == "A commits after B")
			})
		})
	}
}

func testTwoLiveOwners(t *testing.T, b *bank, bFirst bool) {
	ctx := context.Background()
	const lease = time.Second
	hook := &cutHook{}
	rdbA := b.redis.Client(t)
	rdbA.AddHook(hook)
	ownerA := b.clientOn(t, rdbA, idem.WithLease(lease), idem.WithStoreTimeout(2*time.Second))
	ownerB := b.client(t, idem.WithLease(lease), idem.WithWait(time.Minute))
	fp := fingerprint("op", 10)

	var (
		aStarted   = make(chan struct{})
		bStarted   = make(chan struct{})
		bDone      = make(chan struct{})
		aDone      = make(chan struct{})
		aCommitted = make(chan struct{})
		aCause     error
		aCommit    error
		aGot       Receipt
		aErr       error
	)
	go func() {
		defer close(aDone)
		aGot, aErr = idem.Do(ctx, ownerA, "op", fp, func(ctx context.Context) (Receipt, error) {
			close(aStarted)
			hook.cut.Store(true) // A's renewals fail from here on
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
			}
			aCause = context.Cause(ctx)
			if bFirst {
				<-bDone
			} else {
				<-bStarted
			}
			ctx = context.WithoutCancel(ctx) // A goes on regardless
			tx, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				return Receipt{}, err
			}
			defer tx.Rollback()
			r, err := b.change(ctx, tx, "op", 10, "debit")
			if err != nil {
				return Receipt{}, err
			}
			aCommit = idemsql.Commit(ctx, tx, r)
			close(aCommitted)
			return r, aCommit
		})
	}()
	<-aStarted
	// B waits for A's lease to end on the server, then takes over.
	bGot, bErr := idem.Do(ctx, ownerB, "op", fp, func(ctx context.Context) (Receipt, error) {
		close(bStarted)
		if !bFirst {
			<-aCommitted
		}
		return b.debit("op", 10)(ctx)
	})
	close(bDone)
	<-aDone

	if !errors.Is(aCause, idem.ErrLeaseLost) {
		t.Errorf("A's context ended with %v, want ErrLeaseLost", aCause)
	}
	winner, loser := bGot, "A"
	if bFirst {
		if !errors.Is(aCommit, idem.ErrRecorded) {
			t.Errorf("A's Commit after B's: %v, want ErrRecorded", aCommit)
		}
		if bErr != nil || bGot.Attempt != 2 {
			t.Fatalf("B: %v, %v; want its own receipt as attempt 2", bGot, bErr)
		}
	} else {
		if aCommit != nil {
			t.Fatalf("A's Commit before B's: %v", aCommit)
		}
		winner, loser = aGot, "B"
		if winner.Attempt != 1 {
			t.Errorf("A's receipt %v, want attempt 1", winner)
		}
	}
	if aErr != nil || aGot != winner {
		t.Errorf("A's Do: %v, %v; want the winner's %v", aGot, aErr, winner)
	}
	if bErr != nil || bGot != winner {
		t.Errorf("B's Do: %v, %v; want the winner's %v", bGot, bErr, winner)
	}
	if n := b.movements(t, "op"); n != 1 {
		t.Errorf("%d movements, want 1: %s's transaction must roll back", n, loser)
	}
	var attempt int64
	if err := b.db.QueryRow(b.q("SELECT attempt FROM movements WHERE op = ?"), "op").Scan(&attempt); err != nil || attempt != winner.Attempt {
		t.Errorf("the movement is attempt %d's (%v), want the winner's %d", attempt, err, winner.Attempt)
	}
	if n := b.balance(t); n != opening-10 {
		t.Errorf("balance %d, want %d", n, opening-10)
	}
	if e := b.entry(t, "op"); e.Attempt != winner.Attempt {
		t.Errorf("ledger entry of attempt %d, want %d", e.Attempt, winner.Attempt)
	}
	// Redis holds the winner's outcome too: a third caller replays it.
	third := b.client(t)
	if r, err := idem.Do(ctx, third, "op", fp, b.debit("op", 10)); err != nil || r != winner {
		t.Errorf("a later call: %v, %v; want %v", r, err, winner)
	}
}
