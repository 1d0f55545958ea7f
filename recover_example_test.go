package idem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// A registered operation whose caller gave up after a transient failure is
// finished by a Recover loop, from its stored input, as the next attempt;
// the caller's later Result gets the outcome.
func ExampleClient_Recover() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb, idem.WithRecoverAfter(20*time.Millisecond))
	defer keys.Close()

	type debit struct {
		Account string
		Cents   int64
	}
	providerUp := false
	op := idem.Register(keys, "debit", func(ctx context.Context, in debit) (string, error) {
		a, _ := idem.AttemptFrom(ctx)
		fmt.Printf("debiting %d from %s (attempt %d)\n", in.Cents, in.Account, a.Number)
		if !providerUp {
			return "", errors.New("provider unavailable")
		}
		return "receipt-1", nil
	})
	ctx := context.Background()
	_, err := op.Do(ctx, "payment-7", debit{Account: "acct-A", Cents: 100})
	fmt.Println(err) // the caller gives up here
	providerUp = true

	rctx, stop := context.WithCancel(ctx)
	recovered := make(chan error)
	go func() { recovered <- keys.Recover(rctx) }() // in every process, for its life
	for {
		if st, _ := keys.Status(ctx, "payment-7"); st.State == idem.StateDone {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	fmt.Println(<-recovered)
	res, st, err := op.Result(ctx, "payment-7")
	fmt.Println(res, st.State, st.Attempt, err)
	// Output:
	// debiting 100 from acct-A (attempt 1)
	// provider unavailable
	// debiting 100 from acct-A (attempt 2)
	// context canceled
	// receipt-1 done 2 <nil>
}
