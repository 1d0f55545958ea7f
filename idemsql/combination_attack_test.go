package idemsql_test

// Attacks on the ledger in a real database together with steps and
// tombstones, with hostile keys: an attempt that outlives the retention
// after its step and fails, the resume, Redis losing everything, a retry
// after the retention, Forget. Through all of it each debit is applied
// once and every success returns one receipt.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
)

func TestCombinationAttackStepsTombstones(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		const retention, lease = 2 * time.Second, time.Second
		c := b.client(t, idem.WithRetention(retention), idem.WithLease(lease), idem.WithTombstones(time.Minute), idem.WithWait(0))
		keys := []string{"op\x00{x}\\\xff", "}{"}
		for i, key := range keys {
			op := fmt.Sprint("op-", i) // the business's name of the debit; key is its idempotency key
			amount := int64(10 + i)
			var reserves, fails atomic.Int64
			fn := func(ctx context.Context) (Receipt, error) {
				a, _ := idem.AttemptFrom(ctx)
				hold, err := idem.Step(ctx, "reserve", func(ctx context.Context) (string, error) {
					reserves.Add(1)
					return fmt.Sprint("hold#", a.Number), nil
				})
				if err != nil {
					return Receipt{}, err
				}
				if fails.Add(1) == 1 {
					// Longer than the retention after the step, renewed;
					// then a transient failure.
					time.Sleep(retention + lease/2)
					return Receipt{}, errors.New("the provider timed out")
				}
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return Receipt{}, err
				}
				defer tx.Rollback()
				r, err := b.change(ctx, tx, op, amount, hold)
				if err != nil {
					return Receipt{}, err
				}
				return r, idemsql.Commit(ctx, tx, r)
			}
			fp := fingerprint(op, amount)
			if _, err := idem.Do(ctx, c, key, fp, fn); err == nil {
				t.Fatalf("key %q: attempt 1 succeeded", key)
			}
			want, err := idem.Do(ctx, c, key, fp, fn)
			if err != nil || want.Attempt != 2 {
				t.Fatalf("key %q: attempt 2: %v, %v", key, want, err)
			}
			check := func(what string) {
				t.Helper()
				got, err := idem.Do(ctx, c, key, fp, fn)
				if err != nil || got != want {
					t.Fatalf("key %q: %s: %v, %v; want %v", key, what, got, err, want)
				}
				if n := b.movements(t, op); n != 1 {
					t.Fatalf("key %q: %s: %d movements; want 1", key, what, n)
				}
			}
			check("replay")
			if n := reserves.Load(); n != 1 {
				t.Fatalf("key %q: the checkpointed step ran %d times while its record lived", key, n)
			}
			var kind string
			if err := b.db.QueryRow(b.q("SELECT kind FROM movements WHERE op = ?"), op).Scan(&kind); err != nil || kind != "hold#1" {
				t.Fatalf("key %q: the movement's hold %q, %v; want attempt 1's checkpoint", key, kind, err)
			}
			b.flush(t)
			check("after FLUSHALL")
			if _, err := idem.Do(ctx, c, key, fingerprint(op, amount+1), fn); !errors.Is(err, idem.ErrConflict) {
				t.Fatalf("key %q: other parameters: %v; want ErrConflict", key, err)
			}
			time.Sleep(retention + 200*time.Millisecond)
			// The tombstone is hit, and the ledger, which still holds the
			// outcome, answers.
			check("after the retention")
			if err := c.Forget(ctx, key); err != nil {
				t.Fatal(err)
			}
			check("after Forget")
		}
		if n, want := b.balance(t), opening-10-11; n != want {
			t.Fatalf("balance %d; want %d", n, want)
		}
		if n := b.rows(t); n != len(keys) {
			t.Fatalf("%d ledger rows; want %d", n, len(keys))
		}
	})
}
