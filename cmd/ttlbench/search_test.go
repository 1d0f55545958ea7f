package main

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
)

// randomPlan draws keys with a few requests each, some with many, some fns
// running for a while, times in whole seconds so that gaps repeat.
func randomPlan(rng *rand.Rand, keys, many int) *traffic.Plan {
	p := &traffic.Plan{}
	for k := range keys {
		n := 1 + rng.IntN(6)
		if k < many {
			n = smallKey + 1 + rng.IntN(100)
		}
		t := time.Duration(rng.IntN(3600)) * time.Second
		for range n {
			p.At = append(p.At, t)
			p.Op = append(p.Op, int32(k))
			p.FP = append(p.FP, uint64(rng.IntN(2)))
			d := time.Duration(0)
			if rng.IntN(4) == 0 {
				d = time.Duration(rng.IntN(120)) * time.Second
			}
			p.Dur = append(p.Dur, d)
			t += time.Duration(rng.ExpFloat64()*600) * time.Second
		}
		p.KeyLen = append(p.KeyLen, 8)
	}
	p.SortByTime(true)
	return p
}

// TestStepsMatchTheReplay checks the keys' steps (analyse) against the
// fast engine's replay at many retentions: at every time between a
// recording and a later request, and a millisecond above it, for keys
// evaluated exactly; at the ladder's retentions and the given ones for
// keys with many requests.
func TestStepsMatchTheReplay(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	lease := 30 * time.Second
	opts := options{Lease: lease, ResultSize: 10}
	for round := range 3 {
		p := randomPlan(rng, 40, 0)
		a := analyse(p, lease, nil)
		if a.approx != 0 {
			t.Fatalf("%d keys evaluated on the ladder", a.approx)
		}
		// Retentions where the answer may change, and beside them.
		var rs []time.Duration
		for _, s := range a.steps {
			rs = append(rs, time.Duration(s.c), time.Duration(s.c)+time.Millisecond)
		}
		rs = append(rs, lease, time.Hour, 100*24*time.Hour)
		slices.Sort(rs)
		rs = slices.Compact(rs)
		for _, r := range rs {
			res, err := fastPolicy(context.Background(), p, r, opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := a.duplicatesAt(r); got != res.Duplicates {
				t.Fatalf("round %d, retention %s: steps give %d duplicates, the replay %d", round, r, got, res.Duplicates)
			}
		}
	}

	// Keys with many requests: exact at the ladder and at the retentions
	// asked for.
	p := randomPlan(rng, 30, 5)
	exact := []time.Duration{lease, 7 * time.Minute, 3*time.Hour + 17*time.Second}
	a := analyse(p, lease, exact)
	if a.approx != 5 {
		t.Fatalf("%d keys evaluated on the ladder, want 5", a.approx)
	}
	ladder := retentionLadder(lease, p.Span()+time.Nanosecond, exact)
	for _, r := range append(ladder[:len(ladder):len(ladder)], exact...) {
		res, err := fastPolicy(context.Background(), p, r, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.duplicatesAt(r); got != res.Duplicates {
			t.Fatalf("ladder, retention %s: steps give %d duplicates, the replay %d", r, got, res.Duplicates)
		}
	}
}

// TestSmallestIsSmallest checks the search: its answer meets the target,
// and so does every longer retention tried; a millisecond less does not
// (unless the answer is the lease, the shortest allowed).
func TestSmallestIsSmallest(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	lease := 30 * time.Second
	p := randomPlan(rng, 300, 0)
	a := analyse(p, lease, nil)
	opts := options{Lease: lease, ResultSize: 10}
	dups := func(r time.Duration) int {
		res, err := fastPolicy(context.Background(), p, r, opts)
		if err != nil {
			t.Fatal(err)
		}
		return res.Duplicates
	}
	for _, target := range []float64{0, 0.001, 0.01, 0.05, 0.2, 1} {
		r := a.smallest(target)
		limit := target * float64(p.Ops())
		if d := dups(r); float64(d) > limit {
			t.Errorf("target %v: %s has %d duplicates, more than %v", target, r, d, limit)
		}
		for _, longer := range []time.Duration{r + time.Millisecond, r + time.Minute, 2 * r, 10 * r} {
			if d := dups(longer); float64(d) > limit {
				t.Errorf("target %v: %s meets it but %s has %d duplicates", target, r, longer, d)
			}
		}
		if r > lease {
			if d := dups(r - time.Millisecond); float64(d) <= limit {
				t.Errorf("target %v: %s is not the smallest: %s has %d duplicates", target, r, r-time.Millisecond, d)
			}
		}
		if rr := roundRetention(r, lease); rr < r || (rr-r > time.Second && float64(rr-r) > 0.01*float64(r)) {
			t.Errorf("%s rounds to %s: more than 1%% or 1s above", r, rr)
		}
	}
}
