package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// A charge through a gateway with no idempotency key: the first answer is
// lost (a timeout after the request went out), so act says Ambiguous, and
// StepChecked asks the gateway by the step's key instead of charging
// again. The charge it finds is the step's result.
func ExampleStepChecked() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	charges := map[string]string{} // the gateway's: reference -> charge id
	charge := func(ctx context.Context) (string, error) {
		return idem.StepChecked(ctx, "charge",
			func(ctx context.Context) (string, error) {
				id := fmt.Sprint("ch_", len(charges)+1)
				charges[idem.StepKey(ctx, "charge")] = id
				fmt.Println("charged", id)
				return "", idem.Ambiguous(errors.New("gateway: read timeout"))
			},
			func(ctx context.Context) (string, idem.Check, error) {
				if id, ok := charges[idem.StepKey(ctx, "charge")]; ok {
					return id, idem.CheckApplied, nil
				}
				return "", idem.CheckNotApplied, nil
			})
	}
	for range 2 {
		id, err := idem.Do(context.Background(), keys, "order-42", "", charge)
		fmt.Println(id, err)
	}
	fmt.Println("charges:", len(charges))
	// Output:
	// charged ch_1
	// ch_1 <nil>
	// ch_1 <nil>
	// charges: 1
}
