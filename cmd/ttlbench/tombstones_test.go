package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// TestTombstonesAgree holds the fast engine's tombstones to the library's:
// on random traces, idem.Client.Do with WithTombstones on miniredis, its
// clock moved to each request (SetTime and FastForward), must count the
// same runs, replays, conflicts and late retries (ErrLateRetry), and the
// same peaks of records and of tombstones (fields of the buckets). The
// traces are drawn at the edges: a millisecond either side of, and at, a
// record's expiry and a tombstone's end, from plan starts that are not on
// a window's edge.
func TestTombstonesAgree(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		plan, retention, tombstones, opts := drawTombTrace(t)
		fast, err := fastPair(context.Background(), plan, retention, tombstones, opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		lib := libraryPair(t, plan, retention, tombstones, opts)
		got := [...]int{fast.Duplicates, fast.Replays, fast.Conflicts, fast.LateRetries, fast.PeakRecords, fast.PeakTombstones}
		if got != lib {
			t.Fatalf("retention %s, tombstones %s: fast engine (duplicates, replays, conflicts, late, peak records, peak tombstones) %v, library %v\ntrace (start %s):\n%s",
				units.ShortDuration(retention), units.ShortDuration(tombstones), got, lib, plan.Start.Format(time.RFC3339Nano), describePlan(plan))
		}
		if runs := fast.Operations + fast.Duplicates; fast.Requests != runs+fast.Replays+fast.Conflicts+fast.LateRetries {
			t.Fatalf("%d requests, but %d runs, %d replays, %d conflicts, %d late", fast.Requests, runs, fast.Replays, fast.Conflicts, fast.LateRetries)
		}
	})
}

// drawTombTrace draws a small trace of instant fns, a retention and a
// tombstone time.
func drawTombTrace(t *rapid.T) (*traffic.Plan, time.Duration, time.Duration, options) {
	ms := time.Millisecond
	lease := time.Duration(rapid.IntRange(1, 10).Draw(t, "lease_s")) * time.Second
	retention := lease + time.Duration(rapid.IntRange(0, 60).Draw(t, "extra_s"))*time.Second
	tombstones := time.Duration(rapid.IntRange(1, 600_000).Draw(t, "tomb_ms")) * ms
	opts := options{Lease: lease, ResultSize: 16, TimeScale: 1, TombstoneBytes: tombstoneBytes}

	names := []string{"a", "b", "k}x"}
	nkeys := rapid.IntRange(1, len(names)).Draw(t, "keys")
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rapid.IntRange(0, 3_600_000).Draw(t, "start_ms")) * ms)
	p := &traffic.Plan{Start: start}
	for _, k := range names[:nkeys] {
		p.Keys = append(p.Keys, k)
		p.KeyLen = append(p.KeyLen, uint16(traffic.EscapedLen(k)))
	}
	rule := newTombRule(start, retention+tombstones)
	n := rapid.IntRange(1, 16).Draw(t, "requests")
	var now time.Duration
	for i := range n {
		at := now + time.Duration(rapid.IntRange(0, 400).Draw(t, "pause_s"))*time.Second
		if i > 0 && rapid.IntRange(0, 3).Draw(t, "edge") > 0 {
			e := p.At[rapid.IntRange(0, i-1).Draw(t, "earlier")]
			end := time.Duration(rule.end(int64(e)))
			switch rapid.IntRange(0, 5).Draw(t, "where") {
			case 0:
				at = e + retention
			case 1:
				at = e + retention - ms
			case 2:
				at = end
			case 3:
				at = end - ms
			case 4:
				at = end + ms
			default:
				at = e + retention + tombstones
			}
		}
		p.At = append(p.At, at)
		p.Op = append(p.Op, int32(rapid.IntRange(0, nkeys-1).Draw(t, "key")))
		p.FP = append(p.FP, uint64(rapid.IntRange(0, 2).Draw(t, "fingerprint")))
		now = max(now, at)
	}
	p.SortByTime(true)
	used := make([]bool, nkeys)
	for _, op := range p.Op {
		used[op] = true
	}
	remap := make([]int32, nkeys)
	var keys []string
	var lens []uint16
	for k := range nkeys {
		if used[k] {
			remap[k] = int32(len(keys))
			keys = append(keys, p.Keys[k])
			lens = append(lens, p.KeyLen[k])
		}
	}
	for i, op := range p.Op {
		p.Op[i] = remap[op]
	}
	p.Keys, p.KeyLen = keys, lens
	return p, retention, tombstones, opts
}

// libraryPair replays plan through idem.Client.Do with WithTombstones on
// miniredis, moving its clock to each request, and returns the
// duplicates, replays, conflicts, late retries, and the peaks of records
// and of tombstones.
func libraryPair(t *rapid.T, p *traffic.Plan, retention, tombstones time.Duration, opts options) [6]int {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := idem.New(rdb, idem.WithLease(opts.Lease), idem.WithRetention(retention), idem.WithTombstones(tombstones),
		idem.WithWait(0), idem.WithLogger(slog.New(slog.DiscardHandler)))
	defer c.Close()
	ctx := context.Background()
	mr.SetTime(p.Start)
	var now time.Duration
	runs := make([]int, p.Ops())
	var out [6]int
	for i, at := range p.At {
		mr.FastForward(at - now)
		now = at
		mr.SetTime(p.Start.Add(now))
		op := p.Op[i]
		ran := false
		_, err := c.Do(ctx, p.Keys[op], p.Fingerprint(i), func(context.Context) ([]byte, error) {
			runs[op]++
			ran = true
			return make([]byte, opts.ResultSize), nil
		})
		switch {
		case errors.Is(err, idem.ErrConflict):
			out[2]++
		case errors.Is(err, idem.ErrLateRetry):
			out[3]++
		case err != nil:
			t.Fatalf("request %d: %v", i, err)
		case !ran:
			out[1]++
		}
		records, tombs := 0, 0
		for _, k := range mr.Keys() {
			switch {
			case strings.HasPrefix(k, recordPrefix+":{"):
				records++
			case strings.HasPrefix(k, recordPrefix+":t:{") && !strings.HasSuffix(k, ":late") && !strings.HasSuffix(k, ":w"):
				fields, err := mr.HKeys(k)
				if err != nil {
					t.Fatal(err)
				}
				tombs += len(fields)
			}
		}
		out[4], out[5] = max(out[4], records), max(out[5], tombs)
	}
	for _, n := range runs {
		out[0] += max(n-1, 0)
	}
	return out
}
