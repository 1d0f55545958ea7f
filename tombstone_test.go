package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Row 42 of docs/faults.md: a retry after the retention, with tombstones.
func TestTombstoneRefusesLateRetry(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		retention, keep := time.Second, 2*time.Second
		c := b.Idem(t, idem.WithLease(500*time.Millisecond), idem.WithRetention(retention), idem.WithTombstones(keep))
		// miniredis's clock stops here and moves only by Advance: at load
		// 21, the real time that passed before the first Advance took
		// the tombstones past keep.
		b.Advance(t, 0)
		var runs atomic.Int64
		fn := func(ctx context.Context) ([]byte, error) {
			return []byte(fmt.Sprint("run-", runs.Add(1))), nil
		}
		if _, err := c.Do(ctx, "k", "fp", fn); err != nil {
			t.Fatal(err)
		}
		// A permanent failure leaves a tombstone too.
		if _, err := c.Do(ctx, "failed", "fp", func(context.Context) ([]byte, error) {
			runs.Add(1)
			return nil, idem.Permanent(errors.New("declined"))
		}); err == nil {
			t.Fatal("the failure was not returned")
		}
		b.Advance(t, retention+200*time.Millisecond)
		if st := idemtest.Status(t, b, "k"); st.State != idem.StateAbsent {
			t.Fatalf("after the retention: %v; want the record gone", st.State)
		}
		for _, k := range []string{"k", "failed"} {
			if _, err := c.Do(ctx, k, "fp", fn); !errors.Is(err, idem.ErrLateRetry) {
				t.Fatalf("%s: late retry: %v; want ErrLateRetry", k, err)
			}
			if _, err := c.Do(ctx, k, "other", fn); !errors.Is(err, idem.ErrConflict) {
				t.Fatalf("%s: late retry with other parameters: %v; want ErrConflict", k, err)
			}
		}
		if _, err := idem.Do(ctx, c, "k", "", func(context.Context) (int, error) { runs.Add(1); return 1, nil }); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("without a fingerprint: %v; want ErrLateRetry", err)
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("fn ran %d times; want 2", n)
		}
		// A key never used is not refused.
		if got, err := c.Do(ctx, "new", "fp", fn); err != nil || string(got) != "run-3" {
			t.Fatalf("a new key: %q, %v", got, err)
		}
		// After the tombstone time (and its window), the key is new again.
		b.Advance(t, keep+time.Second+200*time.Millisecond)
		if got, err := c.Do(ctx, "k", "fp", fn); err != nil || string(got) != "run-4" {
			t.Fatalf("after the tombstone: %q, %v; want a new run", got, err)
		}
	})
}

func TestTombstoneForget(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c := b.Idem(t, idem.WithLease(500*time.Millisecond), idem.WithRetention(time.Second), idem.WithTombstones(time.Hour))
		var l idemtest.Runs
		if _, err := c.Do(ctx, "k", "fp", l.Fn("r")); err != nil {
			t.Fatal(err)
		}
		b.Advance(t, 1200*time.Millisecond)
		if _, err := c.Do(ctx, "k", "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("late retry: %v", err)
		}
		if err := c.Forget(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Do(ctx, "k", "fp", l.Fn("r")); err != nil || string(got) != "r#1" {
			t.Fatalf("after Forget: %q, %v; want a new run", got, err)
		}
		// Its new outcome leaves a new tombstone, which Forget's mark does
		// not hide.
		b.Advance(t, 1200*time.Millisecond)
		if _, err := c.Do(ctx, "k", "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("late retry after the second run: %v", err)
		}
		// Forget of a live record removes the record and the tombstone.
		if _, err := c.Do(ctx, "live", "fp", l.Fn("r")); err != nil {
			t.Fatal(err)
		}
		if err := c.Forget(ctx, "live"); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Do(ctx, "live", "fp", l.Fn("r")); err != nil || string(got) != "r#1" {
			t.Fatalf("live key after Forget: %q, %v", got, err)
		}
		if n := l.Count("live"); n != 2 {
			t.Fatalf("live ran %d times; want 2", n)
		}
	})
}

// Buckets fill past one listpack's 128 fields and spill to further levels:
// every tombstone is still found, and no new key is refused.
func TestTombstoneBucketsSpill(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	c := b.Idem(t, idem.WithLease(500*time.Millisecond), idem.WithRetention(time.Second), idem.WithTombstones(time.Hour))
	// Keys whose slots agree modulo 1024 share one level-0 bucket per
	// window on one server.
	keys := keysInBucket("spill-", 777, 600)
	var l idemtest.Runs
	for _, k := range keys {
		if _, err := c.Do(ctx, k, "fp", l.Fn("r")); err != nil {
			t.Fatal(err)
		}
	}
	b.Advance(t, 1200*time.Millisecond)
	levels := map[string]int{}
	for _, k := range b.Do(t, "KEYS", "idem:t:{*").([]any) {
		k := k.(string)
		if strings.HasSuffix(k, "}:w") {
			continue // the registry of window widths (lua/tombstone.lua)
		}
		levels[k[strings.LastIndexByte(k, ':')+1:strings.LastIndexByte(k, '.')]]++
	}
	if levels["2"] == 0 {
		t.Fatalf("600 tombstones in one slot filled levels %v; want at least 0 to 2", levels)
	}
	for _, k := range keys {
		if _, err := c.Do(ctx, k, "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("%s: %v; want ErrLateRetry", k, err)
		}
	}
	for _, k := range keysInBucket("fresh-", 777, 200) {
		if _, err := c.Do(ctx, k, "fp", l.Fn("r")); err != nil {
			t.Fatalf("new key %s: %v", k, err)
		}
	}
}

// The tombstone lives in the key's cluster slot: keys over many slots
// complete and are refused as late retries on a real cluster.
func TestTombstoneCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of three redis-server processes: skipped in -short")
	}
	cl := redistest.StartCluster(t, 3, 0)
	cc := cl.Client(t)
	// A lease of a second: with 500ms, the first claim of a cold cluster
	// client came back too late on a loaded machine (load 13).
	c := idem.New(cc, idem.WithLease(time.Second), idem.WithRetention(2*time.Second), idem.WithTombstones(time.Hour))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	var l idemtest.Runs
	keys := []string{"{", "}", "a{b}c", "\x00\xff"}
	for i := range 60 {
		keys = append(keys, fmt.Sprint("order-", i))
	}
	for _, k := range keys {
		if _, err := c.Do(ctx, k, "fp", l.Fn("r")); err != nil {
			t.Fatalf("%q: %v", k, err)
		}
	}
	time.Sleep(2300 * time.Millisecond)
	for _, k := range keys {
		if _, err := c.Do(ctx, k, "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("%q: %v; want ErrLateRetry", k, err)
		}
		if err := c.Forget(ctx, k); err != nil {
			t.Fatalf("Forget(%q): %v", k, err)
		}
		if _, err := c.Do(ctx, k, "fp", l.Fn("r")); err != nil {
			t.Fatalf("%q after Forget: %v", k, err)
		}
	}
}

// The memory of 100,000 tombstones, on a real server: the README's
// figure. It fails above 64 bytes a tombstone.
func TestTombstoneMemory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("100,000 tombstones: skipped in -short")
	}
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	c := b.Idem(t, idem.WithRetention(time.Hour), idem.WithTombstones(30*24*time.Hour))
	rdb := b.Client(t)
	used := func() int64 { return idemtest.Info(t, b, "memory", "used_memory") }
	// EVALSHA, not EVAL: 100,000 copies of the script's 4 KB would only
	// cost time, on both sides.
	idemtest.LoadScripts(t, b)
	complete := idemtest.ScriptSHA(t, "complete")
	const n = 100_000
	before := used()
	for i := 0; i < n; i += 1000 {
		pipe := rdb.Pipeline()
		var records []string
		for j := i; j < i+1000; j++ {
			claimed, keys, args := idem.TombstoneCompletion(c, fmt.Sprint("order-", j), "fp", "owner-token-0123", []byte("receipt"))
			pipe.Set(ctx, keys[0], claimed, time.Hour)
			pipe.EvalSha(ctx, complete, keys, args...)
			records = append(records, keys[0])
		}
		pipe.Del(ctx, records...) // as if the retention ended: the tombstones stay
		cmds, err := pipe.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range cmds {
			if e, ok := cmd.(*redis.Cmd); ok && e.Val() != int64(1) {
				t.Fatalf("complete.lua answered %v", e.Val())
			}
		}
	}
	per := float64(used()-before) / n
	t.Logf("%d tombstones: %.1f bytes each (used_memory), %d bucket keys", n, per, rdb.DBSize(ctx).Val())
	if per > 64 {
		t.Fatalf("%.1f bytes a tombstone; want at most 64", per)
	}
	// Every one is found.
	for _, i := range []int{0, 1, n / 2, n - 1} {
		if _, err := c.Do(ctx, fmt.Sprint("order-", i), "fp", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("order-%d: %v; want ErrLateRetry", i, err)
		}
	}
}

// A replay's event carries the age of the outcome it replays.
func TestReplayEventAge(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	var got []idem.Event
	c := b.Idem(t, idem.WithObserver(observerFunc(func(_ context.Context, e idem.Event) { got = append(got, e) })))
	var l idemtest.Runs
	if _, err := c.Do(ctx, "k", "fp", l.Fn("r")); err != nil {
		t.Fatal(err)
	}
	b.Advance(t, 90*time.Minute)
	if _, err := c.Do(ctx, "k", "fp", l.Fn("r")); err != nil {
		t.Fatal(err)
	}
	last := got[len(got)-1]
	if last.Kind != idem.EventReplayed || last.Age < 89*time.Minute || last.Age > 91*time.Minute {
		t.Fatalf("replay event %+v; want an age of 90 minutes", last)
	}
	if got[0].Age != 0 {
		t.Fatalf("executed event has an age: %+v", got[0])
	}
}

// keysInBucket returns n keys whose records share level-0 tombstone bucket
// i on one server (their slots agree modulo 1024), named prefix and a
// number.
func keysInBucket(prefix string, i uint16, n int) []string {
	var keys []string
	for j := 0; len(keys) < n; j++ {
		if k := fmt.Sprint(prefix, j); crc16(k)%1024 == i {
			keys = append(keys, k)
		}
	}
	return keys
}
