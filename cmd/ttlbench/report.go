package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// What a finished record with a UUID key, a fingerprint and a 100-byte
// result takes under idem's default prefix, measured by TestRecordSize
// with Redis 7.0.15 (jemalloc): its key and value bytes, and MEMORY USAGE.
const (
	recordPayload = 181
	recordMemory  = 248
)

// redisOverhead says what Redis adds to a record's key and value bytes.
var redisOverhead = fmt.Sprintf("Redis 7 adds about %d a finished record\n"+
	"  (MEMORY USAGE of one with a UUID key and a 100-byte result: %d bytes, %d of them key and value)",
	recordMemory-recordPayload, recordMemory, recordPayload)

// A report is the outcome of a run: one result per retention replayed
// (the grid's and the searched one), the recommendation, the retry gaps
// and the intervals.
type report struct {
	// Workload describes the traffic, in one line.
	Workload string
	// Setup describes the records and the engine, in one line.
	Setup string
	// Traffic summarises the plan: its span and how many requests of each
	// kind.
	Traffic string
	// Target is the highest acceptable duplicate rate.
	Target float64
	// Results are in ascending order of retention.
	Results []policyResult
	// Grid says which results are -policies' (the others: the searched).
	Grid []bool
	// Searched indexes Results: the shortest retention meeting the target,
	// searched; -1 when the trace is too small to search (TooSmall).
	Searched int
	// TooSmall is set when the trace has too few operations to show a
	// duplicate rate as low as the target: fewer than 3/target.
	TooSmall bool
	// Intervals are, by result, the 95% intervals of the duplicate rate:
	// from the bootstrap when there are duplicates; [0, 3/Ops] (the rule of
	// three) when there are none. Nil without a bootstrap.
	Intervals [][2]float64
	// RetentionInterval is the 95% bootstrap interval of the searched
	// retention; Resamples the number of resamples (0: no bootstrap).
	RetentionInterval [2]time.Duration
	Resamples         int
	// Gaps summarises the retry gaps; Survival samples their survival
	// curve for the chart.
	Gaps     gapStats
	Survival []survivalPoint
	// Approx counts keys with so many requests that their duplicates were
	// found on a ladder of retentions 1% apart rather than exactly.
	Approx int
	// Arrivals is the time from the first operation's arrival to the
	// last's: a retention longer than that never reaches a steady state.
	Arrivals time.Duration
	// Ops is the number of operations.
	Ops int
	// Floor is the shortest retention searched: the lease.
	Floor time.Duration
	// Keyless counts the trace's rows without a key, skipped;
	// KeylessLines holds the first few of their line numbers.
	Keyless      int
	KeylessLines []int
	// TwoTier is set with -tombstones; Pairs is then their study, nil when
	// no retention was searched (see pairs.go).
	TwoTier bool
	Pairs   *pairStudy
	// Ledger is how long to keep ledger rows (ledger.go).
	Ledger ledgerAdvice
}

// survivalPoint is a point of the gaps' survival curve: the share of later
// requests whose gap is at least R.
type survivalPoint struct {
	R     time.Duration
	Share float64
}

// newReport builds the report of a run of plan; results must be in
// ascending order of retention and include the searched one (-1: none).
func newReport(plan *traffic.Plan, a *analysis, results []policyResult, grid []time.Duration, searched time.Duration, bs *bootstrap, cfg *config) *report {
	opts := cfg.opts
	r := &report{
		Workload: plan.Source,
		Setup:    fmt.Sprintf("results of %s, lease %s, ", formatBytes(int64(opts.ResultSize)), units.ShortDuration(opts.Lease)),
		Target:   cfg.target,
		Results:  results,
		Searched: -1,
		TooSmall: searched < 0,
		Gaps:     summariseGaps(a.gaps),
		Approx:   a.approx,
		Arrivals: plan.Arrivals(),
		Ops:      plan.Ops(),
		Floor:    opts.Lease,
		TwoTier:  cfg.tombstones,

		Keyless:      plan.Keyless,
		KeylessLines: plan.KeylessLines,
	}
	later := plan.Len() - plan.Ops()
	r.Traffic = fmt.Sprintf("%s of traffic: %d requests for %d operations", roughDuration(plan.Span()), plan.Len(), plan.Ops())
	if later > 0 {
		r.Traffic += fmt.Sprintf(", %d of them retries", later)
		if late := plan.Count(traffic.Late); late > 0 {
			r.Traffic += fmt.Sprintf(" (%d after a client timeout, %d late redeliveries)", plan.Count(traffic.Retry), late)
		}
	}
	switch {
	case opts.Redis != "":
		r.Setup += fmt.Sprintf("idem on the Redis at %s, time %s× faster", opts.Redis, strconv.FormatFloat(opts.TimeScale, 'g', -1, 64))
	case opts.Engine == engineReal:
		r.Setup += "idem on an embedded miniredis with a virtual clock (-engine real)"
	default:
		r.Setup += "fast engine (idem's rules in Go, held to the library by a test)"
	}
	for i, res := range results {
		r.Grid = append(r.Grid, slices.Contains(grid, res.Retention))
		if res.Retention == searched {
			r.Searched = i
		}
	}
	r.Ledger = adviseLedger(r.Gaps.Max, max(searched, 0), plan.Span())
	if bs != nil {
		r.Resamples = bs.resamples
		r.RetentionInterval = bs.retention
		for i, res := range results {
			iv := bs.rate[i]
			if res.Duplicates == 0 {
				iv = [2]float64{0, 3 / float64(max(r.Ops, 1))}
			}
			r.Intervals = append(r.Intervals, iv)
		}
	}
	// The survival curve, at 200 retentions from the lease to the longest
	// gap, evenly spaced on a log scale.
	if top := r.Gaps.Max; top > opts.Lease {
		lo, hi := math.Log(float64(opts.Lease)), math.Log(float64(top))
		for k := range 201 {
			d := time.Duration(math.Exp(lo + (hi-lo)*float64(k)/200))
			r.Survival = append(r.Survival, survivalPoint{R: d, Share: survival(a.gaps, d)})
		}
	}
	return r
}

// recommended returns the index of the recommended result, or -1.
func (r *report) recommended() int {
	if r.TooSmall {
		return -1
	}
	return r.Searched
}

// interval formats a result's 95% interval.
func (r *report) interval(i int) string {
	if r.Intervals == nil {
		return ""
	}
	iv := r.Intervals[i]
	return rate(iv[0]) + "–" + rate(iv[1])
}

// WriteTable writes the report as an aligned text table.
func (r *report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "workload: %s\n", r.Workload)
	if r.Keyless > 0 {
		fmt.Fprintf(&b, "skipped: %d rows without a key (lines %s); -strict refuses a trace with any\n",
			r.Keyless, lineList(r.KeylessLines, r.Keyless))
	}
	fmt.Fprintf(&b, "replayed %s\n", r.Traffic)
	fmt.Fprintf(&b, "setup: %s\n", r.Setup)
	if line := r.gapLine(); line != "" {
		b.WriteString(line + "\n")
	}
	b.WriteString("\n")

	conflicts, inProgress := false, false
	for _, res := range r.Results {
		conflicts = conflicts || res.Conflicts > 0
		inProgress = inProgress || res.InProgress > 0
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "retention\treplays\t"
	if inProgress {
		head += "in progress\t"
	}
	if conflicts {
		head += "conflicts\t"
	}
	head += "duplicates\tduplicate rate\t"
	if r.Intervals != nil {
		head += "95% interval\t"
	}
	fmt.Fprintln(tw, head+"peak records\tpeak bytes\t")
	for i, res := range r.Results {
		mark := ""
		if i == r.recommended() {
			mark = " *"
		}
		row := fmt.Sprintf("%s%s\t%d\t", units.ShortDuration(res.Retention), mark, res.Replays)
		if inProgress {
			row += fmt.Sprintf("%d\t", res.InProgress)
		}
		if conflicts {
			row += fmt.Sprintf("%d\t", res.Conflicts)
		}
		row += fmt.Sprintf("%d\t%s\t", res.Duplicates, rate(res.DuplicateRate()))
		if r.Intervals != nil {
			row += r.interval(i) + "\t"
		}
		fmt.Fprintln(tw, row+fmt.Sprintf("%d\t%s\t", res.PeakRecords, formatBytes(res.PeakBytes)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\n")
	b.WriteString(r.verdict())
	b.WriteString(r.Ledger.lines())
	var long []string
	for _, res := range r.Results {
		if res.Retention > r.Arrivals {
			long = append(long, units.ShortDuration(res.Retention))
		}
	}
	if len(long) > 0 {
		verb, peaks := "outlast", "their peaks count"
		if len(long) == 1 {
			verb, peaks = "outlasts", "its peak counts"
		}
		fmt.Fprintf(&b, "note: %s %s the %s in which the operations arrive, so %s all %d operations,\n"+
			"  not a steady state (which holds about arrival rate × retention records)\n",
			strings.Join(long, ", "), verb, roughDuration(r.Arrivals), peaks, r.Ops)
	}
	if conflicts {
		b.WriteString("conflicts: requests that reused a key with another fingerprint got ErrConflict\n")
	}
	if inProgress {
		b.WriteString("in progress: requests that came while their operation's fn ran; with WithWait they wait for its outcome\n")
	}
	if r.Approx > 0 {
		fmt.Fprintf(&b, "note: %d keys with more than %d requests each were evaluated at retentions 1%% (or 1s) apart\n", r.Approx, smallKey)
	}
	if len(r.Results) > 0 {
		b.WriteString(bytesNote(r.Results[0].BytesMethod) + "\n")
	}
	switch {
	case r.Pairs != nil:
		if err := r.Pairs.write(&b); err != nil {
			return err
		}
	case r.TwoTier:
		b.WriteString("\ntwo tiers (-tombstones): none: no retention was recommended, so there is no span for tombstones to fill\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// gapLine summarises the retry gaps in one line.
func (r *report) gapLine() string {
	g := r.Gaps
	if g.N == 0 {
		return "retry gaps: none: no key was requested twice"
	}
	var parts []string
	for i, q := range gapQuantiles {
		parts = append(parts, fmt.Sprintf("p%s %s", strconv.FormatFloat(100*q, 'g', -1, 64), roughDuration(g.Quantiles[i])))
	}
	parts = append(parts, "max "+roughDuration(g.Max))
	s := fmt.Sprintf("retry gaps (from an operation's recorded outcome to each of its %d later requests): %s", g.N, strings.Join(parts, ", "))
	if g.InProgress > 0 {
		s += fmt.Sprintf("; %d came while fn ran", g.InProgress)
	}
	return s
}

// verdict is the recommendation, in a few lines.
func (r *report) verdict() string {
	var b strings.Builder
	if r.TooSmall {
		need := int(math.Ceil(3 / r.Target))
		fmt.Fprintf(&b, "recommended: none: the trace is too small to show a duplicate rate as low as %s (-target):\n"+
			"  with %d operations, no duplicate at all is consistent with a rate of up to 3/%d = %s (95%%);\n"+
			"  replay at least %d operations, or raise -target\n",
			rate(r.Target), r.Ops, r.Ops, rate(3/float64(max(r.Ops, 1))), need)
		return b.String()
	}
	i := r.Searched
	if i < 0 {
		return ""
	}
	res := r.Results[i]
	fmt.Fprintf(&b, "recommended: %s (*), the shortest retention with a duplicate rate of at most %s (-target), searched to 1%% or 1s:\n",
		units.ShortDuration(res.Retention), rate(r.Target))
	fmt.Fprintf(&b, "  duplicate rate %s (%d in %d operations), peak %d records, %s", rate(res.DuplicateRate()), res.Duplicates, r.Ops,
		res.PeakRecords, formatBytes(res.PeakBytes))
	var near []string
	for _, j := range r.nearestGrid(i) {
		g := r.Results[j]
		near = append(near, fmt.Sprintf("%s %s (rate %s)", units.ShortDuration(g.Retention), formatBytes(g.PeakBytes), rate(g.DuplicateRate())))
	}
	if len(near) > 0 {
		fmt.Fprintf(&b, "; on the grid, %s", strings.Join(near, " and "))
	}
	b.WriteString("\n")
	if r.Floor > 0 && res.Retention == r.Floor {
		fmt.Fprintf(&b, "  that is the lease (-lease %s): idem takes no shorter retention\n", units.ShortDuration(r.Floor))
	}
	switch {
	case res.Duplicates == 0 && r.Ops <= 3:
		fmt.Fprintf(&b, "  but %d operations are too few to show anything of the rate: no duplicate in N operations shows a rate below 3/N (95%%)\n", r.Ops)
	case res.Duplicates == 0:
		fmt.Fprintf(&b, "  no duplicate in %d operations does not prove a rate of 0: it shows one below 3/%d = %s (95%%)\n",
			r.Ops, r.Ops, rate(3/float64(r.Ops)))
	}
	if r.Resamples > 0 {
		fmt.Fprintf(&b, "  95%% interval of the retention, from %d bootstrap resamples of the keys: %s–%s\n",
			r.Resamples, units.ShortDuration(r.RetentionInterval[0]), units.ShortDuration(r.RetentionInterval[1]))
	}
	if r.Target == 0 && r.Gaps.N > 0 && res.Duplicates == 0 {
		// The smallest round rate that this many operations can show.
		t := 0.00001
		for t < 0.1 && float64(r.Ops) < 3/t {
			t *= 10
		}
		fmt.Fprintf(&b, "  -target 0 (the default) admits no duplicate in this traffic, so its single longest retry gap (%s)\n"+
			"  sets the answer; a target such as -target %s (1 duplicate in %s operations) lets such outliers go\n",
			roughDuration(r.Gaps.Max), strconv.FormatFloat(t, 'f', -1, 64), thousands(int64(math.Round(1/t))))
	}
	return b.String()
}

// thousands formats n with commas between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// nearestGrid returns the grid's results just below and just above result
// i, where there are such.
func (r *report) nearestGrid(i int) []int {
	var out []int
	for j := i - 1; j >= 0; j-- {
		if r.Grid[j] {
			out = append(out, j)
			break
		}
	}
	for j := i + 1; j < len(r.Results); j++ {
		if r.Grid[j] {
			out = append(out, j)
			break
		}
	}
	return out
}

// bytesNote says what "peak bytes" measured.
func bytesNote(method string) string {
	if method == bytesMemoryUsage {
		return "peak bytes: sum of MEMORY USAGE of the live records, each measured after it was written"
	}
	return "peak bytes: key and value bytes of the live records; measure with -redis: " + redisOverhead
}

// jsonResult is one line of -json output for a retention.
type jsonResult struct {
	Retention     string   `json:"retention"`
	RetentionMS   int64    `json:"retention_ms"`
	Operations    int      `json:"operations"`
	Requests      int      `json:"requests"`
	Retries       int      `json:"retries"`
	Replays       int      `json:"replays"`
	InProgress    int      `json:"in_progress"`
	Conflicts     int      `json:"conflicts"`
	Duplicates    int      `json:"duplicates"`
	DuplicateRate float64  `json:"duplicate_rate"`
	RateLow       *float64 `json:"duplicate_rate_low,omitempty"`
	RateHigh      *float64 `json:"duplicate_rate_high,omitempty"`
	PeakRecords   int      `json:"peak_records"`
	PeakBytes     int64    `json:"peak_bytes"`
	BytesMethod   string   `json:"bytes_method"`
	Grid          bool     `json:"grid"`
	Searched      bool     `json:"searched"`
	Recommended   bool     `json:"recommended"`
}

// jsonSummary is the last line of -json output.
type jsonSummary struct {
	Summary struct {
		Target          float64          `json:"target"`
		Operations      int              `json:"operations"`
		TooSmall        bool             `json:"too_small"`
		Recommended     string           `json:"recommended,omitempty"`
		RecommendedMS   int64            `json:"recommended_ms,omitempty"`
		RetentionLowMS  *int64           `json:"retention_low_ms,omitempty"`
		RetentionHighMS *int64           `json:"retention_high_ms,omitempty"`
		Resamples       int              `json:"resamples"`
		Gaps            jsonGaps         `json:"gaps"`
		SkippedKeyless  int              `json:"skipped_keyless"`
		LedgerPrune     string           `json:"ledger_prune"`
		LedgerPruneMS   int64            `json:"ledger_prune_ms"`
		Pairs           *jsonPairSummary `json:"pairs,omitempty"`
	} `json:"summary"`
}

// jsonGaps are the retry gaps, in milliseconds.
type jsonGaps struct {
	Count      int   `json:"count"`
	InProgress int   `json:"in_progress"`
	P50MS      int64 `json:"p50_ms"`
	P99MS      int64 `json:"p99_ms"`
	P999MS     int64 `json:"p99_9_ms"`
	P9999MS    int64 `json:"p99_99_ms"`
	MaxMS      int64 `json:"max_ms"`
}

// WriteJSON writes one JSON object per retention, one per line, then a
// summary object.
func (r *report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	for i, res := range r.Results {
		j := jsonResult{
			Retention:     units.ShortDuration(res.Retention),
			RetentionMS:   res.Retention.Milliseconds(),
			Operations:    res.Operations,
			Requests:      res.Requests,
			Retries:       res.Retries,
			Replays:       res.Replays,
			InProgress:    res.InProgress,
			Conflicts:     res.Conflicts,
			Duplicates:    res.Duplicates,
			DuplicateRate: res.DuplicateRate(),
			PeakRecords:   res.PeakRecords,
			PeakBytes:     res.PeakBytes,
			BytesMethod:   res.BytesMethod,
			Grid:          r.Grid[i],
			Searched:      i == r.Searched,
			Recommended:   i == r.recommended(),
		}
		if r.Intervals != nil {
			j.RateLow, j.RateHigh = &r.Intervals[i][0], &r.Intervals[i][1]
		}
		if err := enc.Encode(j); err != nil {
			return err
		}
	}
	if r.Pairs != nil {
		if err := r.Pairs.writeJSON(enc); err != nil {
			return err
		}
	}
	var s jsonSummary
	m := &s.Summary
	if r.Pairs != nil {
		m.Pairs = r.Pairs.summary()
	}
	m.Target, m.Operations, m.TooSmall, m.Resamples, m.SkippedKeyless = r.Target, r.Ops, r.TooSmall, r.Resamples, r.Keyless
	if i := r.recommended(); i >= 0 {
		m.Recommended = units.ShortDuration(r.Results[i].Retention)
		m.RecommendedMS = r.Results[i].Retention.Milliseconds()
		if r.Resamples > 0 {
			lo, hi := r.RetentionInterval[0].Milliseconds(), r.RetentionInterval[1].Milliseconds()
			m.RetentionLowMS, m.RetentionHighMS = &lo, &hi
		}
	}
	m.LedgerPrune, m.LedgerPruneMS = units.ShortDuration(r.Ledger.Age), r.Ledger.Age.Milliseconds()
	g := r.Gaps
	m.Gaps = jsonGaps{Count: g.N, InProgress: g.InProgress, MaxMS: g.Max.Milliseconds()}
	if len(g.Quantiles) == 4 {
		m.Gaps.P50MS, m.Gaps.P99MS, m.Gaps.P999MS, m.Gaps.P9999MS = g.Quantiles[0].Milliseconds(),
			g.Quantiles[1].Milliseconds(), g.Quantiles[2].Milliseconds(), g.Quantiles[3].Milliseconds()
	}
	return enc.Encode(s)
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory, renamed over path once complete: a failed run leaves no
// half-written file.
func writeFileAtomic(path string, data []byte) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// roughDuration formats a span to a precision a reader wants: minutes from
// an hour up, seconds below.
func roughDuration(d time.Duration) string {
	if d >= time.Hour {
		return units.ShortDuration(d.Round(time.Minute))
	}
	return units.ShortDuration(d.Round(time.Second))
}

// rate formats a duplicate rate: exactly "0" for none, else a percentage.
func rate(x float64) string {
	if x == 0 {
		return "0"
	}
	return units.Percent(x)
}

// formatBytes formats a size with binary units: 512 B, 1.5 KiB, 3.2 MiB.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	f, u := float64(n), 0
	for f >= unit && u < 5 {
		f /= unit
		u++
	}
	prec := 1
	if f >= 100 {
		prec = 0
	}
	return strconv.FormatFloat(f, 'f', prec, 64) + " " + "KMGTP"[u-1:u] + "iB"
}
