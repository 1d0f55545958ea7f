package idemsql_test

// Commit with a pool of one connection (SQLite's advice), a transaction
// on a *sql.Conn, a process that did not run Migrate itself, and keys the
// database cannot index: Commit never waits for a second connection, and a
// key too long is refused before fn runs.

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
)

// watchdog fails the test if f has not returned within d: a stall fails
// in seconds, not at the test binary's timeout.
func watchdog(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: still waiting after %v (a second connection from a pool of one?)", what, d)
	}
}

// Another process ran Migrate; this one did not, and its pool has one
// connection, which fn's transaction holds. Commit fails at once, naming
// the fix, instead of waiting for a connection that never comes free.
func TestCommitWithoutLocalMigrateAndOneConnection(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		b.db.SetMaxOpenConns(1)
		b.ledger = idemsql.New(b.db, b.dialect) // migrated by newBank's ledger, not by this one
		c := b.client(t)
		var (
			err       error
			commitErr error
		)
		watchdog(t, 20*time.Second, "Do", func() {
			_, err = idem.Do(ctx, c, "op", fingerprint("op", 10), func(ctx context.Context) (Receipt, error) {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return Receipt{}, err
				}
				defer tx.Rollback()
				r, err := b.change(ctx, tx, "op", 10, "debit")
				if err != nil {
					return Receipt{}, err
				}
				commitErr = idemsql.Commit(ctx, tx, r)
				return r, commitErr
			})
		})
		if commitErr == nil || !strings.Contains(commitErr.Error(), "call Migrate") {
			t.Fatalf("Commit: %v; want an error naming Migrate", commitErr)
		}
		if err == nil {
			t.Fatal("Do succeeded with nothing committed")
		}
		if n := b.movements(t, "op"); n != 0 {
			t.Fatalf("%d movements; want none (rolled back)", n)
		}
		// Once this process migrates, the same call commits.
		if err := b.ledger.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		watchdog(t, 20*time.Second, "Do after Migrate", func() {
			_, err = idem.Do(ctx, c, "op", fingerprint("op", 10), b.debit("op", 10))
		})
		if err != nil || b.movements(t, "op") != 1 {
			t.Fatalf("after Migrate: %v, %d movements; want one", err, b.movements(t, "op"))
		}
	})
}

// fn's transaction is opened on a *sql.Conn that fn holds, in a pool of
// one: a commit that meets the key's row returns the recorded outcome at
// once (read through the transaction), without a second connection.
func TestCommitConflictOnAConnOfAPoolOfOne(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		b.db.SetMaxOpenConns(1)
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
				conn, err := b.db.Conn(ctx)
				if err != nil {
					return Receipt{}, err
				}
				defer conn.Close()
				tx, err := conn.BeginTx(ctx, nil)
				if err != nil {
					return Receipt{}, err
				}
				defer tx.Rollback()
				r, err := b.change(ctx, tx, "op", 10, "debit")
				if err != nil {
					return Receipt{}, err
				}
				commitErr = idemsql.Commit(ctx, tx, r)
				return r, commitErr
			})
		})
		if !errors.Is(commitErr, idem.ErrRecorded) {
			t.Fatalf("Commit: %v; want ErrRecorded", commitErr)
		}
		if err != nil || got != first {
			t.Fatalf("Do: %v, %v; want the recorded %v", got, err, first)
		}
		if n := b.movements(t, "op"); n != 1 {
			t.Fatalf("%d movements; want 1", n)
		}
	})
}

// A key longer than PostgreSQL's B-tree can index is refused before fn
// runs, not retried for ever; the longest key the ledger allows, random
// (incompressible) bytes, is recorded.
func TestKeyLimitOfTheLedger(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		max := b.ledger.MaxKeyLen()
		if b.name == "postgres" && max == 0 {
			t.Fatal("PostgreSQL's ledger sets no key limit")
		}
		if max == 0 {
			max = 1 << 16 // the Client's own largest
		}
		c := b.client(t, idem.WithMaxKeyLen(max))
		long := make([]byte, max)
		_, _ = rand.Read(long)
		if _, err := idem.Do(ctx, c, string(long), fingerprint("long", 1), b.debit("long", 1)); err != nil {
			t.Fatalf("a key of %d random bytes: %v", max, err)
		}
		if got := b.entry(t, string(long)); got.Key != string(long) {
			t.Fatal("the longest key's row is not its own")
		}
		tooLong := strings.Repeat("k", max+1)
		_, err := idem.Do(ctx, c, tooLong, "", func(context.Context) (Receipt, error) {
			t.Error("fn ran for a key the ledger cannot record")
			return Receipt{}, nil
		})
		if !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("a key of %d bytes: %v; want ErrInvalidKey", max+1, err)
		}
	})
}
