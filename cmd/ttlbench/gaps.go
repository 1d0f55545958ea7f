package main

import (
	"sort"
	"time"
)

// Retry gaps: for each request after an operation's first, the time from
// the recording of the operation's outcome to the request. A retention
// shorter than a request's gap has let the record expire by the time the
// request comes (unless a rerun wrote a new one), so the gaps' survival
// curve, the share of later requests whose gap is at least R, bounds the
// duplicates per later request from above, whatever the retention.

// gapQuantiles are the percentiles the report prints.
var gapQuantiles = []float64{0.5, 0.99, 0.999, 0.9999}

// gapStats summarises the gaps.
type gapStats struct {
	N          int             // later requests
	InProgress int             // those that came before the outcome was recorded
	Quantiles  []time.Duration // at gapQuantiles, 0 for a gap before the recording
	Max        time.Duration
}

// summariseGaps returns the percentiles of sorted gaps.
func summariseGaps(sorted []time.Duration) gapStats {
	g := gapStats{N: len(sorted)}
	if g.N == 0 {
		return g
	}
	g.InProgress = sort.Search(len(sorted), func(i int) bool { return sorted[i] >= 0 })
	for _, q := range gapQuantiles {
		g.Quantiles = append(g.Quantiles, max(quantile(sorted, q), 0))
	}
	g.Max = max(sorted[len(sorted)-1], 0)
	return g
}

// survival returns the share of sorted gaps that are at least r.
func survival(sorted []time.Duration, r time.Duration) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := sort.Search(len(sorted), func(i int) bool { return sorted[i] >= r })
	return float64(len(sorted)-i) / float64(len(sorted))
}
