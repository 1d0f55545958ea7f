package idem_test

// Attacks on the ledger, steps and tombstones together, with hostile keys:
// a transient error between steps, Redis losing everything, a retry after
// the retention, Forget; through all of it the business change is applied
// once and every success returns the same outcome.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

func TestCombinationAttackLedgerStepsTombstones(t *testing.T) {
	t.Parallel()
	keys := []string{"{a}", `a\}b{`, "\x00\xff{}\\c", strings.Repeat("}", 512)}
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		const retention, lease, keep = 2 * time.Second, time.Second, 4 * time.Second
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l), idem.WithRetention(retention), idem.WithLease(lease),
			idem.WithTombstones(keep), idem.WithWait(0), idem.WithLogger(nil))
		for i, key := range keys {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				var runs stepRuns
				var fail atomic.Bool
				fail.Store(true)
				// reserve, then a transient failure (once), then charge and
				// the commit of the outcome with the business change.
				fn := func(ctx context.Context) ([]byte, error) {
					hold, err := idem.Step(ctx, "reserve", func(ctx context.Context) ([]byte, error) {
						runs.add(ctx, "reserve")
						a, _ := idem.AttemptFrom(ctx)
						return []byte(fmt.Sprint("hold#", a.Number)), nil
					})
					if err != nil {
						return nil, err
					}
					if fail.Swap(false) {
						return nil, errors.New("the provider timed out")
					}
					empty, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
						runs.add(ctx, "charge")
						return []byte{}, nil
					})
					if err != nil {
						return nil, err
					}
					if empty == nil {
						return nil, errors.New("an empty step result came back nil")
					}
					a, _ := idem.AttemptFrom(ctx)
					r := []byte(fmt.Sprintf("%s/%s/#%d", hold, idem.StepKey(ctx, "charge"), a.Number))
					return r, commit(ctx, l, r)
				}
				if _, err := c.Do(ctx, key, "fp", fn); err == nil {
					t.Fatal("attempt 1 succeeded; want its transient error")
				}
				want, err := c.Do(ctx, key, "fp", fn)
				if err != nil || !strings.HasPrefix(string(want), "hold#1/") || !strings.HasSuffix(string(want), "/#2") {
					t.Fatalf("attempt 2: %q, %v; want attempt 1's hold and attempt 2's commit", want, err)
				}
				if n := runs.count(key, "reserve"); n != 1 {
					t.Fatalf("reserve ran %d times; want 1", n)
				}
				check := func(what string, wantRuns bool) {
					t.Helper()
					before := runs.count(key, "charge")
					got, err := c.Do(ctx, key, "fp", fn)
					if err != nil || string(got) != string(want) {
						t.Fatalf("%s: %q, %v; want %q", what, got, err, want)
					}
					if ran := runs.count(key, "charge") != before; ran != wantRuns {
						t.Fatalf("%s: the steps ran: %v; want %v", what, ran, wantRuns)
					}
					if n := l.changes(key); n != 1 {
						t.Fatalf("%s: %d changes; want 1", what, n)
					}
				}
				check("replay", false)
				// Redis loses everything between the calls: the steps run
				// again (they are not in the transaction), the commit finds
				// the ledger's row and Do returns it.
				b.Do(t, "FLUSHALL")
				check("after FLUSHALL", true)
				check("replay after FLUSHALL", false)
				if _, err := c.Do(ctx, key, "other", fn); !errors.Is(err, idem.ErrConflict) {
					t.Fatalf("other parameters: %v; want ErrConflict", err)
				}
				// After the retention: the tombstone is hit, and the ledger,
				// which still holds the outcome, answers (one lookup); the
				// steps do not run. Other parameters: the tombstone's
				// conflict, no lookup.
				b.Advance(t, retention+200*time.Millisecond)
				lookups := l.lookups.Load()
				check("after the retention", false)
				if _, err := c.Do(ctx, key, "other", fn); !errors.Is(err, idem.ErrConflict) {
					t.Fatalf("after the retention, other parameters: %v; want ErrConflict", err)
				}
				if n := l.lookups.Load(); n != lookups+1 {
					t.Fatalf("%d lookups for a late retry; want 1", n-lookups)
				}
				// Forget lifts the tombstone: fn runs again, and its commit
				// finds the ledger's row.
				if err := c.Forget(ctx, key); err != nil {
					t.Fatal(err)
				}
				check("after Forget", true)
			})
		}
	})
}

// The same on a Redis Cluster with WithReplicas, keys over many slots:
// fns that outlast their lease (renewals of the record and its
// checkpoints, in one slot), a transient error between steps, the resume,
// the commit, and a late retry that hits the tombstone in the key's slot
// and gets the outcome the ledger still holds.
func TestCombinationAttackCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of six redis-server processes: skipped in -short")
	}
	cl := redistest.StartCluster(t, 3, 1)
	const retention, lease = 2 * time.Second, time.Second
	l := newMemLedger()
	c := idem.New(cl.Client(t), idem.WithReplicas(1, 2*time.Second), idem.WithLedger(l),
		idem.WithRetention(retention), idem.WithLease(lease), idem.WithTombstones(time.Minute), idem.WithWait(0))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	keys := []string{"{", "}", "a{b}c", "\\"}
	for i := range 12 {
		keys = append(keys, fmt.Sprint("debit-", i))
	}
	var runs stepRuns
	fn := func(ctx context.Context) ([]byte, error) {
		a, _ := idem.AttemptFrom(ctx)
		hold, err := idem.Step(ctx, "reserve", func(ctx context.Context) (string, error) {
			runs.add(ctx, "reserve")
			return fmt.Sprint("hold#", a.Number), nil
		})
		if err != nil {
			return nil, err
		}
		if a.Number == 1 {
			// Longer than the retention: the record and the
			// checkpoints are renewed meanwhile.
			time.Sleep(retention + lease/2)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return nil, errors.New("the provider timed out")
		}
		r := []byte(hold + fmt.Sprint("/#", a.Number))
		return r, commit(ctx, l, r)
	}
	errs := make(chan error, len(keys))
	for _, k := range keys {
		go func() {
			if _, err := c.Do(ctx, k, "fp", fn); err == nil || err.Error() != "the provider timed out" {
				errs <- fmt.Errorf("key %q: attempt 1: %v; want its transient error", k, err)
				return
			}
			if got, err := c.Do(ctx, k, "fp", fn); err != nil || string(got) != "hold#1/#2" {
				errs <- fmt.Errorf("key %q: attempt 2: %q, %v", k, got, err)
				return
			}
			errs <- nil
		}()
	}
	for range keys {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(retention + 200*time.Millisecond)
	for _, k := range keys {
		if n := runs.count(k, "reserve"); n != 1 || l.changes(k) != 1 {
			t.Fatalf("key %q: reserve ran %d times, %d changes; want 1 and 1", k, n, l.changes(k))
		}
		// The tombstone is hit; the ledger still holds the outcome.
		if got, err := c.Do(ctx, k, "fp", fn); err != nil || string(got) != "hold#1/#2" || runs.count(k, "reserve") != 1 {
			t.Fatalf("key %q: after the retention: %q, %v; want the ledger's hold#1/#2, fn not run", k, got, err)
		}
	}
}
