package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// quick is a small workload whose retries all arrive within 2 hours of
// their operation (checked by withinTwoHours).
func quick(seed uint64) traffic.Workload {
	return traffic.Workload{
		Ops: 120, Rate: 0.1, Seed: seed,
		TimeoutShare: 0.2, Retries: 3, RetryBase: time.Second, RetryFactor: 2, RetryJitter: 0.2, RetryCap: 30 * time.Second,
		LateShare: 0.1, LateMedian: 5 * time.Minute, LateP99: 30 * time.Minute,
	}
}

func quickOptions(policies ...time.Duration) options {
	return options{Policies: policies, Lease: 30 * time.Second, ResultSize: 64, TimeScale: 1, Engine: engineFast}
}

// engines are the ways to replay, for tests that check both.
var engines = []string{engineFast, engineReal}

func withinTwoHours(t *testing.T, p *traffic.Plan) {
	t.Helper()
	first := make([]time.Duration, p.Ops())
	for i, op := range p.Op {
		if p.Kind[i] == traffic.First {
			first[op] = p.At[i]
		} else if d := p.At[i] - first[op]; d >= 2*time.Hour {
			t.Fatalf("a retry of operation %d comes %s after it; the workload must keep retries within 2h", op, d)
		}
	}
}

func simulate(t *testing.T, p *traffic.Plan, opts options) []policyResult {
	t.Helper()
	rs, err := simulateReal(context.Background(), p, opts.Policies, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		// Every request ran fn, replayed, or conflicted.
		if runs := r.Operations + r.Duplicates; r.Requests != runs+r.Replays+r.Conflicts+r.InProgress {
			t.Errorf("%s: %d requests, but %d runs of fn, %d replays, %d conflicts and %d in progress",
				units.ShortDuration(r.Retention), r.Requests, runs, r.Replays, r.Conflicts, r.InProgress)
		}
	}
	return rs
}

func TestLongRetentionHasNoDuplicates(t *testing.T) {
	t.Parallel()
	p := quick(1).Plan(false)
	withinTwoHours(t, p)
	if p.Count(traffic.Retry) == 0 || p.Count(traffic.Late) == 0 {
		t.Fatalf("the workload has %d retries and %d late redeliveries; want some of each", p.Count(traffic.Retry), p.Count(traffic.Late))
	}
	rs := simulate(t, p, quickOptions(time.Minute, 24*time.Hour))
	if got := rs[0].Duplicates; got == 0 {
		t.Errorf("1m retention: no duplicates, want some: late redeliveries come minutes later")
	}
	if got := rs[1].Duplicates; got != 0 {
		t.Errorf("24h retention: %d duplicates, want 0: every retry comes within 2h", got)
	}
	if rs[1].Replays != p.Count(traffic.Retry)+p.Count(traffic.Late) {
		t.Errorf("24h retention: %d replays, want one per retry (%d)", rs[1].Replays, p.Count(traffic.Retry)+p.Count(traffic.Late))
	}
}

func TestLongerRetentionTradesMemoryForDuplicates(t *testing.T) {
	t.Parallel()
	policies := []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour}
	for seed := uint64(1); seed <= 2; seed++ {
		rs := simulate(t, quick(seed).Plan(false), quickOptions(policies...))
		for i := 1; i < len(rs); i++ {
			a, b := rs[i-1], rs[i]
			if b.Duplicates > a.Duplicates {
				t.Errorf("seed %d: %s has %d duplicates, more than %s's %d",
					seed, units.ShortDuration(b.Retention), b.Duplicates, units.ShortDuration(a.Retention), a.Duplicates)
			}
			if b.PeakBytes < a.PeakBytes {
				t.Errorf("seed %d: %s peaks at %d bytes, less than %s's %d",
					seed, units.ShortDuration(b.Retention), b.PeakBytes, units.ShortDuration(a.Retention), a.PeakBytes)
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
	p := w.Plan(true)
	policies := []time.Duration{time.Minute, 10 * time.Minute, time.Hour}
	opts := quickOptions(policies...)
	opts.Engine = engineReal
	rs := simulate(t, p, opts)
	for i, retention := range policies {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		c := idem.New(rdb, idem.WithRetention(retention), idem.WithWait(0))
		mr.SetTime(p.Start)
		var now time.Duration
		runs := make([]int, p.Ops())
		peak, replays := 0, 0
		for i, at := range p.At {
			mr.FastForward(at - now)
			now = at
			mr.SetTime(p.Start.Add(now))
			ran := false
			op := p.Op[i]
			if _, err := c.Do(context.Background(), p.Keys[op], p.Fingerprint(i), func(context.Context) ([]byte, error) {
				runs[op]++
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
				units.ShortDuration(retention), got.Duplicates, got.Replays, got.PeakRecords, dups, replays, peak)
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
		p := readTrace(t, tc.trace, engineReal)
		for _, engine := range engines {
			opts := quickOptions(time.Minute)
			opts.Engine = engine
			r := simulate(t, p, opts)[0]
			if r.Replays != tc.replays || r.Duplicates+1 != tc.runs {
				t.Errorf("%s engine: %q: got %d replays and %d runs, want %d and %d",
					engine, tc.trace, r.Replays, r.Duplicates+1, tc.replays, tc.runs)
			}
		}
	}
}

// readTrace reads a trace whose times are milliseconds after 2023-11-14,
// for the engine given.
func readTrace(t *testing.T, trace, engine string) *traffic.Plan {
	t.Helper()
	var b strings.Builder
	for line := range strings.Lines(trace) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), ",")
		ms, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		f[1] = strconv.FormatInt(1_700_000_000_000+ms, 10)
		b.WriteString(strings.Join(f, ",") + "\n")
	}
	p, err := parseTrace(context.Background(), strings.NewReader(b.String()), traceFormat{KeepKeys: engine == engineReal})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConflictsAreCounted(t *testing.T) {
	t.Parallel()
	p := readTrace(t, "a,0,x\na,1000,y\na,2000,x\n", engineReal)
	for _, engine := range engines {
		opts := quickOptions(time.Minute)
		opts.Engine = engine
		r := simulate(t, p, opts)[0]
		if r.Conflicts != 1 || r.Replays != 1 || r.Duplicates != 0 {
			t.Errorf("%s engine: got %d conflicts, %d replays, %d duplicates; want 1, 1, 0", engine, r.Conflicts, r.Replays, r.Duplicates)
		}
	}
}

func TestInProgressIsCounted(t *testing.T) {
	t.Parallel()
	// a's fn runs 20s: the request at 10s finds it running, the one at
	// 20s (as it is recorded) and at 79.999s get the result; at 80s the
	// record, kept a minute from its recording, is gone.
	p := readTrace(t, "a,0,x,20000\na,10000,x\na,20000,x\na,79999\na,80000\n", engineReal)
	for _, engine := range engines {
		opts := quickOptions(time.Minute)
		opts.Engine = engine
		r := simulate(t, p, opts)[0]
		if r.InProgress != 1 || r.Replays != 2 || r.Duplicates != 1 {
			t.Errorf("%s engine: got %d in progress, %d replays, %d duplicates; want 1, 2, 1", engine, r.InProgress, r.Replays, r.Duplicates)
		}
	}
}

func TestPeakBytes(t *testing.T) {
	t.Parallel()
	// Two records alive at once at 1s, one record after a's expiry.
	p := readTrace(t, "a,0\nb,1000\nb,70000\n", engineReal)
	for _, engine := range engines {
		opts := quickOptions(time.Minute)
		opts.ResultSize = 1000
		opts.Engine = engine
		r := simulate(t, p, opts)[0]
		if r.PeakRecords != 2 {
			t.Errorf("%s engine: peak %d records, want 2", engine, r.PeakRecords)
		}
		// Two records of "idem:{a}" and a value of 24 bytes besides the
		// result: "1d", a length byte and no fingerprint, a length byte
		// and a 16-byte owner token, "1:".
		if want := int64(2 * (8 + 22 + 1000)); r.PeakBytes != want {
			t.Errorf("%s engine: peak %d bytes, want %d", engine, r.PeakBytes, want)
		}
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
	p := w.Plan(true)
	if p.Count(traffic.Late) == 0 || p.Span() > 10*time.Minute {
		t.Fatalf("the workload has %d late redeliveries over %s; want some, within 10m", p.Count(traffic.Late), p.Span())
	}
	opts := quickOptions(time.Minute, 24*time.Hour)
	opts.Lease = time.Minute
	opts.Redis, opts.TimeScale, opts.Engine = addr, 60, engineReal
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
