package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// lateCounts returns the late-retry counts of the backend's tombstones
// (lua/tombstone.lua: the hashes <prefix>:t:{<tag>}:late), by hash.
func lateCounts(t *testing.T, b *idemtest.Backend) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, k := range b.Do(t, "KEYS", "idem:t:{*}:late").([]any) {
		k := k.(string)
		m := map[string]string{}
		v := b.Do(t, "HGETALL", k)
		switch v := v.(type) {
		case map[any]any: // RESP3
			for f, n := range v {
				m[f.(string)] = fmt.Sprint(n)
			}
		case []any:
			for i := 0; i+1 < len(v); i += 2 {
				m[v[i].(string)] = fmt.Sprint(v[i+1])
			}
		}
		out[k] = m
	}
	return out
}

// serverNow is the backend's clock, as Lua's TIME reads it (miniredis's
// follows the test's virtual time).
func serverNow(t *testing.T, b *idemtest.Backend) time.Time {
	t.Helper()
	v := b.Do(t, "TIME").([]any)
	sec, err1 := strconv.ParseInt(v[0].(string), 10, 64)
	usec, err2 := strconv.ParseInt(v[1].(string), 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME: %v", v)
	}
	return time.Unix(sec, usec*1000)
}

func epochDay(t time.Time) int64 { return t.UnixMilli() / 86_400_000 }

// Every late retry that claim.lua refuses is counted, by day, in a small
// hash beside its tombstone's buckets; conflicts and new keys are not; the
// hash keeps the last 8 days and expires 8 days after its last count.
func TestTombstoneCountsLateRetries(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c := b.Idem(t, idem.WithLease(500*time.Millisecond), idem.WithRetention(time.Second), idem.WithTombstones(time.Hour))
		var l idemtest.Runs
		for _, k := range []string{"a", "b"} {
			if _, err := c.Do(ctx, k, "fp", l.Fn("r")); err != nil {
				t.Fatal(err)
			}
		}
		if got := lateCounts(t, b); len(got) != 0 {
			t.Fatalf("late counts before any late retry: %v", got)
		}
		b.Advance(t, 1200*time.Millisecond)
		for _, k := range []string{"a", "a", "b"} {
			if _, err := c.Do(ctx, k, "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
				t.Fatalf("%s: %v; want ErrLateRetry", k, err)
			}
		}
		if _, err := c.Do(ctx, "a", "other", l.Fn("r")); !errors.Is(err, idem.ErrConflict) {
			t.Fatalf("other parameters: %v; want ErrConflict", err)
		}
		if _, err := c.Do(ctx, "new", "fp", l.Fn("r")); err != nil {
			t.Fatal(err)
		}
		now := serverNow(t, b)
		days := map[string]bool{strconv.FormatInt(epochDay(now), 10): true, strconv.FormatInt(epochDay(now.Add(-5*time.Second)), 10): true}
		var total int64
		for k, m := range lateCounts(t, b) {
			for day, n := range m {
				if !days[day] {
					t.Errorf("%s: field %q, want today's day number %v", k, day, days)
				}
				v, _ := strconv.ParseInt(n, 10, 64)
				total += v
			}
			pttl := b.Do(t, "PTTL", k).(int64)
			if pttl <= 7*24*3600*1000 || pttl > 8*24*3600*1000 {
				t.Errorf("%s: PTTL %dms, want 7 to 8 days", k, pttl)
			}
		}
		if total != 3 {
			t.Fatalf("late retries counted: %d, want 3 (%v)", total, lateCounts(t, b))
		}

		// The hash stays bounded: a count drops the days before the last 8.
		for k := range lateCounts(t, b) {
			b.Do(t, "DEL", k)
		}
		if _, err := c.Do(ctx, "a", "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("a: %v; want ErrLateRetry", err)
		}
		var late string
		for k := range lateCounts(t, b) {
			late = k
		}
		today := epochDay(serverNow(t, b))
		for d := today - 30; d < today; d += 3 {
			b.Do(t, "HSET", late, d, 1)
		}
		b.Do(t, "HSET", late, "not-a-day", 1)
		if _, err := c.Do(ctx, "a", "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("a: %v; want ErrLateRetry", err)
		}
		got := lateCounts(t, b)[late]
		if got[strconv.FormatInt(today, 10)] != "2" {
			t.Errorf("today's count %q, want 2 (%v)", got[strconv.FormatInt(today, 10)], got)
		}
		for day := range got {
			d, err := strconv.ParseInt(day, 10, 64)
			if err != nil || d <= today-8 {
				t.Errorf("field %q kept, want only the last 8 days (%v)", day, got)
			}
		}
		if len(got) != 3 { // today, today-3 and today-6
			t.Errorf("fields %v, want 3", got)
		}
		if n := l.Count("a"); n != 1 {
			t.Fatalf("a ran %d times, want 1", n)
		}
	})
}

// On a cluster, each late retry is counted in its key's slot, so the
// script may write it: the counts over every master add up.
func TestTombstoneCountsLateRetriesCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of three redis-server processes: skipped in -short")
	}
	cl := redistest.StartCluster(t, 3, 0)
	cc := cl.Client(t)
	c := idem.New(cc, idem.WithLease(500*time.Millisecond), idem.WithRetention(time.Second), idem.WithTombstones(time.Hour))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	var l idemtest.Runs
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprint("late-", i))
	}
	for _, k := range keys {
		if _, err := c.Do(ctx, k, "fp", l.Fn("r")); err != nil {
			t.Fatalf("%q: %v", k, err)
		}
	}
	time.Sleep(1300 * time.Millisecond)
	for _, k := range keys {
		if _, err := c.Do(ctx, k, "fp", l.Fn("r")); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("%q: %v; want ErrLateRetry", k, err)
		}
	}
	var total, hashes atomic.Int64 // the masters are read at once
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		ks, err := node.Keys(ctx, "idem:t:{*}:late").Result()
		if err != nil {
			return err
		}
		for _, k := range ks {
			m, err := node.HGetAll(ctx, k).Result()
			if err != nil {
				return err
			}
			for _, n := range m {
				v, _ := strconv.ParseInt(n, 10, 64)
				total.Add(v)
			}
			hashes.Add(1)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total.Load() != int64(len(keys)) {
		t.Fatalf("late retries counted over the masters: %d in %d hashes, want %d", total.Load(), hashes.Load(), len(keys))
	}
}
