package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// TestTombstoneEdges checks a tombstone's life at its edges: a retry 1ms
// before the retention ends is a replay, at its end a late retry; the
// tombstone is found until the end of its bucket's window, and a retry
// then runs fn again. Retention 1m and tombstones 1m: a span of 2m in
// windows of 30s. The trace starts at Unix time 1,700,000,000,000 ms: a
// recording there goes into window floor((1,700,000,000,000 + 120,000) /
// 30,000) = 56,666,670, which ends at 1,700,000,130,000, 130s in.
func TestTombstoneEdges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		trace                    string
		replays, late, runs, con int
	}{
		{"a,0\na,59999\n", 1, 0, 1, 0},
		{"a,0\na,60000\n", 0, 1, 1, 0},
		{"a,0\na,129999\n", 0, 1, 1, 0},
		{"a,0\na,130000\n", 0, 0, 2, 0},
		{"a,0,x\na,90000,y\na,90000,x\na,90000\n", 0, 2, 1, 1},
		// A late retry changes nothing: the tombstone still ends at 130s.
		{"a,0\na,60000\na,129999\na,130000\na,130001\n", 1, 2, 2, 0},
	} {
		p := readTrace(t, tc.trace, engineFast)
		opts := quickOptions(time.Minute)
		opts.TombstoneBytes = tombstoneBytes
		r, err := fastPair(context.Background(), p, time.Minute, time.Minute, opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Replays != tc.replays || r.LateRetries != tc.late || r.Duplicates+1 != tc.runs || r.Conflicts != tc.con {
			t.Errorf("%q: got %d replays, %d late retries, %d runs, %d conflicts; want %d, %d, %d, %d",
				tc.trace, r.Replays, r.LateRetries, r.Duplicates+1, r.Conflicts, tc.replays, tc.late, tc.runs, tc.con)
		}
	}
}

// TestTombstoneBytes checks the peaks: a record and its tombstone live
// together, then the tombstone alone.
func TestTombstoneBytes(t *testing.T) {
	t.Parallel()
	p := readTrace(t, "a,0\nb,61000\n", engineFast)
	opts := quickOptions(time.Minute)
	opts.ResultSize, opts.TombstoneBytes = 1000, 27
	r, err := fastPair(context.Background(), p, time.Minute, time.Hour, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	// At 61s: b's record and the tombstones of a and b.
	if want := int64(8+22+1000) + 2*27; r.PeakRecords != 1 || r.PeakTombstones != 2 || r.PeakBytes != want {
		t.Errorf("peak %d records, %d tombstones, %d bytes; want 1, 2, %d", r.PeakRecords, r.PeakTombstones, r.PeakBytes, want)
	}
}

func TestShortestFor(t *testing.T) {
	t.Parallel()
	s := time.Second
	gaps := []int64{int64(40 * s), int64(50 * s), int64(90 * s), int64(100*s + 500*time.Millisecond)}
	for _, tc := range []struct {
		limit float64
		want  time.Duration
	}{
		{4, 30 * s},    // every refusal allowed: the floor
		{2, 51 * s},    // the two longest refused: above 50s
		{1, 91 * s},    // above 90s
		{0.5, 101 * s}, // none: above the longest, 100.5s, to the next second
		{0, 101 * s},
		{1.9999999, 91 * s}, // a limit below 2 allows 1
	} {
		if got := shortestFor(gaps, tc.limit, 30*s, time.Hour); got != tc.want {
			t.Errorf("limit %v: %s, want %s", tc.limit, got, tc.want)
		}
	}
	if got := shortestFor(gaps, 0, 30*s, 95*s); got != 95*s {
		t.Errorf("capped at the span: %s, want 1m35s", got)
	}
}

// TestPairsAreCheapest checks the pair search on modelled traffic: every
// pair of the span has the same duplicates, at most those of the span
// alone; shorter retentions refuse more late retries and take less
// memory; the recommended retention meets -late-target, and every
// retention clearly shorter (beyond the search's rounding) does not.
func TestPairsAreCheapest(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 3; seed++ {
		w := quick(seed)
		w.Ops = 3000
		p := w.Plan(false)
		opts := quickOptions()
		opts.TombstoneBytes = tombstoneBytes
		a := analyse(p, opts.Lease, nil)
		span := roundRetention(a.smallest(0), opts.Lease)
		base, err := fastPolicy(context.Background(), p, span, opts)
		if err != nil {
			t.Fatal(err)
		}
		const lateTarget = 0.005
		ps, err := studyPairs(context.Background(), p, opts, []time.Duration{time.Minute, 10 * time.Minute}, span, base, lateTarget)
		if err != nil {
			t.Fatal(err)
		}
		if ps.Recommended < 0 {
			t.Fatalf("seed %d: no pair recommended for span %s", seed, units.ShortDuration(span))
		}
		best := ps.Results[ps.Recommended]
		t.Logf("seed %d: span %s, recommended %s + %s: %d late retries, %d duplicates, %d bytes against %d",
			seed, units.ShortDuration(span), units.ShortDuration(best.Retention), units.ShortDuration(best.Tombstones), best.LateRetries, best.Duplicates, best.PeakBytes, base.PeakBytes)
		limit := int(lateTarget * float64(p.Ops()))
		if best.LateRetries > limit {
			t.Errorf("seed %d: the recommended %s refuses %d late retries, over %d", seed, units.ShortDuration(best.Retention), best.LateRetries, limit)
		}
		var prev policyResult
		for k := 0; k <= 40; k++ {
			r := opts.Lease + (span-opts.Lease)*time.Duration(k)/40
			if r == span {
				break
			}
			res, err := fastPair(context.Background(), p, r, span-r, opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Duplicates > base.Duplicates {
				t.Errorf("seed %d: %s with tombstones to %s: %d duplicates, more than %d without", seed, units.ShortDuration(r), units.ShortDuration(span), res.Duplicates, base.Duplicates)
			}
			if k > 0 && (res.Duplicates != prev.Duplicates || res.LateRetries > prev.LateRetries || res.PeakBytes < prev.PeakBytes) {
				t.Errorf("seed %d: %s: %d duplicates, %d late, %d bytes; %s: %d, %d, %d", seed, units.ShortDuration(r), res.Duplicates, res.LateRetries,
					res.PeakBytes, units.ShortDuration(prev.Retention), prev.Duplicates, prev.LateRetries, prev.PeakBytes)
			}
			if r < best.Retention*99/100-time.Second && res.LateRetries <= limit {
				t.Errorf("seed %d: %s refuses %d late retries, within %d, and is shorter than the recommended %s",
					seed, units.ShortDuration(r), res.LateRetries, limit, units.ShortDuration(best.Retention))
			}
			prev = res
		}
	}
}

// TestTombstonesReport runs the command with -tombstones, as text and as
// JSON: the recommended pair is the same, and saves memory.
func TestTombstonesReport(t *testing.T) {
	t.Parallel()
	args := append([]string{"-tombstones", "-late-target", "0.05"}, small...)
	code, text, stderr := runCmd(t, args...)
	if code != exitOK {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	if !strings.Contains(text, "recommended pair: WithRetention(") {
		t.Fatalf("no pair recommended:\n%s", text)
	}
	code, out, stderr := runCmd(t, append([]string{"-json"}, args...)...)
	if code != exitOK {
		t.Fatalf("-json: exit code %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum jsonSummary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatal(err)
	}
	ps := sum.Summary.Pairs
	if ps == nil || !ps.RecommendedPair || ps.PeakBytes >= ps.SpanAlonePeak {
		t.Fatalf("summary %+v: want a recommended pair that takes less memory than the span alone", ps)
	}
	if !strings.Contains(text, "WithRetention("+ps.Retention+"), WithTombstones("+ps.Tombstones+")") {
		t.Errorf("the text recommends another pair than the JSON's %s + %s:\n%s", ps.Retention, ps.Tombstones, text)
	}
	pairs := 0
	for _, l := range lines {
		var j jsonPair
		if strings.HasPrefix(l, `{"pair":`) && json.Unmarshal([]byte(l), &j) == nil {
			pairs++
		}
	}
	if pairs == 0 {
		t.Errorf("-json printed no pair lines:\n%s", out)
	}
}

func TestTombstoneFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-late-target", "0.1"}, "-late-target"},
		{[]string{"-tombstone-bytes", "50"}, "-tombstone-bytes"},
		{[]string{"-tombstones", "-late-target", "2"}, "-late-target"},
		{[]string{"-tombstones", "-tombstone-bytes", "0"}, "-tombstone-bytes"},
		{[]string{"-tombstones", "-engine", "real"}, "-tombstones"},
		{[]string{"-tombstones", "-redis", "localhost:1"}, "-tombstones"},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || stdout != "" {
			t.Errorf("%q: exit code %d, stderr %q; want %d naming %s", tc.args, code, stderr, exitUsage, tc.want)
		}
	}
	// Without a recommended retention there is no span to fill.
	code, out, stderr := runCmd(t, append([]string{"-tombstones", "-target", "0.0001"}, small...)...)
	if code != exitOK || !strings.Contains(out, "two tiers (-tombstones): none") {
		t.Errorf("too small for -target: exit code %d, %s%s", code, out, stderr)
	}
}

// TestRetentionDoc checks that docs/retention.md shows what go run
// ./cmd/ttlbench -tombstones prints today, from its two-tier part on.
func TestRetentionDoc(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runCmd(t, "-tombstones")
	if code != exitOK {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	part := stdout[strings.Index(stdout, "two tiers"):]
	doc, err := os.ReadFile("../../docs/retention.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "$ go run ./cmd/ttlbench -tombstones\n...\n"+part+"```") {
		t.Errorf("docs/retention.md does not show the output of go run ./cmd/ttlbench -tombstones; today's:\n%s", part)
	}
}
