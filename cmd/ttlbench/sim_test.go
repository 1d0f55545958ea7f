package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// quick is a small workload whose retries all arrive within 2 hours of
// their operation (checked by withinTwoHours).
func quick(seed uint64) Workload {
	return Workload{
		Ops: 120, Rate: 0.1, Seed: seed,
		TimeoutShare: 0.2, Retries: 3, RetryBase: time.Second, RetryFactor: 2, RetryJitter: 0.2, RetryCap: 30 * time.Second,
		LateShare: 0.1, LateMedian: 5 * time.Minute, LateP99: 30 * time.Minute,
	}
}

func quickOptions(policies ...time.Duration) Options {
	return Options{Policies: policies, Lease: 30 * time.Second, ResultSize: 64, TimeScale: 1}
}

func withinTwoHours(t *testing.T, p *Plan) {
	t.Helper()
	first := make([]time.Duration, len(p.Keys))
	for _, e := range p.Events {
		if e.Kind == First {
			first[e.Op] = e.At
		} else if d := e.At - first[e.Op]; d >= 2*time.Hour {
			t.Fatalf("a retry of operation %d comes %s after it; the workload must keep retries within 2h", e.Op, d)
		}
	}
}

func simulate(t *testing.T, p *Plan, opts Options) []Result {
	t.Helper()
	rs, err := Simulate(context.Background(), p, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		// Every request ran fn, replayed, or conflicted.
		if runs := r.Operations + r.Duplicates; r.Requests != runs+r.Replays+r.Conflicts {
			t.Errorf("%s: %d requests, but %d runs of fn, %d replays and %d conflicts",
				shortDuration(r.Retention), r.Requests, runs, r.Replays, r.Conflicts)
		}
	}
	return rs
}

func TestLongRetentionHasNoDuplicates(t *testing.T) {
	t.Parallel()
	p := quick(1).Plan()
	withinTwoHours(t, p)
	if p.Count(Retry) == 0 || p.Count(Late) == 0 {
		t.Fatalf("the workload has %d retries and %d late redeliveries; want some of each", p.Count(Retry), p.Count(Late))
	}
	rs := simulate(t, p, quickOptions(time.Minute, 24*time.Hour))
	if got := rs[0].Duplicates; got == 0 {
		t.Errorf("1m retention: no duplicates, want some: late redeliveries come minutes later")
	}
	if got := rs[1].Duplicates; got != 0 {
		t.Errorf("24h retention: %d duplicates, want 0: every retry comes within 2h", got)
	}
	if rs[1].Replays != p.Count(Retry)+p.Count(Late) {
		t.Errorf("24h retention: %d replays, want one per retry (%d)", rs[1].Replays, p.Count(Retry)+p.Count(Late))
	}
}

func TestLongerRetentionTradesMemoryForDuplicates(t *testing.T) {
	t.Parallel()
	policies := []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour}
	for seed := uint64(1); seed <= 2; seed++ {
		rs := simulate(t, quick(seed).Plan(), quickOptions(policies...))
		for i := 1; i < len(rs); i++ {
			a, b := rs[i-1], rs[i]
			if b.Duplicates > a.Duplicates {
				t.Errorf("seed %d: %s has %d duplicates, more than %s's %d",
					seed, shortDuration(b.Retention), b.Duplicates, shortDuration(a.Retention), a.Duplicates)
			}
			if b.PeakBytes < a.PeakBytes {
				t.Errorf("seed %d: %s peaks at %d bytes, less than %s's %d",
					seed, shortDuration(b.Retention), b.PeakBytes, shortDuration(a.Retention), a.PeakBytes)
			}
		}
	}
}

// TestMatchesFastForward checks the shortcut the simulation takes with
// time (see memStore) against the plain way: miniredis's FastForward at
// every request, and its own count of keys.
func TestMatchesFastForward(t *testing.T) {
	t.Parallel()
	// Retries spread over minutes, so that many fall near a record's
	// expiry.
	w := quick(4)
	w.TimeoutShare, w.Retries, w.RetryBase, w.RetryCap = 0.5, 4, 10*time.Second, 2*time.Minute
	w.LateShare, w.LateMedian = 0.3, 2*time.Minute
	p := w.Plan()
	policies := []time.Duration{time.Minute, 10 * time.Minute, time.Hour}
	rs := simulate(t, p, quickOptions(policies...))
	for i, retention := range policies {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		c := idem.New(rdb, idem.WithRetention(retention), idem.WithWait(0))
		mr.SetTime(p.Start)
		var now time.Duration
		runs := make([]int, len(p.Keys))
		peak, replays := 0, 0
		for _, e := range p.Events {
			mr.FastForward(e.At - now)
			now = e.At
			mr.SetTime(p.Start.Add(now))
			ran := false
			if _, err := c.Do(context.Background(), p.Keys[e.Op], e.Fingerprint, func(context.Context) ([]byte, error) {
				runs[e.Op]++
				ran = true
				return make([]byte, 64), nil
			}); err != nil {
				t.Fatal(err)
			}
			if !ran {
				replays++
			}
			peak = max(peak, len(mr.Keys()))
		}
		_ = c.Close()
		_ = rdb.Close()
		dups := 0
		for _, n := range runs {
			dups += max(n-1, 0)
		}
		if got := rs[i]; got.Duplicates != dups || got.Replays != replays || got.PeakRecords != peak {
			t.Errorf("%s: got %d duplicates, %d replays, peak %d records; FastForward gives %d, %d, %d",
				shortDuration(retention), got.Duplicates, got.Replays, got.PeakRecords, dups, replays, peak)
		}
	}
}

// TestExpiryIsExact checks the edges: a record retained for 1m answers a
// retry 1ms before the minute is up and is gone at the minute; a replay
// does not extend the retention, a new run does.
func TestExpiryIsExact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		trace         string
		replays, runs int
	}{
		{"a,0\na,59999\n", 1, 1},
		{"a,0\na,60000\n", 0, 2},
		{"a,0\na,30000\na,70000\n", 1, 2},
		{"a,0\na,60000\na,119999\na,120000\n", 1, 3},
	} {
		p, err := ReadTrace(strings.NewReader(tc.trace))
		if err != nil {
			t.Fatal(err)
		}
		r := simulate(t, p, quickOptions(time.Minute))[0]
		if r.Replays != tc.replays || r.Duplicates+1 != tc.runs {
			t.Errorf("%q: got %d replays and %d runs, want %d and %d",
				tc.trace, r.Replays, r.Duplicates+1, tc.replays, tc.runs)
		}
	}
}

func TestConflictsAreCounted(t *testing.T) {
	t.Parallel()
	p, err := ReadTrace(strings.NewReader("a,0,x\na,1000,y\na,2000,x\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := simulate(t, p, quickOptions(time.Minute))[0]
	if r.Conflicts != 1 || r.Replays != 1 || r.Duplicates != 0 {
		t.Errorf("got %d conflicts, %d replays, %d duplicates; want 1, 1, 0", r.Conflicts, r.Replays, r.Duplicates)
	}
}

func TestPeakBytes(t *testing.T) {
	t.Parallel()
	// Two records alive at once at 1s, one record after a's expiry.
	p, err := ReadTrace(strings.NewReader("a,0\nb,1000\nb,70000\n"))
	if err != nil {
		t.Fatal(err)
	}
	opts := quickOptions(time.Minute)
	opts.ResultSize = 1000
	r := simulate(t, p, opts)[0]
	if r.PeakRecords != 2 {
		t.Errorf("peak %d records, want 2", r.PeakRecords)
	}
	// Two records: each holds at least its key and the 1000-byte result,
	// and not ten times that.
	if r.PeakBytes < 2*1000 || r.PeakBytes > 2*1300 {
		t.Errorf("peak %d bytes, want a little over 2000", r.PeakBytes)
	}
}

// TestRealRedis runs a small workload against a redis-server of its own,
// if one is installed, and checks that ttlbench leaves its keys behind no
// more than anyone else's.
func TestRealRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{}) // skips without redis-server, unless IDEM_REQUIRE_REDIS=1
	addr := srv.Addr()
	rdb := srv.Client(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, "someone-else", "keep me", 0).Err(); err != nil {
		t.Fatal(err)
	}

	// At -time-scale 1000 a 30s lease lasted 30ms of real time, which a
	// loaded machine overran ("lease lost"). Here the lease is a second of
	// real time (1m at scale 60), four times ttlbench's floor, and the
	// traffic spans a few minutes of virtual time: a few seconds of real
	// time.
	w := quick(1)
	w.Ops, w.Rate = 60, 1
	w.LateMedian, w.LateP99 = 90*time.Second, 3*time.Minute
	p := w.Plan()
	if p.Count(Late) == 0 || p.Span() > 10*time.Minute {
		t.Fatalf("the workload has %d late redeliveries over %s; want some, within 10m", p.Count(Late), p.Span())
	}
	opts := quickOptions(time.Minute, 24*time.Hour)
	opts.Lease = time.Minute
	opts.Redis, opts.TimeScale = addr, 60
	cfg := &config{work: w, opts: opts}
	if err := cfg.check(map[string]bool{"time-scale": true}); err != nil {
		t.Fatalf("ttlbench refuses the test's own settings: %v", err)
	}
	rs := simulate(t, p, opts)
	if rs[0].Duplicates == 0 || rs[1].Duplicates != 0 {
		t.Errorf("got %d and %d duplicates for 1m and 24h; want some and none", rs[0].Duplicates, rs[1].Duplicates)
	}
	if rs[1].PeakRecords != w.Ops || rs[1].PeakBytes < int64(w.Ops*opts.ResultSize) {
		t.Errorf("24h: peak %d records, %d bytes; want %d records of more than %d bytes",
			rs[1].PeakRecords, rs[1].PeakBytes, w.Ops, opts.ResultSize)
	}
	if rs[1].BytesMethod != bytesMemoryUsage {
		t.Errorf("bytes measured by %q, want %q", rs[1].BytesMethod, bytesMemoryUsage)
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, []string{"someone-else"}) {
		t.Errorf("keys left: %q; want only the key ttlbench did not write", keys)
	}
}
