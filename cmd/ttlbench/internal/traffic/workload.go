package traffic

import (
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// Workload is a model of a service's traffic: Poisson arrivals of
// operations, a share of attempts that time out and are retried with
// exponential backoff, and a tail of late redeliveries.
type Workload struct {
	Ops  int     // operations to generate
	Rate float64 // arrivals per second

	// TimeoutShare is the probability that an attempt times out at the
	// client, which then retries (the operation did complete on the
	// server, so a retained record answers the retry).
	TimeoutShare float64
	Retries      int           // retries after the first attempt, at most
	RetryBase    time.Duration // the pause before the first retry
	RetryFactor  float64       // each pause is this many times the last
	RetryJitter  float64       // each pause varies by up to ± this fraction
	RetryCap     time.Duration // no pause (before jitter) is longer

	// LateShare is the share of operations redelivered once, late, after a
	// lognormal delay from the first attempt with the given median and
	// 99th percentile.
	LateShare  float64
	LateMedian time.Duration
	LateP99    time.Duration

	// OpTime is how long fn runs, from the claim to the recording of its
	// outcome; a request that arrives meanwhile finds the operation in
	// progress.
	OpTime time.Duration

	Seed uint64
}

// start is the virtual wall-clock time at which generated traffic begins.
// A fixed instant keeps runs reproducible; its value does not matter.
var start = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// z99 is the 99th percentile of the standard normal distribution.
const z99 = 2.3263478740408408

// MaxDelay bounds a drawn delay, so that a wide lognormal tail cannot
// overflow time.Duration. Nothing is retained that long.
const MaxDelay = 10 * 365 * 24 * time.Hour

// Streams of the random generator: each aspect of the model draws from its
// own, so that changing, say, the late share does not move the arrivals.
const (
	streamArrivals uint64 = iota + 1
	streamRetries
	streamLate
)

// Plan generates the workload's requests, the same for the same Workload.
// The keys themselves (random UUIDs) are kept only when withKeys is set:
// the fast engine needs only their length.
func (w Workload) Plan(withKeys bool) *Plan {
	arrivals := rand.New(rand.NewPCG(w.Seed, streamArrivals))
	retries := rand.New(rand.NewPCG(w.Seed, streamRetries))
	late := rand.New(rand.NewPCG(w.Seed, streamLate))

	n := w.Ops + w.Ops/8
	p := &Plan{
		At:     make([]time.Duration, 0, n),
		Op:     make([]int32, 0, n),
		FP:     make([]uint64, 0, n),
		Kind:   make([]Kind, 0, n),
		KeyLen: make([]uint16, w.Ops),
		Start:  start,
		Source: w.String(),
	}
	if withKeys {
		p.Keys = make([]string, w.Ops)
	}
	add := func(at time.Duration, op int, k Kind) {
		p.At = append(p.At, at)
		p.Op = append(p.Op, int32(op))
		p.FP = append(p.FP, uint64(op)+1) // each operation its own parameters
		p.Kind = append(p.Kind, k)
	}
	var t float64 // seconds since the start
	for i := range w.Ops {
		t += arrivals.ExpFloat64() / w.Rate
		at := seconds(t)
		key := uuid(arrivals)
		p.KeyLen[i] = uint16(len(key))
		if withKeys {
			p.Keys[i] = string(key[:])
		}
		add(at, i, First)

		sent := at
		for n := 1; n <= w.Retries && retries.Float64() < w.TimeoutShare; n++ {
			sent = min(sent+w.retryPause(n, retries), MaxDelay)
			add(sent, i, Retry)
		}
		if late.Float64() < w.LateShare {
			add(min(at+w.lateDelay(late), MaxDelay), i, Late)
		}
	}
	if w.OpTime > 0 {
		p.Dur = make([]time.Duration, len(p.At))
		for i := range p.Dur {
			p.Dur[i] = w.OpTime
		}
	}
	p.SortByTime(false)
	return p
}

// retryPause returns the pause before retry n (from 1), counted from the
// attempt before it: min(cap, base·factor^(n-1)), varied by ±jitter.
func (w Workload) retryPause(n int, rng *rand.Rand) time.Duration {
	d := min(float64(w.RetryBase)*math.Pow(w.RetryFactor, float64(n-1)), float64(w.RetryCap))
	d *= 1 + w.RetryJitter*(2*rng.Float64()-1)
	return time.Duration(min(d, float64(MaxDelay)))
}

// lateDelay draws a redelivery delay from the lognormal distribution with
// the workload's median and 99th percentile.
func (w Workload) lateDelay(rng *rand.Rand) time.Duration {
	sigma := math.Log(float64(w.LateP99)/float64(w.LateMedian)) / z99
	d := float64(w.LateMedian) * math.Exp(sigma*rng.NormFloat64())
	return time.Duration(min(d, float64(MaxDelay)))
}

// String summarises the workload in one line.
func (w Workload) String() string {
	s := fmt.Sprintf("%d ops at %s/s", w.Ops, strconv.FormatFloat(w.Rate, 'g', 4, 64))
	if w.TimeoutShare > 0 && w.Retries > 0 {
		s += fmt.Sprintf(", %s time out (≤%d retries from %s ×%s, cap %s)",
			units.Percent(w.TimeoutShare), w.Retries, units.ShortDuration(w.RetryBase),
			strconv.FormatFloat(w.RetryFactor, 'g', 3, 64), units.ShortDuration(w.RetryCap))
	}
	if w.OpTime > 0 {
		s += fmt.Sprintf(", fn runs %s", units.ShortDuration(w.OpTime))
	}
	if w.LateShare > 0 {
		s += fmt.Sprintf(", %s late (median %s, p99 %s)",
			units.Percent(w.LateShare), units.ShortDuration(w.LateMedian), units.ShortDuration(w.LateP99))
	}
	return s + fmt.Sprintf(", seed %d", w.Seed)
}

// uuid draws a random version 4 UUID: generated keys have the length of
// the keys most services use, so that record sizes are realistic.
func uuid(rng *rand.Rand) [36]byte {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		u := rng.Uint64()
		for j := range 8 {
			b[i+j] = byte(u >> (8 * j))
		}
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return s
}

// seconds converts float seconds to a Duration, rounded to the microsecond
// (the resolution of Redis's TIME).
func seconds(s float64) time.Duration {
	return min(time.Duration(s*1e6)*time.Microsecond, MaxDelay)
}
