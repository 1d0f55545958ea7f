package idempgx_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/jackc/pgx/v5"
)

// Thirty concurrent calls with one key, on two Clients (two Redis records:
// two live owners, as when Redis lost one): one movement, one row, and
// every call gets the one receipt.
func TestConcurrentCallsOneKey(t *testing.T) {
	b := newBank(t, 0)
	ctx := context.Background()
	clients := []*idem.Client{b.client(t), b.client(t)}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		got   [30]Receipt
		errs  [30]error
	)
	for i := range got {
		wg.Go(func() {
			<-start
			got[i], errs[i] = idem.Do(ctx, clients[i%2], "op", fingerprint("op", 10), b.debit("op", 10))
		})
	}
	close(start)
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i] != got[0] {
			t.Fatalf("call %d: %+v, %v; want %+v, nil", i, got[i], errs[i], got[0])
		}
	}
	if n := b.movements(t, "op"); n != 1 {
		t.Fatalf("%d movements; want 1", n)
	}
	if got[0].Balance != opening-10 {
		t.Fatalf("balance %d; want %d", got[0].Balance, opening-10)
	}
	e, ok, err := b.ledger.Lookup(ctx, "op")
	if err != nil || !ok || e.Key != "op" || e.Failed || e.Age < 0 {
		t.Fatalf("Lookup: %+v, %v, %v", e, ok, err)
	}
}

// After Redis lost every record, a retry runs fn, whose commit meets the
// ledger's row: rolled back, the recorded receipt returned. Other
// parameters under the key are a conflict, also then.
func TestRedisLostTheRecord(t *testing.T) {
	b := newBank(t, 0)
	ctx := context.Background()
	c := b.client(t)
	first, err := idem.Do(ctx, c, "op", fingerprint("op", 10), b.debit("op", 10))
	if err != nil {
		t.Fatal(err)
	}
	b.flush(t)
	var commitErr error
	var runs atomic.Int64
	got, err := idem.Do(ctx, c, "op", fingerprint("op", 10), func(ctx context.Context) (Receipt, error) {
		runs.Add(1)
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return Receipt{}, err
		}
		defer tx.Rollback(ctx)
		r, err := change(ctx, tx, "op", 10, "debit")
		if err != nil {
			return Receipt{}, err
		}
		commitErr = idempgx.Commit(ctx, tx, r)
		return r, commitErr
	})
	if err != nil || got != first {
		t.Fatalf("after FLUSHALL: %+v, %v; want the recorded %+v", got, err, first)
	}
	if runs.Load() != 1 || !errors.Is(commitErr, idem.ErrRecorded) {
		t.Fatalf("fn ran %d times, Commit: %v; want once, ErrRecorded", runs.Load(), commitErr)
	}
	b.flush(t)
	if _, err := idem.Do(ctx, c, "op", fingerprint("op", 99), b.debit("op", 99)); !errors.Is(err, idem.ErrConflict) {
		t.Fatalf("other parameters after FLUSHALL: %v; want ErrConflict", err)
	}
	if n := b.movements(t, "op"); n != 1 {
		t.Fatalf("%d movements; want 1", n)
	}
}

// Client.Do records raw bytes, empty ones included, and replays them byte
// for byte from the ledger after FLUSHALL.
func TestRawBytes(t *testing.T) {
	b := newBank(t, 0)
	ctx := context.Background()
	c := b.client(t)
	for _, want := range [][]byte{{0, 1, 2, 0xff}, {}} {
		key := "raw" + string(rune('0'+len(want)))
		fn := func(ctx context.Context) ([]byte, error) {
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			defer tx.Rollback(ctx)
			if _, err := change(ctx, tx, key, 1, "debit"); err != nil {
				return nil, err
			}
			return []byte("not recorded"), idempgx.Commit(ctx, tx, want)
		}
		if _, err := c.Do(ctx, key, "", fn); err != nil {
			t.Fatal(err)
		}
		b.flush(t)
		got, err := c.Do(ctx, key, "", fn)
		if err != nil || string(got) != string(want) {
			t.Fatalf("%s: %q, %v; want %q", key, got, err, want)
		}
		if n := b.movements(t, key); n != 1 {
			t.Fatalf("%s: %d movements; want 1", key, n)
		}
	}
}

// CommitError keeps the failure's own changes (a declined debit's row) and
// records the failure: replays, also after FLUSHALL, get it as a
// *StoredError, and the change stays applied once.
func TestCommitError(t *testing.T) {
	b := newBank(t, 0)
	ctx := context.Background()
	c := b.client(t)
	declined := errors.New("card declined")
	decline := func(ctx context.Context) (Receipt, error) {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return Receipt{}, err
		}
		defer tx.Rollback(ctx)
		if _, err := change(ctx, tx, "op", 0, "declined"); err != nil {
			return Receipt{}, err
		}
		return Receipt{}, idempgx.CommitError(ctx, tx, idem.PermanentCode("declined", declined))
	}
	if _, err := idem.Do(ctx, c, "op", "", decline); !errors.Is(err, declined) {
		t.Fatalf("owner: %v; want the declined error", err)
	}
	for _, flush := range []bool{false, true} {
		if flush {
			b.flush(t)
		}
		_, err := idem.Do(ctx, c, "op", "", decline)
		var se *idem.StoredError
		if !errors.As(err, &se) || !strings.Contains(se.Error(), "card declined") {
			t.Fatalf("replay (flushed %v): %v; want the stored failure", flush, err)
		}
	}
	if n := b.movements(t, "op"); n != 1 {
		t.Fatalf("%d movements; want 1", n)
	}
	e, ok, err := b.ledger.Lookup(ctx, "op")
	if err != nil || !ok || !e.Failed {
		t.Fatalf("Lookup: %+v, %v, %v; want a failure", e, ok, err)
	}
}

// Commits that cannot record commit nothing and say why: a value of
// another type than Do[T]'s, a tx already done, a savepoint, a tx outside
// Do, a second Commit.
func TestCommitRefuses(t *testing.T) {
	b := newBank(t, 0)
	ctx := context.Background()
	c := b.client(t)
	cases := []struct {
		name string
		// commit makes the business change in tx and commits it as fn
		// would; ctx is fn's.
		commit func(ctx context.Context, tx pgx.Tx) error
		want   string
		is     error
	}{
		{"wrong type", func(ctx context.Context, tx pgx.Tx) error {
			return idempgx.Commit(ctx, tx, "a string, not a Receipt")
		}, "", idem.ErrEncode},
		{"tx committed", func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			_, _ = b.pool.Exec(ctx, "DELETE FROM movements WHERE op = 'tx committed'") // its change was the user's
			return idempgx.Commit(ctx, tx, Receipt{})
		}, "already committed or rolled back", pgx.ErrTxClosed},
		{"savepoint", func(ctx context.Context, tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			err = idempgx.Commit(ctx, sp, Receipt{})
			_ = tx.Commit(ctx) // the outer tx: its movement, made before the savepoint, is the user's
			_, _ = b.pool.Exec(ctx, "DELETE FROM movements WHERE op = 'savepoint'")
			return err
		}, "savepoint", nil},
		{"failed tx", func(ctx context.Context, tx pgx.Tx) error {
			_, _ = tx.Exec(ctx, "SELECT 1/0")
			return idempgx.Commit(ctx, tx, Receipt{})
		}, "had failed before Commit", nil},
		{"ctx done", func(ctx context.Context, tx pgx.Tx) error {
			done, cancel := context.WithCancel(ctx)
			cancel()
			return idempgx.Commit(done, tx, Receipt{})
		}, "not sent: nothing committed", context.Canceled},
		{"outside Do", func(_ context.Context, tx pgx.Tx) error {
			return idempgx.Commit(context.Background(), tx, Receipt{})
		}, "", idem.ErrNoLedger},
		{"twice", func(ctx context.Context, tx pgx.Tx) error {
			if err := idempgx.Commit(ctx, tx, Receipt{Op: "first"}); err != nil {
				return err
			}
			tx2, err := b.pool.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := change(ctx, tx2, "twice-2", 1, "debit"); err != nil {
				return err
			}
			return idempgx.Commit(ctx, tx2, Receipt{Op: "second"})
		}, "", idem.ErrNoLedger},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var commitErr error
			_, err := idem.Do(ctx, c, tc.name, "", func(ctx context.Context) (Receipt, error) {
				tx, err := b.pool.Begin(ctx)
				if err != nil {
					return Receipt{}, err
				}
				defer tx.Rollback(ctx)
				if _, err := change(ctx, tx, tc.name, 1, "debit"); err != nil {
					return Receipt{}, err
				}
				commitErr = tc.commit(ctx, tx)
				return Receipt{Op: "fn"}, commitErr
			})
			if commitErr == nil || (tc.is != nil && !errors.Is(commitErr, tc.is)) || !strings.Contains(commitErr.Error(), tc.want) {
				t.Fatalf("Commit: %v; want an error wrapping %v, saying %q", commitErr, tc.is, tc.want)
			}
			if tc.name == "twice" {
				if err != nil || b.movements(t, "twice") != 1 || b.movements(t, "twice-2") != 0 {
					t.Fatalf("Do: %v; movements %d, %d; want the first commit alone", err, b.movements(t, "twice"), b.movements(t, "twice-2"))
				}
				return
			}
			if err == nil {
				t.Fatal("Do succeeded with nothing committed")
			}
			if n := b.movements(t, tc.name); n != 0 {
				t.Fatalf("%d movements; want none", n)
			}
			if _, ok, _ := b.ledger.Lookup(ctx, tc.name); ok {
				t.Fatal("the ledger holds a row")
			}
		})
	}
}

// A tx of another database is refused, whether that database has a ledger
// of its own (another id in its _meta) or none: nothing commits there.
func TestCommitRefusesAnotherDatabase(t *testing.T) {
	b := newBank(t, 0)
	ctx := context.Background()
	c := b.client(t)
	withLedger := newBank(t, 0)
	bare := newBank(t, 0)
	if _, err := bare.pool.Exec(ctx, "DROP TABLE idem_ledger, idem_ledger_meta"); err != nil {
		t.Fatal(err)
	}
	for name, other := range map[string]*bank{"with a ledger": withLedger, "without": bare} {
		t.Run(name, func(t *testing.T) {
			var commitErr error
			_, err := idem.Do(ctx, c, name, "", func(ctx context.Context) (Receipt, error) {
				tx, err := other.pool.Begin(ctx)
				if err != nil {
					return Receipt{}, err
				}
				defer tx.Rollback(ctx)
				r, err := change(ctx, tx, name, 1, "debit")
				if err != nil {
					return Receipt{}, err
				}
				commitErr = idempgx.Commit(ctx, tx, r)
				return r, commitErr
			})
			if err == nil || commitErr == nil || !strings.Contains(commitErr.Error(), "database") {
				t.Fatalf("Do: %v, Commit: %v; want a refusal naming the database", err, commitErr)
			}
			if n := other.movements(t, name); n != 0 {
				t.Fatalf("%d movements in the other database; want none", n)
			}
		})
	}
}

// A key longer than the ledger indexes is refused before fn runs; the
// longest it allows, random (incompressible) bytes, is recorded.
func TestKeyLimit(t *testing.T) {
	b := newBank(t, 0)
	ctx := context.Background()
	c := b.client(t, idem.WithMaxKeyLen(b.ledger.MaxKeyLen()))
	if got := b.ledger.MaxKeyLen(); got != 2048 {
		t.Fatalf("MaxKeyLen %d; want 2048", got)
	}
	long := make([]byte, 2049)
	_, _ = rand.Read(long)
	_, err := idem.Do(ctx, c, string(long), "", func(context.Context) (Receipt, error) {
		t.Error("fn ran with a key over the limit")
		return Receipt{}, nil
	})
	if !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("2049-byte key: %v; want ErrInvalidKey", err)
	}
	key := string(long[:2048])
	if _, err := idem.Do(ctx, c, key, "", b.debit("long", 1)); err != nil {
		t.Fatalf("2048-byte key: %v", err)
	}
	if e, ok, err := b.ledger.Lookup(ctx, key); err != nil || !ok || e.Key != key {
		t.Fatalf("Lookup of the 2048-byte key: %v, %v", ok, err)
	}
}

// Prune deletes the rows older than its cutoff by the database's clock, in
// batches, and no younger ones.
func TestPrune(t *testing.T) {
	b := newBank(t, 0)
	ctx := context.Background()
	// 2,500 rows an hour old, 1 a minute old.
	if _, err := b.pool.Exec(ctx, `INSERT INTO idem_ledger
		SELECT int8send(i), '', 1, false, '', statement_timestamp() - interval '1 hour' FROM generate_series(1, 2500) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO idem_ledger VALUES ('young', '', 1, false, '', statement_timestamp() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Prune(ctx, time.Time{}); err == nil {
		t.Fatal("Prune(zero time) succeeded")
	}
	n, err := b.ledger.Prune(ctx, time.Now().Add(-30*time.Minute))
	if err != nil || n != 2500 {
		t.Fatalf("Prune: %d, %v; want 2500", n, err)
	}
	e, ok, err := b.ledger.Lookup(ctx, "young")
	if err != nil || !ok {
		t.Fatalf("the young row: %v, %v", ok, err)
	}
	if e.Age < 50*time.Second || e.Age > 10*time.Minute {
		t.Fatalf("the young row's Age %v; want about a minute (the database's clock)", e.Age)
	}
}
