package idem

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Without an observer and without a CallInfo, a call takes no notes: the
// check in Do and the notes on the call path allocate nothing, also once
// some other call has used a CallInfo.
func TestNoNotesWithoutObserver(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	c := New(rdb, WithLogger(nil))
	defer c.Close()
	ctx := context.WithValue(context.Background(), struct{ k int }{1}, "a caller's value")
	notes := func() {
		if c.observed(ctx) {
			t.Fatal("a call without observer or CallInfo is observed")
		}
		c.observeClaim(ctx, "k", 'b', 1, 0)
		c.observeClaim(ctx, "k", 'c', 2, 0)
		c.observeFollow(ctx, "k")
		c.observeRelease(ctx, "k")
		c.observeStored(ctx, "k", nil, nil)
	}
	if n := testing.AllocsPerRun(1000, notes); n != 0 {
		t.Fatalf("%v allocations per call before any CallInfo", n)
	}
	_ = WithCallInfo(context.Background(), new(CallInfo))
	if n := testing.AllocsPerRun(1000, notes); n != 0 {
		t.Fatalf("%v allocations per call once a CallInfo was used", n)
	}
}

// keyOf undoes keys: the key back from its record's Redis key, braces and
// backslashes included.
func TestKeyOf(t *testing.T) {
	c := &Client{cfg: defaultConfig()}
	c.cfg.prefix = "svc:idem"
	for _, k := range []string{"k", "a}b", `a\b`, `\c`, `}\\}`, "{x}", "\x00\xff", "0:scope-key"} {
		if got := c.keyOf(c.recordKey(k)); got != k {
			t.Errorf("keyOf(%q) = %q, want %q", c.recordKey(k), got, k)
		}
	}
}
