package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// Receipt is what a debit returns; idem stores it with msgpack.
type Receipt struct {
	ID     string
	Amount int64
}

// A retried debit runs once; its receipt is replayed to every retry, and a
// reuse of the key for another amount is refused.
func ExampleDo() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	ctx := context.Background()
	debit := func(amount int64) func(context.Context) (Receipt, error) {
		return func(ctx context.Context) (Receipt, error) {
			a, _ := idem.AttemptFrom(ctx)
			fmt.Printf("debiting %d (key %s, attempt %d)\n", amount, a.Key, a.Number)
			return Receipt{ID: "r-1", Amount: amount}, nil
		}
	}
	for range 2 { // the client timed out and retried
		r, err := idem.Do(ctx, keys, "payment-42", idem.Fingerprint("acct-A", 100), debit(100))
		fmt.Println(r, err)
	}
	_, err := idem.Do(ctx, keys, "payment-42", idem.Fingerprint("acct-A", 999), debit(999))
	fmt.Println(errors.Is(err, idem.ErrConflict))
	// Output:
	// debiting 100 (key payment-42, attempt 1)
	// {r-1 100} <nil>
	// {r-1 100} <nil>
	// true
}

// A transient error releases the key: the retry runs fn again, as attempt 2.
// A permanent error is stored and replayed.
func ExamplePermanent() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	ctx := context.Background()
	charge := func(ctx context.Context) ([]byte, error) {
		a, _ := idem.AttemptFrom(ctx)
		if a.Number == 1 {
			return nil, errors.New("bank timed out") // transient
		}
		return nil, idem.Permanent(errors.New("card declined"))
	}
	for range 3 {
		_, err := keys.Do(ctx, "payment-7", "", charge)
		fmt.Printf("%v (permanent: %v)\n", err, idem.IsPermanent(err))
	}
	st, _ := keys.Status(ctx, "payment-7")
	fmt.Println(st.State, "after", st.Attempt, "attempts")
	// Output:
	// bank timed out (permanent: false)
	// card declined (permanent: true)
	// card declined (permanent: true)
	// failed after 2 attempts
}
