package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// LedgerDecided tells fn's caller (a door) whose outcome Do returns: none
// decided before a commit; this attempt's own after its commit won; the
// ledger's after a commit that met the row (Redis lost the record); and
// nothing outside fn.
func TestLedgerDecided(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		if d, m := idem.LedgerDecided(ctx); d || m {
			t.Fatalf("outside fn: decided %v, mine %v; want false, false", d, m)
		}
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l))
		type seen struct{ before, after [2]bool }
		run := func(fp, v string) (seen, []byte, error) {
			var s seen
			got, err := c.Do(ctx, "k", fp, func(ctx context.Context) ([]byte, error) {
				s.before[0], s.before[1] = idem.LedgerDecided(ctx)
				cerr := commit(ctx, l, []byte(v))
				s.after[0], s.after[1] = idem.LedgerDecided(ctx)
				return []byte(v), cerr
			})
			return s, got, err
		}
		s, got, err := run("fp", "first")
		if err != nil || string(got) != "first" {
			t.Fatalf("first call: %q, %v", got, err)
		}
		if s.before != [2]bool{} || s.after != [2]bool{true, true} {
			t.Fatalf("first call: before %v, after %v; want [false false], [true true]", s.before, s.after)
		}
		b.Do(t, "FLUSHALL")
		s, got, err = run("fp", "second")
		if err != nil || string(got) != "first" {
			t.Fatalf("after FLUSHALL: %q, %v; want the recorded first", got, err)
		}
		if s.after != [2]bool{true, false} {
			t.Fatalf("after FLUSHALL: decided, mine %v; want [true false] (the ledger's outcome)", s.after)
		}
		b.Do(t, "FLUSHALL")
		s, _, err = run("other", "third")
		if !errors.Is(err, idem.ErrConflict) || s.after != [2]bool{true, false} {
			t.Fatalf("other parameters: %v, decided, mine %v; want ErrConflict, [true false]", err, s.after)
		}

		// A Client without a ledger: never decided.
		plain := b.Idem(t)
		var d, m bool
		if _, err := plain.Do(ctx, "p", "", func(ctx context.Context) ([]byte, error) {
			d, m = idem.LedgerDecided(ctx)
			return nil, nil
		}); err != nil || d || m {
			t.Fatalf("no ledger: %v, decided %v, mine %v; want nil, false, false", err, d, m)
		}
	})
}
