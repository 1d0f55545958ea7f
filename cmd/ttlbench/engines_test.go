package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
	"pgregory.net/rapid"
)

// TestEnginesAgree is the cross-check that keeps the fast engine honest:
// on random traces and retentions, the fast engine and the real library
// (idem.Client.Do on miniredis with a virtual clock) must count exactly
// the same replays, conflicts, requests in progress, duplicates, peak
// records and peak bytes, and the keys' steps (analyse) the same
// duplicates. The traces are drawn to hit the edges: requests exactly at,
// just before and just after a record's expiry, while fn runs, at equal
// times, with conflicting and missing fingerprints, with keys that idem
// escapes, and results shorter than a lease mark.
func TestEnginesAgree(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		plan, policies, opts := drawTrace(t)
		a := analyse(plan, opts.Lease, policies)
		for _, r := range policies {
			fast, err := fastPolicy(context.Background(), plan, r, opts)
			if err != nil {
				t.Fatal(err)
			}
			real, err := realPolicy(context.Background(), plan, r, opts, "test", 0, time.Now())
			if err != nil {
				t.Fatalf("retention %s: real engine: %v", units.ShortDuration(r), err)
			}
			if fast != real {
				t.Fatalf("retention %s:\nfast %+v\nreal %+v\ntrace:\n%s", units.ShortDuration(r), fast, real, describePlan(plan))
			}
			if got := a.duplicatesAt(r); got != fast.Duplicates {
				t.Fatalf("retention %s: the keys' steps give %d duplicates, the engines %d\ntrace:\n%s",
					units.ShortDuration(r), got, fast.Duplicates, describePlan(plan))
			}
			if runs := fast.Operations + fast.Duplicates; fast.Requests != runs+fast.Replays+fast.Conflicts+fast.InProgress {
				t.Fatalf("retention %s: %d requests, but %d runs, %d replays, %d conflicts, %d in progress",
					units.ShortDuration(r), fast.Requests, runs, fast.Replays, fast.Conflicts, fast.InProgress)
			}
		}
	})
}

// drawTrace draws a small trace, two retentions and the options to replay
// it with.
func drawTrace(t *rapid.T) (*traffic.Plan, []time.Duration, options) {
	ms := time.Millisecond
	lease := time.Duration(rapid.IntRange(1, 30).Draw(t, "lease_s")) * time.Second
	var policies []time.Duration
	for range 2 {
		policies = append(policies, lease+time.Duration(rapid.IntRange(0, 90).Draw(t, "extra_s"))*time.Second)
	}
	if policies[0] == policies[1] {
		policies = policies[:1]
	} else if policies[0] > policies[1] {
		policies[0], policies[1] = policies[1], policies[0]
	}
	opts := options{Policies: policies, Lease: lease, ResultSize: rapid.IntRange(0, 300).Draw(t, "result_size"), TimeScale: 1}

	names := []string{"a", "b", "k}x", `back\slash`, "0123456789abcdef0123456789abcdef0123"}
	nkeys := rapid.IntRange(1, len(names)).Draw(t, "keys")
	p := &traffic.Plan{Start: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, k := range names[:nkeys] {
		p.Keys = append(p.Keys, k)
		p.KeyLen = append(p.KeyLen, uint16(traffic.EscapedLen(k)))
	}
	withDur := rapid.Bool().Draw(t, "durations")
	n := rapid.IntRange(1, 24).Draw(t, "requests")
	var now time.Duration
	for i := range n {
		op := int32(rapid.IntRange(0, nkeys-1).Draw(t, "key"))
		// Times: after the last request, or at an edge of an earlier
		// request's record: its expiry for one of the retentions, give or
		// take a millisecond, or while its fn runs, or as it ends.
		at := now + time.Duration(rapid.IntRange(0, 150).Draw(t, "pause_s"))*time.Second
		if i > 0 && rapid.IntRange(0, 2).Draw(t, "edge") > 0 {
			j := rapid.IntRange(0, i-1).Draw(t, "earlier")
			end := p.At[j] + p.Duration(j)
			switch rapid.IntRange(0, 6).Draw(t, "where") {
			case 5:
				at = end // the outcome is recorded at the request's time
			case 6:
				at = end - ms
			case 0:
				at = end + policies[0]
			case 1:
				at = end + policies[len(policies)-1]
			case 2:
				at = end + policies[0] - ms
			case 3:
				at = end + policies[0] + ms
			default:
				at = p.At[j] + p.Duration(j)/2
			}
			at = max(at, 0)
		}
		p.At = append(p.At, at)
		p.Op = append(p.Op, op)
		p.FP = append(p.FP, uint64(rapid.IntRange(0, 2).Draw(t, "fingerprint")))
		if withDur {
			d := time.Duration(0)
			if rapid.Bool().Draw(t, "slow") {
				d = time.Duration(rapid.Int64Range(1, int64(lease/ms)-1).Draw(t, "dur_ms")) * ms
			}
			p.Dur = append(p.Dur, d)
		}
		now = max(now, at)
	}
	p.SortByTime(true)
	// Operations are the keys requested.
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
	return p, policies, opts
}

// describePlan lists a plan's requests, for a failure message.
func describePlan(p *traffic.Plan) string {
	var s string
	for i := range p.Len() {
		s += fmt.Sprintf("  %s key %q fp %d dur %s\n", p.At[i], p.Keys[p.Op[i]], p.FP[i], p.Duration(i))
	}
	return s
}
