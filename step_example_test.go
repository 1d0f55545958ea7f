package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// A debit in three steps: reserve the funds, charge the card through a
// provider with the step's key, notify the customer. The first attempt
// fails at the notification; the retry resumes there: the funds are not
// reserved twice, the card is not charged twice.
func ExampleStep() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	mailUp := false
	debit := func(ctx context.Context) (Receipt, error) {
		hold, err := idem.Step(ctx, "reserve", func(ctx context.Context) (string, error) {
			fmt.Println("reserve 100 on account A")
			return "hold-7", nil
		})
		if err != nil {
			return Receipt{}, err
		}
		charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			// The provider keeps its own record of this key: a charge
			// repeated after a crash is answered, not made again.
			fmt.Println("charge 100, Idempotency-Key:", idem.StepKey(ctx, "charge"))
			return "ch-1", nil
		})
		if err != nil {
			return Receipt{}, err
		}
		_, err = idem.Step(ctx, "notify", func(ctx context.Context) (bool, error) {
			if !mailUp {
				return false, errors.New("mail server down") // transient
			}
			fmt.Println("mail account A")
			return true, nil
		})
		if err != nil {
			return Receipt{}, err
		}
		return Receipt{ID: hold + "/" + charge, Amount: 100}, nil
	}

	ctx := context.Background()
	_, err := idem.Do(ctx, keys, "debit-42", idem.Fingerprint("A", 100), debit)
	fmt.Println("first call:", err)
	mailUp = true
	r, err := idem.Do(ctx, keys, "debit-42", idem.Fingerprint("A", 100), debit)
	fmt.Println("retry:", r, err)
	// Output:
	// reserve 100 on account A
	// charge 100, Idempotency-Key: idem-52kp4vvwdpojhho5wa2gv2h3zdbr4pdl
	// first call: mail server down
	// mail account A
	// retry: {hold-7/ch-1 100} <nil>
}
