package idempgx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/jackc/pgx/v5"
)

// With a pool of one connection, held by fn's transaction, a commit that
// meets the key's row returns the recorded outcome at once, read on the
// transaction's own connection: from a pool's Tx, and from a connection
// that fn acquired and holds (pgx.Conn.Begin).
func TestConflictOnAPoolOfOne(t *testing.T) {
	for _, acquired := range []bool{false, true} {
		name := map[bool]string{false: "pool.Begin", true: "conn.Begin"}[acquired]
		t.Run(name, func(t *testing.T) {
			b := newBank(t, 1)
			ctx := context.Background()
			c := b.client(t)
			fp := fingerprint("op", 10)
			first, err := idem.Do(ctx, c, "op", fp, b.debit("op", 10))
			if err != nil {
				t.Fatal(err)
			}
			b.flush(t) // Redis lost the record: the next call runs fn and meets the row
			var (
				got       Receipt
				commitErr error
			)
			watchdog(t, 20*time.Second, "Do", func() {
				got, err = idem.Do(ctx, c, "op", fp, func(ctx context.Context) (Receipt, error) {
					var tx pgx.Tx
					if acquired {
						conn, err := b.pool.Acquire(ctx)
						if err != nil {
							return Receipt{}, err
						}
						defer conn.Release()
						if tx, err = conn.Begin(ctx); err != nil {
							return Receipt{}, err
						}
					} else if tx, err = b.pool.Begin(ctx); err != nil {
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
			})
			if !errors.Is(commitErr, idem.ErrRecorded) {
				t.Fatalf("Commit: %v; want ErrRecorded", commitErr)
			}
			if err != nil || got != first {
				t.Fatalf("Do: %+v, %v; want the recorded %+v", got, err, first)
			}
			if n := b.movements(t, "op"); n != 1 {
				t.Fatalf("%d movements; want 1", n)
			}
			if st := b.pool.Stat(); st.TotalConns() != 1 || st.IdleConns() != 1 {
				t.Fatalf("pool: %d connections, %d idle; want its one, back and idle", st.TotalConns(), st.IdleConns())
			}
		})
	}
}

// A ledger that did not Migrate in this process (another one did) commits
// with a pool of one connection held by fn's transaction: it reads the
// database's id through the transaction, which is of the pool's database.
func TestCommitWithoutLocalMigrateOnAPoolOfOne(t *testing.T) {
	b := newBank(t, 1)
	ctx := context.Background()
	b.ledger = idempgx.New(b.pool) // migrated by newBank's ledger, not by this one
	c := b.client(t)
	var err error
	watchdog(t, 20*time.Second, "Do", func() {
		_, err = idem.Do(ctx, c, "op", fingerprint("op", 10), b.debit("op", 10))
	})
	if err != nil || b.movements(t, "op") != 1 {
		t.Fatalf("Do: %v, %d movements; want one", err, b.movements(t, "op"))
	}
}

// The ledger adds no PostgreSQL round trip to the transaction: a debit
// recorded by Commit writes to the database as often as the bare debit
// that ends with tx.Commit, and a replay from Redis not at all.
func TestCommitAddsNoRoundTrip(t *testing.T) {
	b := newBank(t, 1)
	ctx := context.Background()
	c := b.client(t)
	bare := func(op string) error {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := change(ctx, tx, op, 1, "debit"); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	// Warm pgx's statement cache, on the pool's one connection.
	if err := bare("warm"); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, c, "warm", "", b.debit("warm", 1)); err != nil {
		t.Fatal(err)
	}
	before := b.writes.Load()
	if err := bare("bare"); err != nil {
		t.Fatal(err)
	}
	bareTrips := b.writes.Load() - before
	before = b.writes.Load()
	if _, err := idem.Do(ctx, c, "op", "", b.debit("op", 1)); err != nil {
		t.Fatal(err)
	}
	idemTrips := b.writes.Load() - before
	if bareTrips != 4 || idemTrips != bareTrips {
		t.Fatalf("round trips: bare %d, with the ledger %d; want 4 and 4 (BEGIN, UPDATE, INSERT, COMMIT)", bareTrips, idemTrips)
	}
	before = b.writes.Load()
	if _, err := idem.Do(ctx, c, "op", "", b.debit("op", 1)); err != nil {
		t.Fatal(err)
	}
	if n := b.writes.Load() - before; n != 0 {
		t.Fatalf("a replay made %d round trips to PostgreSQL; want none", n)
	}
}
