package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// A Report is the outcome of a run: one result per policy and the
// recommendation.
type Report struct {
	// Workload describes the traffic, in one line.
	Workload string
	// Setup describes the records and the store, in one line.
	Setup string
	// Traffic summarises the plan: its span and how many requests of each
	// kind.
	Traffic string
	// Target is the highest acceptable duplicate rate.
	Target float64
	// Results are in ascending order of retention.
	Results []Result
	// Recommended indexes Results: the shortest retention whose duplicate
	// rate is at most Target; -1 when none is.
	Recommended int
	// Arrivals is the time from the first operation's arrival to the
	// last's: a retention longer than that never reaches a steady state.
	Arrivals time.Duration
	// Ops is the number of operations.
	Ops int
}

// NewReport builds the report of a run of plan; results must be in
// ascending order of retention.
func NewReport(plan *Plan, results []Result, opts Options, target float64) *Report {
	r := &Report{
		Workload:    plan.Source,
		Setup:       fmt.Sprintf("results of %s, lease %s, ", formatBytes(int64(opts.ResultSize)), shortDuration(opts.Lease)),
		Target:      target,
		Results:     results,
		Recommended: -1,
		Ops:         len(plan.Keys),
	}
	for _, e := range plan.Events {
		if e.Kind == First {
			r.Arrivals = e.At
		}
	}
	r.Traffic = fmt.Sprintf("%s of traffic: %d operations, %d requests", roughDuration(plan.Span()), len(plan.Keys), len(plan.Events))
	if retries, late := plan.Count(Retry), plan.Count(Late); retries+late > 0 {
		r.Traffic += fmt.Sprintf(" (%d retries", retries)
		if late > 0 {
			r.Traffic += fmt.Sprintf(", %d late redeliveries", late)
		}
		r.Traffic += ")"
	}
	if opts.Redis != "" {
		r.Setup += fmt.Sprintf("Redis at %s, time %s× faster", opts.Redis, strconv.FormatFloat(opts.TimeScale, 'g', -1, 64))
	} else {
		r.Setup += "embedded miniredis on a virtual clock"
	}
	for i, res := range results {
		if res.DuplicateRate() <= target {
			r.Recommended = i
			break
		}
	}
	return r
}

// WriteTable writes the report as an aligned text table.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "workload: %s\n", r.Workload)
	fmt.Fprintf(&b, "simulated %s\n", r.Traffic)
	fmt.Fprintf(&b, "setup: %s\n\n", r.Setup)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "retention\toperations\tretries\treplays\tduplicates\tduplicate rate\tpeak records\tpeak bytes\t")
	conflicts := 0
	for i, res := range r.Results {
		mark := ""
		if i == r.Recommended {
			mark = " *"
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t\n",
			shortDuration(res.Retention), mark, res.Operations, res.Retries, res.Replays,
			res.Duplicates, rate(res.DuplicateRate()), res.PeakRecords, formatBytes(res.PeakBytes))
		conflicts += res.Conflicts
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\n")
	if r.Recommended >= 0 {
		fmt.Fprintf(&b, "recommended: %s (*), the shortest retention with a duplicate rate of at most %s (-target)\n",
			shortDuration(r.Results[r.Recommended].Retention), rate(r.Target))
	} else if n := len(r.Results); n > 0 {
		fmt.Fprintf(&b, "recommended: none: no retention has a duplicate rate of at most %s (-target); the longest, %s, has %s\n",
			rate(r.Target), shortDuration(r.Results[n-1].Retention), rate(r.Results[n-1].DuplicateRate()))
	}
	var long []string
	for _, res := range r.Results {
		if res.Retention > r.Arrivals {
			long = append(long, shortDuration(res.Retention))
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
	if conflicts > 0 {
		b.WriteString("conflicts: some requests reused a key with another fingerprint and got ErrConflict (see -json)\n")
	}
	if len(r.Results) > 0 {
		b.WriteString(bytesNote(r.Results[0].BytesMethod) + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// bytesNote says what "peak bytes" measured.
func bytesNote(method string) string {
	if method == bytesMemoryUsage {
		return "peak bytes: sum of MEMORY USAGE of the live records, each measured after it was written"
	}
	// Measured with Redis 7.0.15: a finished record is one string; with a
	// UUID key, a fingerprint and a 100-byte result, MEMORY USAGE says 264
	// bytes, of which 45 are the key and 138 the value counted here.
	return "peak bytes: key and value bytes of the live records; Redis 7 adds about 80 bytes a finished record: measure with -redis"
}

// jsonResult is one line of -json output.
type jsonResult struct {
	Retention     string  `json:"retention"`
	RetentionMS   int64   `json:"retention_ms"`
	Operations    int     `json:"operations"`
	Requests      int     `json:"requests"`
	Retries       int     `json:"retries"`
	Replays       int     `json:"replays"`
	Conflicts     int     `json:"conflicts"`
	Duplicates    int     `json:"duplicates"`
	DuplicateRate float64 `json:"duplicate_rate"`
	PeakRecords   int     `json:"peak_records"`
	PeakBytes     int64   `json:"peak_bytes"`
	BytesMethod   string  `json:"bytes_method"`
	Recommended   bool    `json:"recommended"`
}

// WriteJSON writes one JSON object per policy, one per line.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	for i, res := range r.Results {
		err := enc.Encode(jsonResult{
			Retention:     shortDuration(res.Retention),
			RetentionMS:   res.Retention.Milliseconds(),
			Operations:    res.Operations,
			Requests:      res.Requests,
			Retries:       res.Retries,
			Replays:       res.Replays,
			Conflicts:     res.Conflicts,
			Duplicates:    res.Duplicates,
			DuplicateRate: res.DuplicateRate(),
			PeakRecords:   res.PeakRecords,
			PeakBytes:     res.PeakBytes,
			BytesMethod:   res.BytesMethod,
			Recommended:   i == r.Recommended,
		})
		if err != nil {
			return err
		}
	}
	return nil
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

// shortDuration formats d without zero units: 1m, 10m, 1h30m, 24h, and
// whole days from 48h up: 7d.
func shortDuration(d time.Duration) string {
	if d >= 48*time.Hour {
		days := d / (24 * time.Hour)
		s := strconv.FormatInt(int64(days), 10) + "d"
		if rest := d - days*24*time.Hour; rest > 0 {
			s += shortDuration(rest)
		}
		return s
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// roughDuration formats a span to a precision a reader wants: minutes from
// an hour up, seconds below.
func roughDuration(d time.Duration) string {
	if d >= time.Hour {
		return shortDuration(d.Round(time.Minute))
	}
	return shortDuration(d.Round(time.Second))
}

// percent formats a share, 0.05 as "5%".
func percent(x float64) string {
	return strconv.FormatFloat(100*x, 'g', 3, 64) + "%"
}

// rate formats a duplicate rate: exactly "0" for none, else a percentage.
func rate(x float64) string {
	if x == 0 {
		return "0"
	}
	return percent(x)
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
