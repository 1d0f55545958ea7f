package idem_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A recovery that parks an operation after WithMaxRecoveries, taking it
// over from an owner whose lease ended, ends that lease (model/idem.pml,
// mutant MR4): the slow owner, still alive, can neither renew (and so keep
// running fn on a parked operation, its renewals moving the index entry
// out of parked) nor store an outcome over the park.
func TestRecoverParkEndsTheStaleLease(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c := b.Idem(t, idem.WithLease(2*time.Second), idem.WithRecoverAfter(20*time.Millisecond),
		idem.WithMaxRecoveries(1), idem.WithLogger(nil))
	ctx := context.Background()
	var ran atomic.Int32
	op := idem.Register(c, "slow", func(ctx context.Context, in string) (string, error) {
		ran.Add(1)
		return "", errors.New("transient")
	})
	if _, err := op.Do(ctx, "k", "x"); err == nil {
		t.Fatal("want the transient error")
	}
	// The slow owner: a recovery that took the operation over (the input
	// counts one recovery, WithMaxRecoveries) and whose lease has ended
	// while it still runs. Its record keeps the caller's fingerprint.
	rdb := b.Client(t)
	rk := idem.RecordKey(c, "k")
	s, err := rdb.Get(ctx, rk).Result()
	if err != nil {
		t.Fatal(err)
	}
	fl := int(s[2])
	const slow = "slow-owner-token"
	claim := "1p" + s[2:3+fl] + string([]byte{byte(len(slow))}) + slow + "2:60000"
	if err := rdb.Set(ctx, rk, claim, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.SetRange(ctx, rk+":in", int64(2+len("slow")), "\x01").Err(); err != nil {
		t.Fatal(err)
	}
	recoverFor(t, c)
	waitState(t, c, "k", idem.StateParked)

	renew := redis.NewScript(idem.ScriptSource("renew"))
	n, err := renew.Run(ctx, rdb, []string{rk, rk + ":steps"}, slow, 2000, 60000).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the slow owner renewed its lease on a parked operation (renew returned %d)", n)
	}
	complete := redis.NewScript(idem.ScriptSource("complete"))
	done := "1d" + claim[2:strings.LastIndexByte(claim, ':')+1] + "late"
	n, err = complete.Run(ctx, rdb, []string{rk, rk + ":done"}, claim, done, 60000, "").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the slow owner stored an outcome over the park (complete returned %d)", n)
	}
	if st, err := c.Status(ctx, "k"); err != nil || st.State != idem.StateParked {
		t.Fatalf("after the slow owner: %v, %v; want parked", st.State, err)
	}
	if _, err := op.Do(ctx, "k", "x"); !errors.Is(err, idem.ErrParked) {
		t.Fatalf("Do of the parked operation: %v", err)
	}
	if got := ran.Load(); got != 1 {
		t.Fatalf("fn ran %d times, want 1: the caller's only", got)
	}
}
