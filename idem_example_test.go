package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

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

// New takes any go-redis client and options; every option's default suits
// most services. Records live at <prefix>:{<key>} for the retention.
func ExampleNew() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	keys := idem.New(rdb,
		idem.WithPrefix("orders"),        // records at orders:{<key>}
		idem.WithRetention(48*time.Hour), // replay outcomes for two days (cmd/ttlbench helps choose)
		idem.WithLease(10*time.Second),   // a crashed owner's claim ends 10s after its last renewal
		idem.WithWait(2*time.Second),     // a duplicate waits up to 2s for the owner's outcome
	)
	defer keys.Close()

	_, err := keys.Do(context.Background(), "order-1", "", func(ctx context.Context) ([]byte, error) {
		return []byte("shipped"), nil
	})
	fmt.Println(err, mr.Keys(), mr.TTL("orders:{order-1}"))
	// Output:
	// <nil> [orders:{order-1}] 48h0m0s
}

// Do stores any result msgpack can encode. The owner gets fn's value; any
// later call, here from another instance of the service with a Client of
// its own, gets a decoded copy, and fn does not run again.
func ExampleDo_typed() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	instanceA, instanceB := idem.New(rdb), idem.New(rdb)
	defer instanceA.Close()
	defer instanceB.Close()

	type Shipment struct {
		Order   string
		Parcels []string
		Labels  map[string]int
	}
	ship := func(ctx context.Context) (Shipment, error) {
		fmt.Println("booking the carrier")
		return Shipment{Order: "order-7", Parcels: []string{"p1", "p2"}, Labels: map[string]int{"p1": 2}}, nil
	}
	ctx := context.Background()
	fp := idem.Fingerprint("order-7", "express")
	for _, c := range []*idem.Client{instanceA, instanceB} {
		s, err := idem.Do(ctx, c, "ship-order-7", fp, ship)
		fmt.Printf("%+v %v\n", s, err)
	}
	// Output:
	// booking the carrier
	// {Order:order-7 Parcels:[p1 p2] Labels:map[p1:2]} <nil>
	// {Order:order-7 Parcels:[p1 p2] Labels:map[p1:2]} <nil>
}

// A fingerprint identifies an operation's parameters: the same parameters
// give the same fingerprint in any process (maps in any order), and other
// parameters under the same key give ErrConflict.
func ExampleFingerprint() {
	type Transfer struct {
		From, To string
		Amount   int64
		Tags     map[string]string
	}
	a := idem.Fingerprint(Transfer{"acct-A", "acct-B", 100, map[string]string{"memo": "rent", "month": "may"}})
	b := idem.Fingerprint(Transfer{"acct-A", "acct-B", 100, map[string]string{"month": "may", "memo": "rent"}})
	c := idem.Fingerprint(Transfer{"acct-A", "acct-B", 1000, map[string]string{"memo": "rent", "month": "may"}})
	fmt.Println(a == b, a == c, len(a))
	// Output:
	// true false 32
}

// Status shows a key's record without changing it: here while fn runs, and
// after.
func ExampleClient_Status() {
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
	show := func(when string) {
		st, err := keys.Status(ctx, "import-2024-05")
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %v, attempt %d, lease set: %v\n", when, st.State, st.Attempt, !st.LeaseEnds.IsZero())
	}
	show("before")
	_, err := keys.Do(ctx, "import-2024-05", "", func(ctx context.Context) ([]byte, error) {
		show("while fn runs")
		return nil, nil
	})
	if err != nil {
		panic(err)
	}
	show("after")
	// Output:
	// before: absent, attempt 0, lease set: false
	// while fn runs: in progress, attempt 1, lease set: true
	// after: done, attempt 1, lease set: false
}

// Forget is the operator's escape hatch: it deletes a record, so the next
// call runs fn again, as attempt 1. Here a job's stored outcome was wrong
// (its input was fixed since), and it must run once more.
func ExampleClient_Forget() {
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
	report := func(ctx context.Context) ([]byte, error) {
		a, _ := idem.AttemptFrom(ctx)
		fmt.Println("building the report, attempt", a.Number)
		return []byte("report"), nil
	}
	for range 2 {
		if _, err := keys.Do(ctx, "report-2024-05", "", report); err != nil {
			panic(err)
		}
	}
	if err := keys.Forget(ctx, "report-2024-05"); err != nil {
		panic(err)
	}
	if _, err := keys.Do(ctx, "report-2024-05", "", report); err != nil {
		panic(err)
	}
	// Output:
	// building the report, attempt 1
	// building the report, attempt 1
}

// An attempt after the first may follow one that acted but whose outcome
// was never stored (its reply was lost, its process died). The attempt
// number says so: reconcile with the downstream system, by the key, before
// acting again.
func ExampleAttemptFrom() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	bank := map[string]int64{} // the bank's debits, by the reference we gave it
	debit := func(ctx context.Context) (Receipt, error) {
		a, _ := idem.AttemptFrom(ctx)
		if a.Number > 1 {
			if amount, ok := bank[a.Key]; ok {
				fmt.Printf("attempt %d: the bank has %s already: not debiting again\n", a.Number, a.Key)
				return Receipt{ID: a.Key, Amount: amount}, nil
			}
		}
		bank[a.Key] = 100
		fmt.Printf("attempt %d: debited\n", a.Number)
		if a.Number == 1 {
			return Receipt{}, errors.New("connection reset reading the bank's reply")
		}
		return Receipt{ID: a.Key, Amount: 100}, nil
	}
	ctx := context.Background()
	for range 2 { // the client retries until it gets a receipt
		r, err := idem.Do(ctx, keys, "payment-9", idem.Fingerprint("acct-A", 100), debit)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(r)
	}
	fmt.Println("debits at the bank:", len(bank))
	// Output:
	// attempt 1: debited
	// error: connection reset reading the bank's reply
	// attempt 2: the bank has payment-9 already: not debiting again
	// {payment-9 100}
	// debits at the bank: 1
}

// A message consumer: the event's business id is the key, and the consumer
// acknowledges a message only when Ack says that its outcome is stored. A
// consumer that dies before leaves the message pending, for another
// consumer to take over, and an event delivered twice, here because the
// producer sent it twice, is applied once. For Redis Streams, the
// idemstream package is this loop, with takeovers, retries and dead
// letters; docs/brokers.md has it for Kafka, NATS JetStream and SQS.
func ExampleDo_consumer() {
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
	if err := rdb.XGroupCreateMkStream(ctx, "events", "billing", "0").Err(); err != nil {
		panic(err)
	}
	for _, ev := range []string{"evt-1 acct-A 30", "evt-2 acct-B 12", "evt-2 acct-B 12"} {
		var id, account string
		var amount int64
		fmt.Sscan(ev, &id, &account, &amount)
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "events", Values: []any{"id", id, "account", account, "amount", amount}})
	}

	balances := map[string]int64{}
	streams, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: "billing", Consumer: "worker-1", Streams: []string{"events", ">"}, Count: 10, Block: -1,
	}).Result()
	if err != nil {
		panic(err)
	}
	for _, msg := range streams[0].Messages {
		id, account := msg.Values["id"].(string), msg.Values["account"].(string)
		amount, _ := strconv.ParseInt(msg.Values["amount"].(string), 10, 64)
		_, err := idem.Do(ctx, keys, id, idem.Fingerprint(account, amount), func(ctx context.Context) (int64, error) {
			balances[account] += amount
			fmt.Printf("applied %s: %+d to %s\n", id, amount, account)
			return balances[account], nil
		})
		if !idem.Ack(err) {
			continue // nothing stored yet: not acknowledged, delivered again later
		}
		rdb.XAck(ctx, "events", "billing", msg.ID)
	}
	pending, _ := rdb.XPending(ctx, "events", "billing").Result()
	fmt.Println(balances, "unacknowledged:", pending.Count)
	// Output:
	// applied evt-1: +30 to acct-A
	// applied evt-2: +12 to acct-B
	// map[acct-A:30 acct-B:12] unacknowledged: 0
}

// VerdictOf tells a consumer what to do with a message whose handler ran
// through Do: acknowledge it, dead-letter it, or leave it for a
// redelivery.
func ExampleVerdictOf() {
	for _, err := range []error{
		nil,
		idem.ErrConflict,
		fmt.Errorf("%w: key %q", idem.ErrInProgress, "order-1"),
		fmt.Errorf("%w: empty key", idem.ErrInvalidKey),
	} {
		switch v := idem.VerdictOf(err); {
		case v.Settled():
			fmt.Println(v, "→ acknowledge")
		case v.DeadLetter():
			fmt.Println(v, "→ dead letter")
		default:
			fmt.Println(v, "→ redeliver later")
		}
	}
	// Output:
	// outcome → acknowledge
	// conflict → acknowledge
	// in progress → redeliver later
	// invalid key → dead letter
}
