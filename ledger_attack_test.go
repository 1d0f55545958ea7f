package idem_test

// Attacks on the ledger (idem.WithLedger): Ledgers that answer for another
// key or with a malformed fingerprint, a lookup slower than the lease, a
// stale owner that commits after its lease ended, commits left behind by
// fn, and in-process followers sharing a ledger's outcome.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

// foldedLedger is a memLedger whose key column compares keys without case,
// as a SQL column with a case-insensitive collation does (MySQL's default,
// citext in Postgres, NOCASE in SQLite): "Order-1" and "order-1" are one
// row to it. Its lookups and its unique key answer with the row of the
// other key.
type foldedLedger struct{ *memLedger }

func (l foldedLedger) Lookup(ctx context.Context, key string) (idem.Entry, bool, error) {
	l.lookups.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[strings.ToLower(key)]
	return e, ok, nil
}

func (l foldedLedger) commit(ctx context.Context, v []byte) error {
	return idem.Commit(ctx, &memTx{l: l.memLedger, fold: true}, v)
}

// A Ledger that answers a lookup with the row of another key: Do must not
// return that key's outcome as this one's, nor finish this key's record
// with it. It fails closed, with fn not run.
func TestLedgerAttackLookupOfAnotherKey(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := foldedLedger{newMemLedger()}
	c := b.Idem(t, idem.WithLedger(l), idem.WithLedgerLookups(true))
	if v, err := c.Do(ctx, "Order-1", "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("receipt of Order-1"), l.commit(ctx, []byte("receipt of Order-1"))
	}); err != nil || string(v) != "receipt of Order-1" {
		t.Fatalf("Order-1: %q, %v", v, err)
	}
	var ran atomic.Bool
	v, err := c.Do(ctx, "order-1", "fp", func(ctx context.Context) ([]byte, error) {
		ran.Store(true)
		return []byte("receipt of order-1"), l.commit(ctx, []byte("receipt of order-1"))
	})
	if err == nil || string(v) == "receipt of Order-1" {
		t.Fatalf("order-1: got %q, %v; want an error, not the outcome of Order-1", v, err)
	}
	if !errors.Is(err, idem.ErrCorrupt) || !strings.Contains(err.Error(), `"Order-1"`) {
		t.Fatalf("order-1: %v; want ErrCorrupt naming the key the ledger answered with", err)
	}
	if ran.Load() {
		t.Fatal("fn ran after the ledger answered for another key")
	}
	if st := idemtest.Status(t, b, "order-1"); st.State == idem.StateDone {
		t.Fatal("order-1's record was finished with the outcome of Order-1")
	}
}

// The same Ledger met at the commit: the INSERT of "order-1" finds the row
// of "Order-1" under its unique key. That row is not this call's outcome:
// the commit fails (nothing applied), and Do says why instead of returning
// the other key's outcome.
func TestLedgerAttackFoundOfAnotherKey(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := foldedLedger{newMemLedger()}
	c := b.Idem(t, idem.WithLedger(l))
	if _, err := c.Do(ctx, "Order-1", "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("receipt of Order-1"), l.commit(ctx, []byte("receipt of Order-1"))
	}); err != nil {
		t.Fatal(err)
	}
	var commitErr error
	v, err := c.Do(ctx, "order-1", "fp", func(ctx context.Context) ([]byte, error) {
		commitErr = l.commit(ctx, []byte("receipt of order-1"))
		return []byte("receipt of order-1"), commitErr
	})
	if errors.Is(commitErr, idem.ErrRecorded) || !errors.Is(commitErr, idem.ErrCorrupt) {
		t.Fatalf("the commit of order-1 returned %v; want ErrCorrupt, not ErrRecorded", commitErr)
	}
	if err == nil || string(v) == "receipt of Order-1" {
		t.Fatalf("order-1: got %q, %v; want an error, not the outcome of Order-1", v, err)
	}
	if st := idemtest.Status(t, b, "order-1"); st.State == idem.StateDone {
		t.Fatal("order-1's record was finished with the outcome of Order-1")
	}
	if l.changes("order-1") != 0 || l.changes("Order-1") != 1 {
		t.Fatalf("changes: order-1 %d, Order-1 %d; want 0 and 1", l.changes("order-1"), l.changes("Order-1"))
	}
}

// scriptedLedger answers every lookup with what entry returns.
type scriptedLedger struct {
	entry func(key string) (idem.Entry, bool, error)
}

func (l scriptedLedger) Lookup(ctx context.Context, key string) (idem.Entry, bool, error) {
	return l.entry(key)
}

func (scriptedLedger) MaxKeyLen() int { return 0 }

// A Ledger that answers with a fingerprint that is no digest idem made
// (a hex string, a column padded to 300 bytes): a clear error, fn not run,
// and no record in Redis that later calls could not read.
func TestLedgerAttackMalformedFingerprint(t *testing.T) {
	t.Parallel()
	for _, fp := range []string{strings.Repeat("ab", 16), strings.Repeat("x", 300), "x"} {
		t.Run(fmt.Sprint(len(fp)), func(t *testing.T) {
			b := idemtest.Miniredis(t)
			ctx := context.Background()
			l := scriptedLedger{func(key string) (idem.Entry, bool, error) {
				return idem.Entry{Key: key, FingerprintDigest: fp, Attempt: 1, Value: []byte("v")}, true, nil
			}}
			c := b.Idem(t, idem.WithLedger(l), idem.WithLedgerLookups(true))
			for _, callFP := range []string{"", "fp"} {
				key := "k" + callFP
				_, err := c.Do(ctx, key, callFP, func(ctx context.Context) ([]byte, error) {
					t.Error("fn ran")
					return nil, nil
				})
				if !errors.Is(err, idem.ErrCorrupt) {
					t.Fatalf("fingerprint %q: %v; want ErrCorrupt", callFP, err)
				}
				st, err := b.Idem(t).Status(ctx, key)
				if err != nil || st.State == idem.StateDone {
					t.Fatalf("fingerprint %q: the record after the lookup: %+v, %v; want it readable and not done", callFP, st, err)
				}
			}
		})
	}
}

// A lookup slower than the lease while the renewals fail: fn does not
// start on a lease that ended (or has next to nothing left), as it would
// not start on such a claim; the call is retryable and another caller
// takes over.
func TestLedgerAttackSlowLookupEndsLease(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	const lease = time.Second
	ctx := context.Background()
	in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "renew"), Action: faultconn.CloseBefore})
	l := newMemLedger()
	slow := scriptedLedger{func(key string) (idem.Entry, bool, error) {
		time.Sleep(2 * lease)
		return l.Lookup(ctx, key)
	}}
	c := idemtest.Faulty(t, b, in, idemtest.NoRetry, idem.WithLease(lease), idem.WithLedger(slow),
		idem.WithLedgerLookups(true), idem.WithLogger(nil))
	var ran atomic.Bool
	_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		ran.Store(true)
		return []byte("v"), nil
	})
	if ran.Load() {
		t.Fatal("fn started after the lookup had outlasted the lease")
	}
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do: %v; want ErrLeaseLost", err)
	}
}

// Row 37 with a real lease: the first owner's renewals never reach Redis,
// its lease ends, and it commits all the same (it ignores its cancelled
// context, as a paused process would). A second caller has taken over
// meanwhile and found nothing in the ledger. Whichever commits first wins:
// the other applies nothing, and both calls, and every replay, return the
// winner's outcome.
func TestLedgerAttackStaleOwnerCommits(t *testing.T) {
	t.Parallel()
	for _, staleFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("staleFirst=%v", staleFirst), func(t *testing.T) {
			b := idemtest.Redis(t, redistest.Config{})
			const lease = time.Second
			ctx := context.Background()
			l := newMemLedger()
			in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "renew"), Action: faultconn.CloseBefore})
			stale := idemtest.Faulty(t, b, in, idemtest.NoRetry, idem.WithLease(lease), idem.WithLedger(l), idem.WithLogger(nil))
			fresh := b.Idem(t, idem.WithLease(10*time.Second), idem.WithLedger(l), idem.WithWait(30*time.Second))

			aCtxDone, aGo, aCommitted := make(chan struct{}), make(chan struct{}), make(chan struct{})
			type result struct {
				v   []byte
				err error
			}
			aDone := make(chan result, 1)
			go func() {
				v, err := stale.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
					<-ctx.Done()
					close(aCtxDone)
					<-aGo
					err := commit(ctx, l, []byte("from-A"))
					close(aCommitted)
					return []byte("from-A"), err
				})
				aDone <- result{v, err}
			}()
			<-aCtxDone
			idemtest.Eventually(t, 10*time.Second, "the stale owner's lease to end on the server", func() bool {
				return idemtest.LeaseLeft(t, b, "k") < 0
			})
			bIn, bGo := make(chan struct{}), make(chan struct{})
			bDone := make(chan result, 1)
			go func() {
				v, err := fresh.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
					close(bIn)
					<-bGo
					return []byte("from-B"), commit(ctx, l, []byte("from-B"))
				})
				bDone <- result{v, err}
			}()
			select {
			case <-bIn:
			case r := <-bDone:
				t.Fatalf("the takeover returned %q, %v without running fn", r.v, r.err)
			}
			var ra, rb result
			want := "from-B"
			if staleFirst {
				want = "from-A"
				close(aGo)
				<-aCommitted
				close(bGo)
				rb = <-bDone
				ra = <-aDone
			} else {
				close(bGo)
				rb = <-bDone
				close(aGo)
				ra = <-aDone
			}
			if ra.err != nil || string(ra.v) != want || rb.err != nil || string(rb.v) != want {
				t.Fatalf("stale owner %q, %v; new owner %q, %v; want %s for both", ra.v, ra.err, rb.v, rb.err, want)
			}
			if n := l.changes("k"); n != 1 {
				t.Fatalf("%d changes applied; want 1", n)
			}
			idemtest.WantStatus(t, b, "k", idem.StateDone, 2)
			if v, err := b.Idem(t, idem.WithLedger(l)).Do(ctx, "k", "fp", l.fnFails(t)); err != nil || string(v) != want {
				t.Fatalf("replay: %q, %v; want %s", v, err, want)
			}
		})
	}
}

// fn hands its commit to a goroutine and returns an error before the
// commit lands (a commit that outlives fn, as a transaction whose COMMIT
// was sent when fn's caller gave up). Do reports the error, not a success;
// the next attempt finds the commit in the ledger and returns it without
// running fn.
func TestLedgerAttackCommitLeftBehind(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := newMemLedger()
	c := b.Idem(t, idem.WithLedger(l), idem.WithWait(0))
	returned, landed := make(chan struct{}), make(chan struct{})
	entered := make(chan struct{})
	_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		go func() {
			defer close(landed)
			tx := &memTx{l: l, hold: func() { close(entered); <-returned }}
			if err := idem.Commit(ctx, tx, []byte("receipt")); err != nil {
				t.Errorf("the late commit: %v", err)
			}
		}()
		<-entered // the COMMIT is on its way; fn gives up before it lands
		return nil, errors.New("gave up waiting for the database")
	})
	if err == nil || errors.Is(err, idem.ErrRecorded) {
		t.Fatalf("Do: %v; want fn's error", err)
	}
	close(returned)
	<-landed
	idemtest.WantStatus(t, b, "k", idem.StateReleased, 1)
	v, err := c.Do(ctx, "k", "fp", l.fnFails(t))
	if err != nil || string(v) != "receipt" {
		t.Fatalf("attempt 2: %q, %v; want the commit that landed after attempt 1 returned", v, err)
	}
	if l.changes("k") != 1 {
		t.Fatalf("changes %d", l.changes("k"))
	}
}

// In-process followers (one Client, one key) share the owner's outcome as
// the ledger decided it: the committed value, not what fn returned after
// the commit; and a conflict that the ledger found.
func TestLedgerAttackFollowersShareLedgerOutcome(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l), idem.WithWait(30*time.Second))
		var runs atomic.Int64
		committed := ledgerReceipt{ID: "r1", Amount: 100, Tags: []string{}}
		fn := func(ctx context.Context) (ledgerReceipt, error) {
			runs.Add(1)
			idemtest.Eventually(t, 10*time.Second, "a follower", func() bool { return idem.HasFollower(c, "k") })
			if err := commit(ctx, l, committed); err != nil {
				return ledgerReceipt{}, err
			}
			return ledgerReceipt{ID: "returned after the commit"}, nil
		}
		var wg sync.WaitGroup
		got := make([]ledgerReceipt, 8)
		errs := make([]error, len(got))
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], errs[i] = idem.Do(ctx, c, "k", "fp", fn)
			}()
		}
		wg.Wait()
		for i := range got {
			if errs[i] != nil || got[i].ID != "r1" || got[i].Tags == nil {
				t.Fatalf("caller %d: %+v, %v; want the committed r1", i, got[i], errs[i])
			}
		}
		if runs.Load() != 1 || l.changes("k") != 1 {
			t.Fatalf("runs %d, changes %d", runs.Load(), l.changes("k"))
		}

		// The ledger holds other parameters' outcome (Redis lost it): the
		// owner's commit finds a conflict, and so do its followers.
		if _, err := idem.Do(ctx, c, "k2", "other", func(ctx context.Context) (ledgerReceipt, error) {
			return ledgerReceipt{ID: "other"}, commit(ctx, l, ledgerReceipt{ID: "other"})
		}); err != nil {
			t.Fatal(err)
		}
		b.Do(t, "DEL", idem.RecordKey(c, "k2"))
		fn2 := func(ctx context.Context) (ledgerReceipt, error) {
			idemtest.Eventually(t, 10*time.Second, "a follower", func() bool { return idem.HasFollower(c, "k2") })
			return ledgerReceipt{ID: "mine"}, commit(ctx, l, ledgerReceipt{ID: "mine"})
		}
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], errs[i] = idem.Do(ctx, c, "k2", "fp", fn2)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if !errors.Is(err, idem.ErrConflict) {
				t.Fatalf("caller %d with k2: %+v, %v; want ErrConflict", i, got[i], err)
			}
		}
		if l.changes("k2") != 1 {
			t.Fatalf("k2: %d changes", l.changes("k2"))
		}
	})
}

// A Ledger whose Lookup panics: the panic reaches the caller as fn's
// would, the claim is given back, fn does not run, nothing leaks; the next
// call, with the ledger mended, takes over.
func TestLedgerAttackLookupPanics(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := newMemLedger()
	var broken atomic.Bool
	broken.Store(true)
	pl := scriptedLedger{func(key string) (idem.Entry, bool, error) {
		if broken.Load() {
			panic("the driver panicked")
		}
		return l.Lookup(ctx, key)
	}}
	c := b.Idem(t, idem.WithLedger(pl), idem.WithLedgerLookups(true))
	func() {
		defer func() {
			if r := recover(); r != "the driver panicked" {
				t.Fatalf("recovered %v; want the Lookup's panic", r)
			}
		}()
		_, _ = c.Do(ctx, "k", "fp", l.fnFails(t))
		t.Fatal("Do returned")
	}()
	idemtest.WantStatus(t, b, "k", idem.StateReleased, 1)
	broken.Store(false)
	got, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("v"), commit(ctx, l, []byte("v"))
	})
	if err != nil || string(got) != "v" {
		t.Fatalf("after the panic: %q, %v", got, err)
	}
	idemtest.WantStatus(t, b, "k", idem.StateDone, 2)
}

// The caller gives up while fn commits: the commit stands, Do returns the
// committed outcome, and the record is finished (with a detached context).
func TestLedgerAttackCommitAfterCallerGaveUp(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		ctx, cancel := context.WithCancel(context.Background())
		got, err := c.Do(ctx, "k", "fp", func(fctx context.Context) ([]byte, error) {
			cancel()
			<-fctx.Done()
			return []byte("v"), commit(fctx, l, []byte("v"))
		})
		if err != nil || string(got) != "v" {
			t.Fatalf("Do: %q, %v; want the committed outcome", got, err)
		}
		idemtest.WantStatus(t, b, "k", idem.StateDone, 1)
	})
}

// Do inside fn, both with ledgers: each call commits its own outcome;
// after Redis lost everything, each fn runs again and each commit finds
// its own row.
func TestLedgerAttackNestedDo(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		plain := b.Idem(t, idem.WithPrefix("plain"))
		var n atomic.Int64
		outer := func(ctx context.Context) (string, error) {
			in, err := idem.Do(ctx, c, "inner", "fp", func(ctx context.Context) (string, error) {
				v := fmt.Sprint("inner#", n.Add(1))
				return v, commit(ctx, l, v)
			})
			if err != nil {
				return "", err
			}
			// A nested call of a Client without a ledger: its fn cannot
			// commit through the outer call's.
			if _, err := plain.Do(ctx, "plain", "", func(ctx context.Context) ([]byte, error) {
				return nil, commit(ctx, l, []byte("x"))
			}); !errors.Is(err, idem.ErrNoLedger) {
				return "", fmt.Errorf("a commit in a nested call without a ledger: %v", err)
			}
			v := fmt.Sprint(in, "/outer#", n.Add(1))
			return v, commit(ctx, l, v)
		}
		want, err := idem.Do(ctx, c, "outer", "fp", outer)
		if err != nil || want != "inner#1/outer#2" {
			t.Fatalf("first: %q, %v", want, err)
		}
		b.Do(t, "FLUSHALL")
		if got, err := idem.Do(ctx, c, "outer", "fp", outer); err != nil || got != want {
			t.Fatalf("after FLUSHALL: %q, %v; want %q", got, err, want)
		}
		if l.changes("outer") != 1 || l.changes("inner") != 1 {
			t.Fatalf("changes: outer %d, inner %d", l.changes("outer"), l.changes("inner"))
		}
	})
}

// A conflict that the ledger decides (the commit meets another
// fingerprint's row; a takeover's lookup finds one) is a conflict to the
// observer, as it is to the caller: not a replay.
func TestLedgerAttackConflictEvents(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := newMemLedger()
	var rec recorder
	c := b.Idem(t, idem.WithLedger(l), idem.WithObserver(&rec))
	if _, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("v"), commit(ctx, l, []byte("v"))
	}); err != nil {
		t.Fatal(err)
	}
	rec.take()
	for _, lookups := range []bool{false, true} {
		b.Do(t, "FLUSHALL")
		c := c
		if lookups {
			c = b.Idem(t, idem.WithLedger(l), idem.WithObserver(&rec), idem.WithLedgerLookups(true))
		}
		_, err := c.Do(ctx, "k", "other", func(ctx context.Context) ([]byte, error) {
			return []byte("w"), commit(ctx, l, []byte("w"))
		})
		if !errors.Is(err, idem.ErrConflict) {
			t.Fatalf("lookups %v: %v; want ErrConflict", lookups, err)
		}
		ev := rec.take()
		if k := kinds(ev); k != idem.EventConflict.String() || !errors.Is(ev[0].Err, idem.ErrConflict) {
			t.Fatalf("lookups %v: events %s (%v); want one conflict with its error", lookups, k, ev)
		}
	}
}
