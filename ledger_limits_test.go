package idem_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// WithMaxResultSize is the largest result stored, in bytes: through the
// ledger as through Redis alone, a result of exactly that size is
// committed, recorded and replayed; one byte more is ErrTooLarge, and
// nothing is committed.
func TestLedgerCommitAtTheResultLimit(t *testing.T) {
	t.Parallel()
	const limit = 64
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l), idem.WithMaxResultSize(limit), idem.WithLogger(nil))
		full := bytes.Repeat([]byte{'r'}, limit)
		var runs int
		fn := func(v []byte) func(context.Context) ([]byte, error) {
			return func(ctx context.Context) ([]byte, error) {
				runs++
				return v, commit(ctx, l, v)
			}
		}
		got, err := c.Do(ctx, "full", "fp", fn(full))
		if err != nil || !bytes.Equal(got, full) {
			t.Fatalf("a result of exactly WithMaxResultSize (%d bytes): %d bytes, %v; want it committed", limit, len(got), err)
		}
		if l.changes("full") != 1 {
			t.Fatalf("the ledger applied %d changes for it, want 1", l.changes("full"))
		}
		if got, err := c.Do(ctx, "full", "fp", fn(nil)); err != nil || !bytes.Equal(got, full) || runs != 1 {
			t.Fatalf("replay: %d bytes, %v, fn ran %d times", len(got), err, runs)
		}
		idemtest.WantStatus(t, b, "full", idem.StateDone, 1)

		over := append(bytes.Clone(full), 'x')
		if _, err := c.Do(ctx, "over", "fp", fn(over)); !errors.Is(err, idem.ErrTooLarge) {
			t.Fatalf("a result one byte over WithMaxResultSize: %v; want ErrTooLarge", err)
		}
		if l.changes("over") != 0 {
			t.Fatalf("the ledger applied %d changes for a result too large, want 0", l.changes("over"))
		}

		// The same limit without a commit: Redis stores exactly the limit.
		if got, err := c.Do(ctx, "plain", "fp", func(context.Context) ([]byte, error) { return full, nil }); err != nil || !bytes.Equal(got, full) {
			t.Fatalf("a plain result of exactly WithMaxResultSize: %d bytes, %v", len(got), err)
		}
	})
}
