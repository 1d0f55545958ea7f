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
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
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
	p, err := idem.PendingFrom(ctx)
	if err != nil {
		return err
	}
	e, err := p.Entry(v)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.entries[strings.ToLower(e.Key)]; ok {
		return p.Found(old)
	}
	l.entries[strings.ToLower(e.Key)] = e
	l.applied[e.Key]++
	p.Committed(e, v)
	return nil
}

// A Ledger that answers a lookup with the row of another key: Do must not
// return that key's outcome as this one's, nor finish this key's record
// with it. It fails closed, with fn not run.
func TestLedgerAttackLookupOfAnotherKey(t *testing.T) {
	b := newMiniredis(t)
	ctx := context.Background()
	l := foldedLedger{newMemLedger()}
	c := b.idem(t, idem.WithLedger(l), idem.WithLedgerLookups(true))
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
	if st := faultStatus(t, b, "order-1"); st.State == idem.StateDone {
		t.Fatal("order-1's record was finished with the outcome of Order-1")
	}
}

// The same Ledger met at the commit: the INSERT of "order-1" finds the row
// of "Order-1" under its unique key. That row is not this call's outcome:
// the commit fails (nothing applied), and Do says why instead of returning
// the other key's outcome.
func TestLedgerAttackFoundOfAnotherKey(t *testing.T) {
	b := newMiniredis(t)
	ctx := context.Background()
	l := foldedLedger{newMemLedger()}
	c := b.idem(t, idem.WithLedger(l))
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
	if st := faultStatus(t, b, "order-1"); st.State == idem.StateDone {
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

// A Ledger that answers with a fingerprint that is no digest idem made
// (a hex string, a column padded to 300 bytes): a clear error, fn not run,
// and no record in Redis that later calls could not read.
func TestLedgerAttackMalformedFingerprint(t *testing.T) {
	for _, fp := range []string{strings.Repeat("ab", 16), strings.Repeat("x", 300), "x"} {
		t.Run(fmt.Sprint(len(fp)), func(t *testing.T) {
			b := newMiniredis(t)
			ctx := context.Background()
			l := scriptedLedger{func(key string) (idem.Entry, bool, error) {
				return idem.Entry{Key: key, Fingerprint: fp, Attempt: 1, Value: []byte("v")}, true, nil
			}}
			c := b.idem(t, idem.WithLedger(l), idem.WithLedgerLookups(true))
			for _, callFP := range []string{"", "fp"} {
				key := "k" + callFP
				_, err := c.Do(ctx, key, callFP, func(ctx context.Context) ([]byte, error) {
					t.Error("fn ran")
					return nil, nil
				})
				if !errors.Is(err, idem.ErrCorrupt) {
					t.Fatalf("fingerprint %q: %v; want ErrCorrupt", callFP, err)
				}
				st, err := b.idem(t).Status(ctx, key)
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
	b := newRedis(t, redistest.Config{})
	const lease = time.Second
	ctx := context.Background()
	in := faultconn.New(faultconn.Rule{Match: faultConnScript(t, "renew"), Action: faultconn.CloseBefore})
	l := newMemLedger()
	slow := scriptedLedger{func(key string) (idem.Entry, bool, error) {
		time.Sleep(2 * lease)
		return l.Lookup(ctx, key)
	}}
	c := faultyClient(t, b, in, noRetry, idem.WithLease(lease), idem.WithLedger(slow),
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
