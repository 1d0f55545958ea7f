package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// The two-tier policy (-tombstones): records kept for a retention R, then
// tombstones (idem.WithTombstones) for T more, which refuse a late retry
// (ErrLateRetry) instead of running fn again.
//
// A request runs fn only when its key has neither record nor tombstone,
// which depends on the span S = R + T alone (and on S's windows, see
// tombstones.go), not on how S is split: so the duplicates of every pair
// with span S are the same, and at most those of retention S without
// tombstones. Of the requests that do not run, those that come at least R
// after the recording of their key's last run find only the tombstone and
// are refused: fewer as R grows. Memory grows with R (records) and with S
// (tombstones). So the cheapest pair meeting -target on duplicates and
// -late-target on late retries has the shortest span meeting -target (the
// searched retention) and, for that span, the shortest R whose late
// retries are within -late-target; both found exactly from one replay at
// R = the lease that keeps each refused request's gap.

// A pairStudy is the two-tier part of a report.
type pairStudy struct {
	// Span is the shortest retention meeting -target (the searched one),
	// which every pair keeps, as retention + tombstones.
	Span time.Duration
	// LateTarget is the highest acceptable rate of late retries refused.
	LateTarget float64
	// TooSmall is set when the traffic has too few operations to show a
	// late-retry rate as low as LateTarget (fewer than 3/LateTarget).
	TooSmall bool
	// Results are the pairs replayed, in ascending order of retention:
	// the grid's retentions shorter than Span, and the recommended one.
	Results []policyResult
	// Recommended indexes Results; -1 when no pair is recommended.
	Recommended int
	// Baseline is Span's replay without tombstones.
	Baseline policyResult
	// TombstoneBytes is what a tombstone counts for in PeakBytes.
	TombstoneBytes int
	// Floor is the shortest retention: the lease.
	Floor time.Duration
}

// studyPairs replays plan with the pairs of span: the grid's retentions
// below it and the shortest whose late retries are within lateTarget, each
// with the tombstones that fill up the span. baseline is span's replay
// without tombstones.
func studyPairs(ctx context.Context, plan *traffic.Plan, opts options, grid []time.Duration, span time.Duration, baseline policyResult, lateTarget float64) (*pairStudy, error) {
	ps := &pairStudy{Span: span, LateTarget: lateTarget, Recommended: -1, Baseline: baseline, TombstoneBytes: opts.TombstoneBytes, Floor: opts.Lease}
	lease := opts.Lease
	if span <= lease {
		return ps, nil // no retention is shorter than the lease
	}
	// One replay at the shortest retention gives every refused request's
	// gap; a retention R refuses those of at least R.
	var gaps []int64
	if _, err := fastPair(ctx, plan, lease, span-lease, opts, &gaps); err != nil {
		return nil, err
	}
	slices.Sort(gaps)
	lateAt := func(r time.Duration) int {
		i, _ := slices.BinarySearch(gaps, int64(r))
		return len(gaps) - i
	}
	ps.TooSmall = lateTarget > 0 && float64(plan.Ops()) < 3/lateTarget
	retentions := []time.Duration{}
	for _, r := range grid {
		if r >= lease && r < span {
			retentions = append(retentions, r)
		}
	}
	best := time.Duration(-1)
	if !ps.TooSmall {
		best = shortestFor(gaps, lateTarget*float64(plan.Ops()), lease, span)
		if best < span && !slices.Contains(retentions, best) {
			retentions = append(retentions, best)
		}
	}
	slices.Sort(retentions)

	results := make([]policyResult, len(retentions))
	errs := make([]error, len(retentions))
	slots := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, r := range retentions {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			results[i], errs[i] = fastPair(ctx, plan, r, span-r, opts, nil)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, res := range results {
		if want := lateAt(res.Retention); res.LateRetries != want || res.Duplicates != results[0].Duplicates {
			return nil, fmt.Errorf("internal error: retention %s with tombstones %s: the replay counts %d late retries and %d duplicates, "+
				"the gaps %d and %d", units.ShortDuration(res.Retention), units.ShortDuration(res.Tombstones), res.LateRetries, res.Duplicates, want, results[0].Duplicates)
		}
		// The span alone is a pair too, without tombstones' memory: the
		// pair must take less.
		if res.Retention == best && res.PeakBytes < baseline.PeakBytes {
			ps.Recommended = i
		}
	}
	ps.Results = results
	return ps, nil
}

// shortestFor returns the shortest retention, at least floor and rounded
// as the search's answers are (roundRetention), that refuses at most limit
// of the requests whose gaps (sorted) are given: the gaps
// of at least the retention are refused. It returns span when only span
// does, where tombstones are of no use.
func shortestFor(gaps []int64, limit float64, floor, span time.Duration) time.Duration {
	k := int(math.Floor(limit * (1 + 1e-12))) // refusals allowed
	if k >= len(gaps) {
		return floor
	}
	// The (k+1)th longest gap must not be refused: the retention must be
	// above it, by a whole millisecond.
	g := gaps[len(gaps)-1-k]
	r := time.Duration(g/int64(time.Millisecond)+1) * time.Millisecond
	return min(roundRetention(max(r, floor), floor), span)
}

// write writes the pairs' table and the recommendation after the report's.
func (ps *pairStudy) write(b *strings.Builder) error {
	fmt.Fprintf(b, "\ntwo tiers (-tombstones): records kept for a retention, then tombstones (idem.WithTombstones) up to %s,\n"+
		"the span that meets -target; a retry that finds only the tombstone is refused (ErrLateRetry, fn not run)\n\n",
		units.ShortDuration(ps.Span))
	if len(ps.Results) > 0 {
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "retention\ttombstones\treplays\tlate retries\tlate rate\tduplicates\tpeak records\tpeak tombstones\tpeak bytes\t")
		row := func(res policyResult, mark string) {
			tomb := "none"
			if res.Tombstones > 0 {
				tomb = units.ShortDuration(res.Tombstones)
			}
			fmt.Fprintf(tw, "%s%s\t%s\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t\n", units.ShortDuration(res.Retention), mark, tomb,
				res.Replays, res.LateRetries, rate(lateRate(res)), res.Duplicates, res.PeakRecords, res.PeakTombstones, formatBytes(res.PeakBytes))
		}
		for i, res := range ps.Results {
			mark := ""
			if i == ps.Recommended {
				mark = " *"
			}
			row(res, mark)
		}
		row(ps.Baseline, "")
		if err := tw.Flush(); err != nil {
			return err
		}
		b.WriteString("\n")
	}
	base := ps.Baseline
	switch {
	case ps.Span <= ps.Floor:
		fmt.Fprintf(b, "recommended pair: none: %s is the lease (-lease), and no retention is shorter\n", units.ShortDuration(ps.Span))
	case ps.TooSmall:
		fmt.Fprintf(b, "recommended pair: none: the traffic is too small to show a late-retry rate as low as %s (-late-target):\n"+
			"  with %d operations, replay at least %d, or raise -late-target\n",
			rate(ps.LateTarget), base.Operations, int(math.Ceil(3/ps.LateTarget)))
	case ps.Recommended < 0 && ps.shortest() < 0:
		fmt.Fprintf(b, "recommended pair: none: only %s itself keeps late retries within %s (-late-target): keep it, without tombstones\n",
			units.ShortDuration(ps.Span), rate(ps.LateTarget))
	case ps.Recommended < 0:
		res := ps.Results[ps.shortest()]
		fmt.Fprintf(b, "recommended pair: none: %s, the shortest retention whose late retries are at most %s (-late-target),\n"+
			"  takes %s at the peak with its tombstones, and %s alone %s: keep %s, without tombstones\n",
			units.ShortDuration(res.Retention), rate(ps.LateTarget), formatBytes(res.PeakBytes), units.ShortDuration(base.Retention), formatBytes(base.PeakBytes), units.ShortDuration(base.Retention))
	default:
		res := ps.Results[ps.Recommended]
		fmt.Fprintf(b, "recommended pair: WithRetention(%s), WithTombstones(%s) (*): the shortest retention whose late retries\n"+
			"  are at most %s of operations (-late-target), with tombstones up to the %s that meets -target:\n",
			units.ShortDuration(res.Retention), units.ShortDuration(res.Tombstones), rate(ps.LateTarget), units.ShortDuration(ps.Span))
		fmt.Fprintf(b, "  peak %s against %s for %s without tombstones", formatBytes(res.PeakBytes), formatBytes(base.PeakBytes), units.ShortDuration(base.Retention))
		if base.PeakBytes > 0 && res.PeakBytes < base.PeakBytes {
			fmt.Fprintf(b, " (%s less)", units.Percent(1-float64(res.PeakBytes)/float64(base.PeakBytes)))
		}
		fmt.Fprintf(b, ";\n  %s refused (%s), %d duplicates (%s)\n", plural(res.LateRetries, "late retry", "late retries"), rate(lateRate(res)), res.Duplicates, rate(res.DuplicateRate()))
	}
	fmt.Fprintf(b, "late retries: requests refused with ErrLateRetry (httpidem answers 410): the operation ran, its result is gone\n"+
		"tombstone bytes: %d each (-tombstone-bytes; measured: %d on one server, %d on a Redis Cluster), added to the records'\n",
		ps.TombstoneBytes, tombstoneBytes, tombstoneBytesCluster)
	return nil
}

// shortest returns the index of the shortest retention that meets
// -late-target among the pairs, or -1.
func (ps *pairStudy) shortest() int {
	if ps.TooSmall {
		return -1
	}
	for i, res := range ps.Results {
		if float64(res.LateRetries) <= ps.LateTarget*float64(res.Operations)*(1+1e-12) {
			return i
		}
	}
	return -1
}

// plural formats n with the singular or plural noun.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// lateRate is late retries per operation.
func lateRate(r policyResult) float64 {
	if r.Operations == 0 {
		return 0
	}
	return float64(r.LateRetries) / float64(r.Operations)
}

// jsonPair is one line of -json output for a pair.
type jsonPair struct {
	Pair struct {
		Retention      string  `json:"retention"`
		RetentionMS    int64   `json:"retention_ms"`
		Tombstones     string  `json:"tombstones"`
		TombstonesMS   int64   `json:"tombstones_ms"`
		Replays        int     `json:"replays"`
		InProgress     int     `json:"in_progress"`
		Conflicts      int     `json:"conflicts"`
		LateRetries    int     `json:"late_retries"`
		LateRate       float64 `json:"late_rate"`
		Duplicates     int     `json:"duplicates"`
		DuplicateRate  float64 `json:"duplicate_rate"`
		PeakRecords    int     `json:"peak_records"`
		PeakTombstones int     `json:"peak_tombstones"`
		PeakBytes      int64   `json:"peak_bytes"`
		Recommended    bool    `json:"recommended"`
	} `json:"pair"`
}

// jsonPairSummary is the summary's part for the pairs.
type jsonPairSummary struct {
	LateTarget      float64 `json:"late_target"`
	SpanMS          int64   `json:"span_ms"`
	TooSmall        bool    `json:"too_small"`
	Retention       string  `json:"retention,omitempty"`
	RetentionMS     int64   `json:"retention_ms,omitempty"`
	Tombstones      string  `json:"tombstones,omitempty"`
	TombstonesMS    int64   `json:"tombstones_ms,omitempty"`
	PeakBytes       int64   `json:"peak_bytes,omitempty"`
	SpanAlonePeak   int64   `json:"span_alone_peak_bytes"`
	TombstoneBytes  int     `json:"tombstone_bytes"`
	RecommendedPair bool    `json:"recommended"`
}

// writeJSON writes one line per pair.
func (ps *pairStudy) writeJSON(enc *json.Encoder) error {
	for i, res := range ps.Results {
		var j jsonPair
		p := &j.Pair
		p.Retention, p.RetentionMS = units.ShortDuration(res.Retention), res.Retention.Milliseconds()
		p.Tombstones, p.TombstonesMS = units.ShortDuration(res.Tombstones), res.Tombstones.Milliseconds()
		p.Replays, p.InProgress, p.Conflicts = res.Replays, res.InProgress, res.Conflicts
		p.LateRetries, p.LateRate = res.LateRetries, lateRate(res)
		p.Duplicates, p.DuplicateRate = res.Duplicates, res.DuplicateRate()
		p.PeakRecords, p.PeakTombstones, p.PeakBytes = res.PeakRecords, res.PeakTombstones, res.PeakBytes
		p.Recommended = i == ps.Recommended
		if err := enc.Encode(j); err != nil {
			return err
		}
	}
	return nil
}

// summary returns the summary's part for the pairs.
func (ps *pairStudy) summary() *jsonPairSummary {
	s := &jsonPairSummary{LateTarget: ps.LateTarget, SpanMS: ps.Span.Milliseconds(), TooSmall: ps.TooSmall,
		SpanAlonePeak: ps.Baseline.PeakBytes, TombstoneBytes: ps.TombstoneBytes}
	if ps.Recommended >= 0 {
		res := ps.Results[ps.Recommended]
		s.RecommendedPair = true
		s.Retention, s.RetentionMS = units.ShortDuration(res.Retention), res.Retention.Milliseconds()
		s.Tombstones, s.TombstonesMS = units.ShortDuration(res.Tombstones), res.Tombstones.Milliseconds()
		s.PeakBytes = res.PeakBytes
	}
	return s
}
