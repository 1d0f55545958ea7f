package idem_test

// Allocations set part of a call's client CPU: this test holds a new key's
// allocations to the raw floor's (two EVALSHA through go-redis) plus
// idem's own few, so that a change that brings back a per-call allocation
// on the path every call takes fails here.

import (
	"context"
	"strconv"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/benchrun"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// newKeyOwnAllocs is how many more allocations than the raw floor a new
// key's Do makes on a real redis-server today: fewer, for idem sends its
// scripts' commands as go-redis's Script.Run would, but with their
// arguments laid out in memory it has anyway (the call's), the scripts'
// digests and the record's key boxed once, where the floor pays go-redis's
// argument list, digest and keys on every EVALSHA. That outweighs idem's
// own allocations (the call, its token, fingerprint digest, keys, claim and
// finished records, fn's context and its hold, the completion's detached
// context, the boxed record): 23 against the floor's 26.
const newKeyOwnAllocs = -3

// TestAllocsOfANewKey counts allocations with testing.AllocsPerRun (not in
// parallel: it counts the whole process's), on a real redis-server, whose
// own allocations are not this process's.
func TestAllocsOfANewKey(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	srv := redistest.Start(t, redistest.Config{})
	if srv == nil {
		return
	}
	ctx := context.Background()
	newClient := func() *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	p := benchrun.Payload(100)
	fn := func(context.Context) ([]byte, error) { return p, nil }
	c := idem.New(newClient())
	t.Cleanup(func() { _ = c.Close() })
	raw := newClient()
	const runs = 300
	keys := make([]string, 2*(runs+2))
	for i := range keys {
		keys[i] = "alloc-" + strconv.Itoa(i) // made before counting
	}
	n := 0
	next := func() string { n++; return keys[n-1] }
	if _, err := c.Do(ctx, next(), "fp", fn); err != nil { // caches the scripts
		t.Fatal(err)
	}
	if err := rawNewKey(ctx, raw, next(), rawToken, p); err != nil {
		t.Fatal(err)
	}
	floor := testing.AllocsPerRun(runs, func() {
		if err := rawNewKey(ctx, raw, next(), rawToken, p); err != nil {
			t.Fatal(err)
		}
	})
	got := testing.AllocsPerRun(runs, func() {
		if _, err := c.Do(ctx, next(), "fp", fn); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("a new key: idem %v allocations, the raw floor %v", got, floor)
	if got > floor+newKeyOwnAllocs {
		t.Errorf("a new key's Do allocates %v times, the raw floor %v: want at most %v (the floor %+d)", got, floor, floor+newKeyOwnAllocs, newKeyOwnAllocs)
	}
}
