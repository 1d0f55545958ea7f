package idem_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

type chargeIn struct {
	Account string
	Cents   int64
}

// An Op stores its input beside the claim while it runs, in the claim's
// round trip, and the stored outcome deletes it; with tombstones too.
func TestOpStoresInputWhileUnfinished(t *testing.T) {
	t.Parallel()
	for _, opts := range [][]idem.Option{nil, {idem.WithTombstones(time.Hour)}} {
		idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
			ctx := context.Background()
			c := b.Idem(t, append([]idem.Option{idem.WithLease(time.Minute), idem.WithLogger(nil)}, opts...)...)
			rdb := b.Client(t)
			inKey := idem.RecordKey(c, "k") + ":in"
			ran := 0
			var seen string
			op := idem.Register(c, "charge", func(ctx context.Context, in chargeIn) (string, error) {
				ran++
				v, err := rdb.Get(ctx, inKey).Result()
				if err != nil {
					return "", err
				}
				seen = v
				return "receipt:" + in.Account, nil
			})
			in := chargeIn{Account: "acct", Cents: 500}
			got, err := op.Do(ctx, "k", in)
			if err != nil || got != "receipt:acct" {
				t.Fatalf("Do: %q, %v", got, err)
			}
			if !strings.Contains(seen, "acct") {
				t.Fatalf("stored input while running: %q", seen)
			}
			if n := rdb.Exists(ctx, inKey).Val(); n != 0 {
				t.Fatalf("input left after the outcome: %d", n)
			}
			got, err = op.Do(ctx, "k", in)
			if err != nil || got != "receipt:acct" || ran != 1 {
				t.Fatalf("replay: %q, %v, ran %d", got, err, ran)
			}
			res, st, err := op.Result(ctx, "k")
			if err != nil || res != "receipt:acct" || st.State != idem.StateDone {
				t.Fatalf("Result: %q, %+v, %v", res, st, err)
			}
			if _, err := op.Do(ctx, "k", chargeIn{Account: "other"}); !errors.Is(err, idem.ErrConflict) {
				t.Fatalf("other input: %v", err)
			}
		})
	}
}

// A transient failure keeps the input (the operation is unfinished);
// Forget deletes it. A plain Do stores none.
func TestOpInputKeptOnRelease(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c := b.Idem(t, idem.WithLease(time.Minute), idem.WithLogger(nil))
		rdb := b.Client(t)
		op := idem.Register(c, "fail", func(ctx context.Context, in int) (int, error) {
			return 0, errors.New("transient")
		})
		if _, err := op.Do(ctx, "k", 7); err == nil {
			t.Fatal("want the transient error")
		}
		inKey := idem.RecordKey(c, "k") + ":in"
		if n := rdb.Exists(ctx, inKey).Val(); n != 1 {
			t.Fatalf("input after release: %d keys", n)
		}
		if err := c.Forget(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if n := rdb.Exists(ctx, inKey).Val(); n != 0 {
			t.Fatalf("input after Forget: %d keys", n)
		}
		if _, err := c.Do(ctx, "p", "fp", func(ctx context.Context) ([]byte, error) {
			if n := rdb.Exists(ctx, idem.RecordKey(c, "p")+":in").Val(); n != 0 {
				t.Errorf("plain Do stored an input")
			}
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}

// Register refuses a name twice on one Client, naming it; an input over
// MaxInputSize is refused before fn runs.
func TestRegisterTwicePanicsAndInputLimit(t *testing.T) {
	t.Parallel()
	c := idemtest.Miniredis(t).Idem(t, idem.WithLogger(nil))
	ran := false
	op := idem.Register(c, "big", func(ctx context.Context, in []byte) (int, error) { ran = true; return 1, nil })
	func() {
		defer func() {
			r := recover()
			if s, _ := r.(string); !strings.Contains(s, `"big"`) {
				t.Fatalf("second Register: recovered %v", r)
			}
		}()
		idem.Register(c, "big", func(ctx context.Context, in []byte) (int, error) { return 0, nil })
	}()
	_, err := op.Do(context.Background(), "k", make([]byte, idem.MaxInputSize+1))
	if !errors.Is(err, idem.ErrInputTooLarge) || ran {
		t.Fatalf("large input: %v, ran %v", err, ran)
	}
	if _, err := op.Do(context.Background(), "k2", make([]byte, 100)); err != nil || !ran {
		t.Fatalf("small input: %v, ran %v", err, ran)
	}
}

// MaxInputSize is the largest encoded input stored: an input that encodes
// to exactly MaxInputSize bytes is stored and runs; one byte more is
// ErrInputTooLarge, and fn does not run.
func TestOpInputAtTheLimit(t *testing.T) {
	t.Parallel()
	c := idemtest.Miniredis(t).Idem(t, idem.WithLogger(nil))
	ran := 0
	op := idem.Register(c, "edge", func(ctx context.Context, in []byte) (int, error) { ran++; return len(in), nil })
	// msgpack's bin 16: 3 bytes of header, then the bytes.
	exact := make([]byte, idem.MaxInputSize-3)
	if n, err := op.Do(context.Background(), "exact", exact); err != nil || n != len(exact) || ran != 1 {
		t.Fatalf("an input of exactly MaxInputSize encoded bytes: %d, %v, ran %d; want it run", n, err, ran)
	}
	if _, err := op.Do(context.Background(), "over", make([]byte, idem.MaxInputSize-2)); !errors.Is(err, idem.ErrInputTooLarge) || ran != 1 {
		t.Fatalf("an input one byte over: %v, ran %d; want ErrInputTooLarge, fn not run", err, ran)
	}
}
