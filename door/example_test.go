package door_test

import (
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
)

// A new door maps door's Reasons to its transport; AnswerOf reads Do's
// error once, for every door alike.
func ExampleAnswerOf() {
	for _, err := range []error{
		idem.ErrConflict,
		fmt.Errorf("idem: key %q: %w", "order-1", idem.ErrInProgress),
		errors.New("redis: connection refused"),
	} {
		a := door.AnswerOf(err, "Idempotency-Key")
		fmt.Printf("%s retry=%v: %s\n", a.Reason, a.Reason.Retryable(), a.Detail)
	}
	// Output:
	// KEY_REUSED retry=false: this Idempotency-Key was used before with another request
	// IN_PROGRESS retry=true: a request with this Idempotency-Key is still being processed; retry later
	// STORE_UNAVAILABLE retry=true: the request was not processed; retry later
}

// Key is the scheme every door stores keys under.
func ExampleKey() {
	fmt.Println(door.Key("", "order-1"))
	fmt.Println(door.Key("tenant-7", "order-1"))
	// Output:
	// 0:order-1
	// 8:tenant-7order-1
}
