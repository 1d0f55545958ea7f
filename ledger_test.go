package idem_test

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
	"github.com/idem-go/idem/internal/idemtest"
)

// memLedger is an idem.Ledger kept in memory: a stand-in for a database in
// which fn's business change and the outcome commit in one transaction
// (commit below holds the mutex over both, as a transaction would).
type memLedger struct {
	mu      sync.Mutex
	entries map[string]idem.Entry
	applied map[string]int // business changes applied, by key
	lookups atomic.Int64
	fail    atomic.Pointer[error] // Lookup's error, when set
	age     atomic.Int64          // the Age of every entry read, as a time.Duration
}

func newMemLedger() *memLedger {
	return &memLedger{entries: map[string]idem.Entry{}, applied: map[string]int{}}
}

func (l *memLedger) Lookup(ctx context.Context, key string) (idem.Entry, bool, error) {
	l.lookups.Add(1)
	if err := l.fail.Load(); err != nil {
		return idem.Entry{}, false, *err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	e.Age = time.Duration(l.age.Load())
	return e, ok, nil
}

func (l *memLedger) MaxKeyLen() int { return 0 }

// memTx is a transaction of a memLedger, as a driver hands it to
// idem.Commit: its business change is applied with its commit, under the
// ledger's mutex, and only when the key has no entry yet. fold makes the
// key column compare keys without case (see foldedLedger); hold, when set,
// runs first (a COMMIT on its way).
type memTx struct {
	l    *memLedger
	fold bool
	hold func()
}

func (tx *memTx) Commit(ctx context.Context, e idem.Entry) (idem.Entry, bool, error) {
	if tx.hold != nil {
		tx.hold()
	}
	l := tx.l
	l.mu.Lock()
	defer l.mu.Unlock()
	k := e.Key
	if tx.fold {
		k = strings.ToLower(k)
	}
	if old, ok := l.entries[k]; ok {
		old.Age = time.Duration(l.age.Load())
		return old, true, nil
	}
	l.entries[k] = e
	l.applied[e.Key]++
	return idem.Entry{}, false, nil
}

func (tx *memTx) Rollback(context.Context) error { return nil }

// failedTx is a transaction whose COMMIT fails, its end unknown; got, when
// set, keeps the entry it was given.
type failedTx struct{ got *idem.Entry }

func (tx *failedTx) Commit(ctx context.Context, e idem.Entry) (idem.Entry, bool, error) {
	if tx.got != nil {
		*tx.got = e
	}
	return idem.Entry{}, false, errors.New("connection lost during COMMIT")
}

func (tx *failedTx) Rollback(context.Context) error { return nil }

// commit applies the business change and records v as the call's outcome
// in one step, as idemsql.Commit does in a transaction: when the ledger
// holds an outcome for the key already, it applies nothing.
func commit[T any](ctx context.Context, l *memLedger, v T) error {
	return idem.Commit(ctx, &memTx{l: l}, v)
}

// commitFailure records err as the call's permanent failure, with its
// business change (a declined payment's row), in one step.
func commitFailure(ctx context.Context, l *memLedger, err error) error {
	return idem.CommitError(ctx, &memTx{l: l}, err)
}

func (l *memLedger) changes(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied[key]
}

func TestLedgerCommitReplays(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		var runs atomic.Int64
		fn := func(ctx context.Context) ([]byte, error) {
			runs.Add(1)
			r := []byte("receipt-1")
			return r, commit(ctx, l, r)
		}
		for i := range 3 {
			got, err := c.Do(ctx, "k", "fp", fn)
			if err != nil || string(got) != "receipt-1" {
				t.Fatalf("call %d: got %q, %v; want receipt-1", i, got, err)
			}
		}
		if runs.Load() != 1 || l.changes("k") != 1 {
			t.Fatalf("fn ran %d times, %d changes; want 1 and 1", runs.Load(), l.changes("k"))
		}
		if n := l.lookups.Load(); n != 0 {
			t.Fatalf("%d lookups for a fresh key; want none", n)
		}
	})
}

// Redis lost the record (a restart without persistence, FLUSHALL): the
// next call runs fn as attempt 1, its commit meets the ledger's unique key,
// and Do returns the recorded outcome; the change stays applied once.
func TestLedgerRedisLostTheRecord(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		var runs atomic.Int64
		fn := func(ctx context.Context) ([]byte, error) {
			n := runs.Add(1)
			r := []byte(fmt.Sprintf("receipt-%d", n))
			return r, commit(ctx, l, r)
		}
		if got, err := c.Do(ctx, "k", "fp", fn); err != nil || string(got) != "receipt-1" {
			t.Fatalf("first call: %q, %v", got, err)
		}
		b.Do(t, "FLUSHALL")
		got, err := c.Do(ctx, "k", "fp", fn)
		if err != nil || string(got) != "receipt-1" {
			t.Fatalf("after FLUSHALL: got %q, %v; want the recorded receipt-1", got, err)
		}
		if runs.Load() != 2 || l.changes("k") != 1 {
			t.Fatalf("fn ran %d times (want 2: the second rolled back), changes %d (want 1)", runs.Load(), l.changes("k"))
		}
		// The record is finished from the ledger: a third call replays
		// from Redis without running fn.
		if got, err := c.Do(ctx, "k", "fp", fn); err != nil || string(got) != "receipt-1" || runs.Load() != 2 {
			t.Fatalf("third call: %q, %v, runs %d", got, err, runs.Load())
		}
		// Other parameters, after another loss: a conflict, from the ledger.
		b.Do(t, "FLUSHALL")
		if _, err := c.Do(ctx, "k", "other", fn); !errors.Is(err, idem.ErrConflict) {
			t.Fatalf("other fingerprint after FLUSHALL: %v; want ErrConflict", err)
		}
		if l.changes("k") != 1 {
			t.Fatalf("changes %d; want 1", l.changes("k"))
		}
		// ... and Redis now says so at once, without fn.
		before := runs.Load()
		if _, err := c.Do(ctx, "k", "other", fn); !errors.Is(err, idem.ErrConflict) || runs.Load() != before {
			t.Fatalf("other fingerprint again: %v, runs %d -> %d", err, before, runs.Load())
		}
		if got, err := c.Do(ctx, "k", "fp", fn); err != nil || string(got) != "receipt-1" {
			t.Fatalf("the recorded parameters: %q, %v", got, err)
		}
	})
}

// The owner died between its commit and the completion: the key stays in
// progress until the lease ends, then the next caller takes over, finds
// the outcome in the ledger and returns it without running fn.
func TestLedgerTakeoverFindsTheCommit(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		lease := time.Second
		c := b.Idem(t, idem.WithLedger(l), idem.WithLease(lease), idem.WithWait(0))
		// What a dead owner left: its commit, and its claim in Redis.
		var first idem.Entry
		dead := b.Idem(t, idem.WithLedger(l), idem.WithLease(lease))
		_, err := dead.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			if err := idem.Commit(ctx, &failedTx{got: &first}, []byte("receipt-1")); err == nil {
				return nil, errors.New("failedTx committed")
			}
			return nil, errors.New("not committed")
		})
		if err == nil {
			t.Fatal("the dead owner's call succeeded")
		}
		l.mu.Lock()
		l.entries["k"], l.applied["k"] = first, 1
		l.mu.Unlock()
		b.Do(t, "SET", "idem:{k}", idemtest.InProgress("dead-owner", 2, time.Hour, lease), "PX", time.Hour.Milliseconds())
		if _, err := c.Do(ctx, "k", "fp", l.fnFails(t)); !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("during the dead owner's lease: %v; want ErrInProgress", err)
		}
		b.Advance(t, lease+100*time.Millisecond)
		got, err := c.Do(ctx, "k", "fp", l.fnFails(t))
		if err != nil || string(got) != "receipt-1" {
			t.Fatalf("takeover: %q, %v; want receipt-1 from the ledger", got, err)
		}
		if n := l.lookups.Load(); n != 1 {
			t.Fatalf("%d lookups; want 1", n)
		}
		st := idemtest.Status(t, b, "k")
		if st.State != idem.StateDone || st.Attempt != 3 {
			t.Fatalf("status %+v; want done by attempt 3", st)
		}
		if got, err := c.Do(ctx, "k", "fp", l.fnFails(t)); err != nil || string(got) != "receipt-1" {
			t.Fatalf("replay: %q, %v", got, err)
		}
		if l.changes("k") != 1 {
			t.Fatalf("changes %d; want 1", l.changes("k"))
		}
	})
}

// fnFails returns an fn that fails the test if it runs.
func (l *memLedger) fnFails(t *testing.T) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		t.Error("fn ran")
		return nil, errors.New("fn ran")
	}
}

// Two owners live at once (the first one's record was lost while it ran):
// the second commits first; the first one's commit finds it, applies
// nothing, and both return the second's outcome.
func TestLedgerTwoLiveOwners(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		a := b.Idem(t, idem.WithLedger(l))
		bc := b.Idem(t, idem.WithLedger(l))
		started, proceed := make(chan struct{}), make(chan struct{})
		var aErr atomic.Pointer[error]
		type result struct {
			v   []byte
			err error
		}
		aDone := make(chan result, 1)
		go func() {
			v, err := a.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
				close(started)
				<-proceed
				err := commit(ctx, l, []byte("from-A"))
				aErr.Store(&err)
				return []byte("from-A"), err
			})
			aDone <- result{v, err}
		}()
		<-started
		b.Do(t, "DEL", "idem:{k}") // A's record is lost
		v, err := bc.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			return []byte("from-B"), commit(ctx, l, []byte("from-B"))
		})
		if err != nil || string(v) != "from-B" {
			t.Fatalf("B: %q, %v", v, err)
		}
		close(proceed)
		r := <-aDone
		if r.err != nil || string(r.v) != "from-B" {
			t.Fatalf("A: %q, %v; want B's outcome", r.v, r.err)
		}
		if e := *aErr.Load(); !errors.Is(e, idem.ErrRecorded) {
			t.Fatalf("A's commit returned %v; want ErrRecorded", e)
		}
		if l.changes("k") != 1 {
			t.Fatalf("changes %d; want 1", l.changes("k"))
		}
		if v, err := a.Do(ctx, "k", "fp", l.fnFails(t)); err != nil || string(v) != "from-B" {
			t.Fatalf("replay: %q, %v", v, err)
		}
	})
}

type ledgerReceipt struct {
	ID     string
	Amount int64
	Tags   []string
}

func TestLedgerTyped(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		want := ledgerReceipt{ID: "r1", Amount: 100, Tags: []string{}}
		got, err := idem.Do(ctx, c, "k", "fp", func(ctx context.Context) (ledgerReceipt, error) {
			return want, commit(ctx, l, want)
		})
		if err != nil || got.ID != "r1" || got.Tags == nil {
			t.Fatalf("owner: %+v, %v", got, err)
		}
		// Found: Redis lost the record; the second call's commit meets the
		// first's, and its Do decodes the recorded receipt.
		b.Do(t, "FLUSHALL")
		got, err = idem.Do(ctx, c, "k", "fp", func(ctx context.Context) (ledgerReceipt, error) {
			r := ledgerReceipt{ID: "r2", Amount: 100}
			return r, commit(ctx, l, r)
		})
		if err != nil || got.ID != "r1" || got.Amount != 100 {
			t.Fatalf("after FLUSHALL: %+v, %v; want r1", got, err)
		}
		// A value of another type than Do's T is refused, nothing committed.
		_, err = idem.Do(ctx, c, "k2", "fp", func(ctx context.Context) (ledgerReceipt, error) {
			return ledgerReceipt{}, commit(ctx, l, "a string")
		})
		if !errors.Is(err, idem.ErrEncode) || l.changes("k2") != 0 {
			t.Fatalf("commit of another type: %v, changes %d; want ErrEncode and none", err, l.changes("k2"))
		}
	})
}

func TestLedgerCommittedFailure(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		declined := errors.New("card declined")
		var runs atomic.Int64
		fn := func(ctx context.Context) (ledgerReceipt, error) {
			runs.Add(1)
			return ledgerReceipt{}, commitFailure(ctx, l, idem.PermanentCode("card_declined", declined))
		}
		for i := range 2 {
			_, err := idem.Do(ctx, c, "k", "fp", fn)
			var se *idem.StoredError
			if i == 0 && !errors.Is(err, declined) {
				t.Fatalf("owner: %v; want the declined error", err)
			}
			if i == 1 && (!errors.As(err, &se) || se.Code != "card_declined" || se.Message != "card declined") {
				t.Fatalf("replay: %#v; want the stored failure", err)
			}
		}
		b.Do(t, "FLUSHALL")
		_, err := idem.Do(ctx, c, "k", "fp", fn)
		var se *idem.StoredError
		if !errors.As(err, &se) || se.Code != "card_declined" {
			t.Fatalf("after FLUSHALL: %v; want the recorded failure", err)
		}
		if runs.Load() != 2 || l.changes("k") != 1 {
			t.Fatalf("runs %d (want 2), changes %d (want 1)", runs.Load(), l.changes("k"))
		}
	})
}

// Bad input: a commit outside Do, with a Client without a ledger, twice in
// one call, after fn returned, of a value too large or of another type:
// each a clear error, nothing committed.
func TestLedgerCommitRefused(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := newMemLedger()
	if err := commit(ctx, l, []byte("x")); !errors.Is(err, idem.ErrNoLedger) || !strings.Contains(err.Error(), "not inside") {
		t.Fatalf("outside Do: %v", err)
	}
	plain := b.Idem(t)
	_, err := plain.Do(ctx, "k", "", func(ctx context.Context) ([]byte, error) {
		return nil, commit(ctx, l, []byte("x"))
	})
	if !errors.Is(err, idem.ErrNoLedger) || !strings.Contains(err.Error(), "WithLedger") {
		t.Fatalf("Client without a ledger: %v", err)
	}
	c := b.Idem(t, idem.WithLedger(l), idem.WithMaxResultSize(8))
	var second error
	var left context.Context
	_, err = c.Do(ctx, "twice", "", func(ctx context.Context) ([]byte, error) {
		left = ctx
		if err := commit(ctx, l, []byte("one")); err != nil {
			return nil, err
		}
		second = commit(ctx, l, []byte("two"))
		return []byte("one"), nil
	})
	if err != nil || !errors.Is(second, idem.ErrNoLedger) {
		t.Fatalf("second commit: Do %v, commit %v; want ErrNoLedger", err, second)
	}
	if err := commit(left, l, []byte("late")); !errors.Is(err, idem.ErrNoLedger) {
		t.Fatalf("commit after fn returned: %v", err)
	}
	_, err = c.Do(ctx, "big", "", func(ctx context.Context) ([]byte, error) {
		return nil, commit(ctx, l, []byte("far too large"))
	})
	if !errors.Is(err, idem.ErrTooLarge) || l.changes("big") != 0 {
		t.Fatalf("too large: %v, changes %d", err, l.changes("big"))
	}
	_, err = c.Do(ctx, "type", "", func(ctx context.Context) ([]byte, error) {
		return nil, commit(ctx, l, "a string")
	})
	if !errors.Is(err, idem.ErrEncode) || l.changes("type") != 0 {
		t.Fatalf("a string in Client.Do: %v, changes %d", err, l.changes("type"))
	}
	if l.changes("twice") != 1 {
		t.Fatalf("twice: %d changes", l.changes("twice"))
	}
}

// A failing lookup leaves fn unrun and the key released: the next call
// with a working ledger runs fn.
func TestLedgerLookupFails(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l), idem.WithLedgerLookups(true))
		boom := errors.New("database down")
		l.fail.Store(&boom)
		_, err := c.Do(ctx, "k", "fp", l.fnFails(t))
		if !errors.Is(err, boom) || errors.Is(err, idem.ErrNotRecorded) {
			t.Fatalf("lookup failed: %v; want the database's error", err)
		}
		idemtest.WantStatus(t, b, "k", idem.StateReleased, 1)
		l.fail.Store(nil)
		got, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			a, _ := idem.AttemptFrom(ctx)
			r := []byte(fmt.Sprintf("attempt-%d", a.Number))
			return r, commit(ctx, l, r)
		})
		if err != nil || string(got) != "attempt-2" {
			t.Fatalf("after the database came back: %q, %v", got, err)
		}
		if n := l.lookups.Load(); n != 2 {
			t.Fatalf("%d lookups; want 2 (every fn, with WithLedgerLookups(true))", n)
		}
	})
}

// Once the commit is in, fn's own later error does not undo it.
func TestLedgerErrorAfterCommit(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l), idem.WithLogger(nil))
		got, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			if err := commit(ctx, l, []byte("done")); err != nil {
				return nil, err
			}
			return nil, errors.New("the notification after the commit failed")
		})
		if err != nil || string(got) != "done" {
			t.Fatalf("got %q, %v; want the committed outcome", got, err)
		}
		idemtest.WantStatus(t, b, "k", idem.StateDone, 1)
	})
}

// Redis fails after the commit: Do still returns the committed outcome (it
// is recorded), and the next caller finishes the record from the ledger.
func TestLedgerCompletionFailsAfterCommit(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := newMemLedger()
	lease := time.Second
	c := b.Idem(t, idem.WithLedger(l), idem.WithLease(lease), idem.WithStoreTimeout(200*time.Millisecond), idem.WithLogger(nil))
	got, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		err := commit(ctx, l, []byte("done"))
		b.MR.SetError("LOADING Redis is loading the dataset in memory")
		return []byte("done"), err
	})
	b.MR.SetError("")
	if err != nil || string(got) != "done" {
		t.Fatalf("got %q, %v; want the committed outcome without error", got, err)
	}
	b.Advance(t, lease+100*time.Millisecond)
	got, err = c.Do(ctx, "k", "fp", l.fnFails(t))
	if err != nil || string(got) != "done" {
		t.Fatalf("next caller: %q, %v", got, err)
	}
	idemtest.WantStatus(t, b, "k", idem.StateDone, 2)
	if l.changes("k") != 1 {
		t.Fatalf("changes %d", l.changes("k"))
	}
}

// 30 concurrent callers with one key: one change, one outcome for all.
func TestLedgerConcurrentCallers(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		var runs atomic.Int64
		var wg sync.WaitGroup
		got := make([]string, 30)
		for i := range got {
			c := b.Idem(t, idem.WithLedger(l), idem.WithWait(30*time.Second))
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
					r := []byte(fmt.Sprintf("receipt-%d", runs.Add(1)))
					return r, commit(ctx, l, r)
				})
				if err != nil {
					got[i] = err.Error()
					return
				}
				got[i] = string(v)
			}()
		}
		wg.Wait()
		for i, g := range got {
			if g != "receipt-1" {
				t.Fatalf("caller %d got %q", i, g)
			}
		}
		if runs.Load() != 1 || l.changes("k") != 1 {
			t.Fatalf("runs %d, changes %d", runs.Load(), l.changes("k"))
		}
	})
}

// A commit helper that is given only fn's context finds the Client's
// ledger with LedgerFrom (idemsql.Commit's case: its table is the
// ledger's); outside fn, and once the outcome is decided, it finds none.
func TestLedgerFromNamesTheLedger(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		_, err := c.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			got, err := idem.LedgerFrom(ctx)
			if err != nil {
				return nil, err
			}
			if got, ok := got.(*memLedger); !ok || got != l {
				t.Errorf("LedgerFrom = %v, want the Client's ledger", got)
			}
			if err := commit(ctx, l, []byte("r")); err != nil {
				return nil, err
			}
			if _, err := idem.LedgerFrom(ctx); !errors.Is(err, idem.ErrNoLedger) {
				t.Errorf("LedgerFrom after the commit: %v; want ErrNoLedger", err)
			}
			return []byte("r"), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := idem.LedgerFrom(context.Background()); !errors.Is(err, idem.ErrNoLedger) {
			t.Fatalf("LedgerFrom outside fn: %v; want ErrNoLedger", err)
		}
	})
}

// fn that swallows a failed commit and returns success does not get its
// result stored: the ledger has no row, so Redis must not have one either.
func TestLedgerSuccessAfterFailedCommit(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			// The helper's COMMIT failed; fn ignores it.
			_ = idem.Commit(ctx, &failedTx{}, []byte("lost"))
			return []byte("lost"), nil
		})
		if err == nil || !strings.Contains(err.Error(), "ledger commit did not complete") {
			t.Fatalf("Do: %v; want an error saying the commit did not complete", err)
		}
		idemtest.WantStatus(t, b, "k", idem.StateReleased, 1)
		got, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			return []byte("kept"), commit(ctx, l, []byte("kept"))
		})
		if err != nil || string(got) != "kept" || l.lookups.Load() != 1 {
			t.Fatalf("next call: %q, %v, %d lookups; want kept after one lookup", got, err, l.lookups.Load())
		}
	})
}

// A record finished from the ledger expires when its row is the retention
// old, whichever path finished it (the review's scenario: a takeover late
// in the retention finished the record, which then outlived a row pruned
// at the documented bound): the owner that committed, a takeover's lookup
// that found an old row, and a commit that met one.
func TestLedgerRecordExpiresWithItsRow(t *testing.T) {
	t.Parallel()
	const retention, lease = 3 * time.Second, 500 * time.Millisecond
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		pttl := func(key string) time.Duration {
			t.Helper()
			ms, ok := b.Do(t, "PTTL", "idem:{"+key+"}").(int64)
			if !ok || ms <= 0 {
				t.Fatalf("PTTL of %s: %v", key, b.Do(t, "PTTL", "idem:{"+key+"}"))
			}
			return time.Duration(ms) * time.Millisecond
		}
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l), idem.WithRetention(retention), idem.WithLease(lease), idem.WithWait(0))

		// The owner's own commit: the record keeps at most the retention.
		if _, err := c.Do(ctx, "own", "fp", func(ctx context.Context) ([]byte, error) {
			return []byte("r"), commit(ctx, l, []byte("r"))
		}); err != nil {
			t.Fatal(err)
		}
		if got := pttl("own"); got > retention {
			t.Fatalf("own commit: record TTL %v; want at most the retention %v", got, retention)
		}

		// A takeover 2.5 s after a dead owner's commit finds the row: the
		// record has 0.5 s left, not a retention of its own.
		l.mu.Lock()
		l.entries["late"] = idem.Entry{Key: "late", Attempt: 1, Value: []byte("receipt")}
		l.mu.Unlock()
		b.Do(t, "SET", "idem:{late}", idemtest.InProgress("dead-owner", 1, retention, lease), "PX", retention.Milliseconds())
		b.Advance(t, lease+100*time.Millisecond)
		l.age.Store(int64(2500 * time.Millisecond))
		if got, err := c.Do(ctx, "late", "fp", l.fnFails(t)); err != nil || string(got) != "receipt" {
			t.Fatalf("takeover: %q, %v", got, err)
		}
		if got := pttl("late"); got > retention-2500*time.Millisecond {
			t.Fatalf("takeover at 2.5 s: record TTL %v; want at most %v, what the row has left", got, retention-2500*time.Millisecond)
		}

		// Redis lost the record; a new attempt's commit meets a row older
		// than the retention (Prune has not reached it yet): the caller
		// gets the outcome, and the record expires at once.
		b.Do(t, "DEL", "idem:{late}")
		l.age.Store(int64(time.Hour))
		if got, err := c.Do(ctx, "late", "fp", func(ctx context.Context) ([]byte, error) {
			return []byte("second"), commit(ctx, l, []byte("second"))
		}); err != nil || string(got) != "receipt" {
			t.Fatalf("after Redis lost the record: %q, %v; want the recorded receipt", got, err)
		}
		if n, _ := b.Do(t, "PTTL", "idem:{late}").(int64); n > 10 {
			t.Fatalf("a record finished from a row past the retention lives %d ms; want it gone at once", n)
		}
		if l.changes("late") != 0 {
			t.Fatalf("the business change applied %d times after the dead owner's", l.changes("late"))
		}
	})
}

// A ledger that cannot index long keys lowers the Client's key limit: a
// longer key is refused before fn runs, and asking for more is refused at
// New.
func TestLedgerKeyLimit(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	l := &limitedLedger{newMemLedger(), 100}
	c := b.Idem(t, idem.WithLedger(l))
	if got := c.MaxKeyLen(); got != 100 {
		t.Fatalf("MaxKeyLen %d; want the ledger's 100", got)
	}
	_, err := c.Do(context.Background(), strings.Repeat("k", 101), "", l.fnFails(t))
	if !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("a 101-byte key: %v; want ErrInvalidKey", err)
	}
	if got := b.Idem(t, idem.WithLedger(l), idem.WithMaxKeyLen(50)).MaxKeyLen(); got != 50 {
		t.Fatalf("MaxKeyLen %d; want 50, below the ledger's", got)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "above the ledger's limit of 100") {
			t.Fatalf("New with WithMaxKeyLen(200) and a ledger of 100: %v; want a panic naming the limit", r)
		}
	}()
	idem.New(b.Client(t), idem.WithLedger(l), idem.WithMaxKeyLen(200))
}

type limitedLedger struct {
	*memLedger
	max int
}

func (l *limitedLedger) MaxKeyLen() int { return l.max }
