package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// lateRetries finishes n operations with a Client that keeps records for
// a second and tombstones for an hour, waits for the records to expire,
// and retries the first late ones: idem refuses each (ErrLateRetry) and
// counts it beside the tombstones.
func lateRetries(t *testing.T, rdb redis.UniversalClient, n, late int) {
	t.Helper()
	c := idem.New(rdb, idem.WithLease(500*time.Millisecond), idem.WithRetention(time.Second), idem.WithTombstones(time.Hour),
		idem.WithLogger(slog.New(slog.DiscardHandler)))
	defer c.Close()
	ctx := context.Background()
	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	for i := range n {
		if _, err := c.Do(ctx, fmt.Sprint("late-", i), "", ok); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1300 * time.Millisecond)
	for i := range late {
		if _, err := c.Do(ctx, fmt.Sprint("late-", i), "", ok); !errors.Is(err, idem.ErrLateRetry) {
			t.Fatalf("late-%d: %v; want ErrLateRetry", i, err)
		}
	}
}

// stats reports the ages of finished records against the retention
// given, or inferred, and the tombstones and late retries of
// idem.WithTombstones.
func TestStatsRetention(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	ctx := context.Background()

	// Before anything: no tombstones.
	r := idemctl(t, "-redis", srv.Addr(), "stats")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "tombstones: none") {
		t.Errorf("an empty keyspace:\n%s", r.stdout)
	}

	lateRetries(t, rdb, 20, 5)
	// 100 finished records, recorded 0 to 99 minutes ago under a
	// retention of a day, and one in progress, which has no age.
	day := 24 * time.Hour
	pipe := rdb.Pipeline()
	for i := range 100 {
		pipe.Set(ctx, fmt.Sprintf("idem:{order-%d}", i), rec('d', "fp", "owner", 1, "ok"), day-time.Duration(i)*time.Minute)
	}
	pipe.Set(ctx, "idem:{running}", rec('p', "fp", "owner", 1, "1000"), day)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	r = idemctl(t, "-redis", srv.Addr(), "-json", "-retention", "24h", "stats")
	r.mustExit(t, 0)
	var got tally
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	a := got.Ages
	minute := time.Minute.Milliseconds()
	near := func(ms, want int64) bool { return ms >= want && ms < want+10_000 } // the test's own time passes
	if a == nil || a.Finished != 100 || a.Sampled != 100 || a.Inferred || a.RetentionMS != day.Milliseconds() ||
		!near(a.P50MS, 50*minute) || !near(a.P90MS, 90*minute) || !near(a.P99MS, 99*minute) || !near(a.MaxMS, 99*minute) {
		t.Errorf("record ages %+v; want 100 finished records 0 to 99 minutes old", a)
	}
	ts := got.Tombstones
	// The late retries came a few seconds ago: today (UTC), unless a day
	// began since.
	today := time.Now().UTC().Format(time.DateOnly)
	counted := ts.LateByDay[today]
	if len(ts.LateByDay) == 1 && counted == 0 {
		today = time.Now().Add(-time.Minute).UTC().Format(time.DateOnly)
		counted = ts.LateByDay[today]
	}
	if ts.Count != 20 || ts.Buckets < 1 || ts.Bytes <= 0 || ts.LateRetries != 5 || len(ts.LateByDay) != 1 || counted != 5 {
		t.Errorf("tombstones %+v; want 20 tombstones and 5 late retries today", ts)
	}
	if got.Records != 101 {
		t.Errorf("%d records, want 101: tombstones are not records", got.Records)
	}

	// The retention inferred from the longest TTL left; the human output.
	r = idemctl(t, "-redis", srv.Addr(), "stats")
	r.mustExit(t, 0)
	for _, s := range []string{"retention 1d (the longest TTL left", "p50 50m,", "max 1h39m",
		"tombstones (idem.WithTombstones): 20 in", "late retries refused (ErrLateRetry), in the last 8 days: 5", today, "lengthen WithRetention"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("stats does not say %q:\n%s", s, r.stdout)
		}
	}
	r = idemctl(t, "-redis", srv.Addr(), "-retention", "-1s", "stats")
	r.mustExit(t, 2, "-retention")
}

// On a cluster, stats adds up the tombstones and late retries of every
// master.
func TestStatsRetentionCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster of three redis-server processes: skipped in -short")
	}
	cl := redistest.StartCluster(t, 3, 0)
	lateRetries(t, cl.Client(t), 60, 25)
	r := idemctl(t, "-cluster", "-redis", strings.Join(cl.Addrs(), ","), "-json", "stats")
	r.mustExit(t, 0)
	var got tally
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if got.Servers != 3 || got.Tombstones.Count != 60 || got.Tombstones.LateRetries != 25 || got.Records != 0 || got.Ages != nil {
		t.Errorf("cluster stats: %d servers, %d records, tombstones %+v, ages %+v; want 3, 0, 60 and 25 late retries, none",
			got.Servers, got.Records, got.Tombstones, got.Ages)
	}
}
