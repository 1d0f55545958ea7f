package main

import (
	"cmp"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
)

// Duplicates as a function of the retention.
//
// Whether a request runs fn depends on its own key's requests only: it runs
// when its key has no record, that is when it comes at least a retention R
// after the recording of the key's last run (a record recorded at e expires
// at e + R, and is gone for a request at that time). Requests that conflict
// or find fn running change nothing. So a key's duplicates (runs beyond the
// first) are a step function of R, which changes only where R crosses the
// time from some request's recording to a later request of the key; and
// the trace's duplicates, the sum over keys, are found for every R at once
// from the steps of all keys. This gives the smallest retention meeting the
// target exactly, and a bootstrap over keys (resampling keys with their
// steps) gives it an interval, without replaying the trace again.
//
// Fingerprints do not enter: a conflicting request neither runs nor changes
// the record. The fast engine's sweep at each reported retention counts
// the same duplicates (checked at run time, see analysis.check).

// smallKey is the most requests a key may have for its steps to be found
// exactly, by trying each time between two of its requests. A key with
// more (rare: one key is one operation) is evaluated at the points of a
// ladder of retentions 1% (or 1s) apart, which is the search's precision.
const smallKey = 48

// A step says that one key has delta more duplicates at every retention of
// at most c (nanoseconds) than just above c.
type step struct {
	c     int64
	key   int32 // dense index of the key among those with steps
	delta int32
}

// An analysis is what the keys' requests say, whatever the retention.
type analysis struct {
	ops   int           // operations (keys)
	floor time.Duration // the shortest retention considered: the lease
	// steps are sorted by c, longest first; steps with c below floor are
	// left out.
	steps []step
	keys  int // keys with steps
	// approx counts keys evaluated on the ladder rather than exactly.
	approx int
	// gaps holds, for each request after an operation's first, the time
	// from the recording of the operation's first outcome to the request
	// (negative: it came while fn ran), sorted.
	gaps []time.Duration
}

// analyse groups the plan's requests by key and finds each key's steps, on
// all CPUs. exact are retentions at which ladder-evaluated keys must be
// exact too (the policies reported).
func analyse(plan *traffic.Plan, floor time.Duration, exact []time.Duration) *analysis {
	n, ops := plan.Len(), plan.Ops()
	// Group request indexes by operation (a counting sort: time order is
	// kept within each).
	start := make([]int32, ops+1)
	for _, op := range plan.Op {
		start[op+1]++
	}
	for i := range ops {
		start[i+1] += start[i]
	}
	byKey := make([]int32, n)
	{
		pos := slices.Clone(start[:ops])
		for i, op := range plan.Op {
			byKey[pos[op]] = int32(i)
			pos[op]++
		}
	}

	ladder := retentionLadder(floor, plan.Span()+time.Nanosecond, exact)
	workers := runtime.GOMAXPROCS(0)
	type part struct {
		steps  []step
		gaps   []time.Duration
		approx int
	}
	parts := make([]part, workers)
	var wg sync.WaitGroup
	chunk := (ops + workers - 1) / workers
	for w := range workers {
		lo, hi := min(w*chunk, ops), min((w+1)*chunk, ops)
		wg.Go(func() {
			pt := &parts[w]
			var t, e []int64
			var cand []int64
			for op := lo; op < hi; op++ {
				reqs := byKey[start[op]:start[op+1]]
				if len(reqs) < 2 {
					continue
				}
				t, e = t[:0], e[:0]
				for _, i := range reqs {
					t = append(t, int64(plan.At[i]))
					e = append(e, int64(plan.At[i]+plan.Duration(int(i))))
				}
				for j := 1; j < len(t); j++ {
					pt.gaps = append(pt.gaps, time.Duration(t[j]-e[0]))
				}
				before := len(pt.steps)
				if len(t) <= smallKey {
					cand = exactSteps(t, e, int64(floor), cand[:0], &pt.steps, int32(op))
				} else {
					ladderSteps(t, e, ladder, &pt.steps, int32(op))
					pt.approx++
				}
				_ = before
			}
		})
	}
	wg.Wait()
	byKey, start = nil, nil

	a := &analysis{ops: ops, floor: floor}
	for _, pt := range parts {
		a.steps = append(a.steps, pt.steps...)
		a.gaps = append(a.gaps, pt.gaps...)
		a.approx += pt.approx
	}
	// Dense key indexes, in order of operation (parts are in that order).
	last := int32(-1)
	for i := range a.steps {
		if a.steps[i].key != last {
			last = a.steps[i].key
			a.keys++
		}
		a.steps[i].key = int32(a.keys - 1)
	}
	slices.SortFunc(a.steps, func(x, y step) int { return cmp.Compare(y.c, x.c) })
	slices.Sort(a.gaps)
	return a
}

// exactSteps appends the steps of one key, whose requests come at t and
// whose fns would be recorded at e, for retentions from floor up: it
// evaluates the duplicates at every time from a recording to a later
// request, where they may change.
func exactSteps(t, e []int64, floor int64, cand []int64, out *[]step, op int32) []int64 {
	for i := range t {
		for j := i + 1; j < len(t); j++ {
			if c := t[j] - e[i]; c >= floor {
				cand = append(cand, c)
			}
		}
	}
	if len(cand) == 0 {
		return cand
	}
	slices.Sort(cand)
	cand = slices.Compact(cand)
	prev := 0 // duplicates above the longest candidate
	for k := len(cand) - 1; k >= 0; k-- {
		f := duplicatesAt(t, e, cand[k])
		if f != prev {
			*out = append(*out, step{c: cand[k], key: op, delta: int32(f - prev)})
			prev = f
		}
	}
	return cand
}

// ladderSteps appends the steps of one key with many requests, evaluated
// at the ladder's retentions only: between two of them the key counts as
// many duplicates as at the longer.
func ladderSteps(t, e []int64, ladder []time.Duration, out *[]step, op int32) {
	maxC := t[len(t)-1] - e[0]
	hi := sort.Search(len(ladder), func(k int) bool { return int64(ladder[k]) > maxC })
	prev := 0
	for k := min(hi, len(ladder)-1); k >= 0; k-- {
		f := duplicatesAt(t, e, int64(ladder[k]))
		if f != prev {
			*out = append(*out, step{c: int64(ladder[k]), key: op, delta: int32(f - prev)})
			prev = f
		}
	}
}

// duplicatesAt returns the runs of fn beyond the first for one key with
// retention r: a request runs fn when it comes at least r after the
// recording of the last run. It jumps from run to run by binary search.
func duplicatesAt(t, e []int64, r int64) int {
	dups, run := 0, 0
	for {
		from := e[run] + r
		j := run + 1 + sort.Search(len(t)-run-1, func(k int) bool { return t[run+1+k] >= from })
		if j >= len(t) {
			return dups
		}
		dups++
		run = j
	}
}

// retentionLadder returns retentions from floor to top, each max(1s, 1%)
// above the last, with the exact ones added.
func retentionLadder(floor, top time.Duration, exact []time.Duration) []time.Duration {
	var l []time.Duration
	for r := floor; r <= top; r += max(time.Second, r/100) {
		l = append(l, r)
	}
	l = append(l, top)
	l = append(l, exact...)
	slices.Sort(l)
	return slices.Compact(l)
}

// duplicatesAt returns the trace's duplicates with retention r (at least
// the floor).
func (a *analysis) duplicatesAt(r time.Duration) int {
	total := 0
	for _, s := range a.steps {
		if s.c < int64(r) {
			break
		}
		total += int(s.delta)
	}
	return total
}

// smallest returns the shortest retention, in whole milliseconds and at
// least the floor, such that it and every longer one have a duplicate rate
// of at most target.
func (a *analysis) smallest(target float64) time.Duration {
	return a.smallestWeighted(target, nil, float64(a.ops), nil, nil)
}

// smallestWeighted is smallest for a resample of the keys: key k (dense
// index) counts w[k] times, and the operations total ops; with w nil every
// key counts once. It also stores in at[p] the duplicates (weighted) at
// each retention of policies, sorted longest first.
func (a *analysis) smallestWeighted(target float64, w []float64, ops float64, policies []time.Duration, at []float64) time.Duration {
	limit := target * ops
	sum := 0.0
	p := 0
	found := time.Duration(-1)
	for i := 0; i < len(a.steps); {
		c := a.steps[i].c
		for p < len(policies) && int64(policies[p]) > c {
			at[p] = sum
			p++
		}
		for ; i < len(a.steps) && a.steps[i].c == c; i++ {
			d := float64(a.steps[i].delta)
			if w != nil {
				d *= w[a.steps[i].key]
			}
			sum += d
		}
		if found < 0 && sum > limit*(1+1e-12) {
			// Retentions of at most c fail; the shortest above c is the
			// next whole millisecond.
			found = time.Duration(c/int64(time.Millisecond)+1) * time.Millisecond
			if policies == nil {
				break
			}
		}
	}
	for ; p < len(policies); p++ {
		at[p] = sum
	}
	if found < 0 {
		return a.floor
	}
	return max(found, a.floor)
}

// A bootstrap is the spread of the answers over resamples of the keys.
type bootstrap struct {
	resamples int
	// rate holds, by policy, the 2.5th and 97.5th percentiles of the
	// duplicate rate.
	rate [][2]float64
	// retention holds the 2.5th and 97.5th percentiles of the smallest
	// retention meeting the target.
	retention [2]time.Duration
}

// bootstrapKeys resamples the trace's keys (each drawn a Poisson(1) number
// of times, the same as drawing keys with replacement, for large traces)
// and returns the 95% percentile intervals of each policy's duplicate rate
// and of the smallest retention meeting target (rounded as the search's
// answer is, see roundRetention). Only keys with steps are
// drawn one by one; the others only count as operations, drawn in one go.
func (a *analysis) bootstrapKeys(policies []time.Duration, target float64, resamples int, seed uint64) bootstrap {
	desc := slices.Clone(policies)
	slices.SortFunc(desc, func(x, y time.Duration) int { return cmp.Compare(y, x) })
	rates := make([][]float64, len(policies))
	rets := make([]time.Duration, resamples)
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for wk := range workers {
		wg.Go(func() {
			w := make([]float64, a.keys)
			at := make([]float64, len(desc))
			for b := wk; b < resamples; b += workers {
				// A stream per resample: the same answer on any number of
				// CPUs.
				rng := rand.New(rand.NewPCG(seed, uint64(b)+1))
				ops := 0.0
				for k := range w {
					w[k] = float64(poisson1(rng))
					ops += w[k]
				}
				ops += poisson(rng, float64(a.ops-a.keys))
				ops = max(ops, 1)
				r := roundRetention(a.smallestWeighted(target, w, ops, desc, at), a.floor)
				mu.Lock()
				rets[b] = r
				for i, pol := range policies {
					rates[i] = append(rates[i], at[slices.Index(desc, pol)]/ops)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	bs := bootstrap{resamples: resamples, rate: make([][2]float64, len(policies))}
	for i := range policies {
		slices.Sort(rates[i])
		bs.rate[i] = [2]float64{quantile(rates[i], 0.025), quantile(rates[i], 0.975)}
	}
	slices.Sort(rets)
	bs.retention = [2]time.Duration{quantile(rets, 0.025), quantile(rets, 0.975)}
	return bs
}

// quantile returns the q-quantile of sorted values (nearest rank).
func quantile[T any](sorted []T, q float64) T {
	var zero T
	if len(sorted) == 0 {
		return zero
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// poisson1Table is the cumulative distribution of Poisson(1), scaled to
// the range of a uint64.
var poisson1Table = func() []uint64 {
	var t []uint64
	p, sum := math.Exp(-1), 0.0
	for k := 0; k < 20; k++ {
		sum += p
		t = append(t, uint64(min(sum, 1)*math.MaxUint64))
		p /= float64(k + 1)
	}
	return t
}()

// poisson1 draws from Poisson(1), by inversion.
func poisson1(rng *rand.Rand) int {
	u := rng.Uint64()
	for k, c := range poisson1Table {
		if u < c {
			return k
		}
	}
	return len(poisson1Table)
}

// poisson draws from Poisson(lambda): a sum of Poisson(1) draws for small
// lambda, the normal approximation (exact enough at that size) for large.
func poisson(rng *rand.Rand, lambda float64) float64 {
	if lambda <= 0 {
		return 0
	}
	if lambda < 1000 {
		n := 0
		for range int(lambda) {
			n += poisson1(rng)
		}
		return float64(n)
	}
	return math.Max(0, math.Round(lambda+math.Sqrt(lambda)*rng.NormFloat64()))
}

// roundSteps are the steps a searched retention is rounded up to.
var roundSteps = []time.Duration{
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// roundRetention rounds a searched retention up to a round value, at most
// 1% or 1s above it, whichever is more: the search's precision. Rounding
// up keeps the target met: every longer retention meets it too. It is
// never below floor.
func roundRetention(r, floor time.Duration) time.Duration {
	step := roundSteps[0]
	for _, s := range roundSteps {
		if s <= r/100 {
			step = s
		}
	}
	if r%step != 0 {
		r += step - r%step
	}
	return max(r, floor)
}
