package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// small is a quick workload for the command-line tests.
var small = []string{"-ops", "80", "-rate", "0.05", "-timeout-share", "0.2", "-late-share", "0.1",
	"-late-median", "5m", "-late-p99", "30m", "-policies", "1m,10m,1h,24h"}

// runCmd runs the command and returns its exit code and outputs.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCmdStdin(t, "", args...)
}

// runCmdStdin runs the command with stdin and returns its exit code and
// outputs.
func runCmdStdin(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestBadFlagsNameTheFlag(t *testing.T) {
	t.Parallel()
	trace := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(trace, []byte("a,1700000000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-ops", "0"}, "-ops"},
		{[]string{"-ops", "many"}, "-ops"},
		{[]string{"-rate", "-1"}, "-rate"},
		{[]string{"-rate", "NaN"}, "-rate"},
		{[]string{"-timeout-share", "1.5"}, "-timeout-share"},
		{[]string{"-retries", "-1"}, "-retries"},
		{[]string{"-retry-base", "0s"}, "-retry-base"},
		{[]string{"-retry-factor", "0.5"}, "-retry-factor"},
		{[]string{"-retry-jitter", "2"}, "-retry-jitter"},
		{[]string{"-retry-cap", "1ms"}, "-retry-cap"},
		{[]string{"-late-share", "-0.1"}, "-late-share"},
		{[]string{"-late-median", "soon"}, "-late-median"},
		{[]string{"-late-p99", "1m"}, "-late-p99"},
		{[]string{"-policies", "1m,forever"}, "-policies"},
		{[]string{"-policies", "10s"}, "-policies"},
		{[]string{"-policies", "1.5ms"}, "-policies"},
		{[]string{"-lease", "1ms"}, "-lease"},
		{[]string{"-result-size", "-3"}, "-result-size"},
		{[]string{"-target", "2"}, "-target"},
		{[]string{"-time-scale", "10"}, "-time-scale"},
		{[]string{"-redis", "localhost:1", "-time-scale", "0.5"}, "-time-scale"},
		{[]string{"-redis", "localhost:1", "-time-scale", "10000"}, "-time-scale"},
		{[]string{"-redis", "no-port"}, "-redis"},
		{[]string{"-svg", "/no/such/dir/chart.svg"}, "-svg"},
		{[]string{"-trace", trace, "-ops", "10"}, "-ops"},
		{[]string{"-trace", trace, "-seed", "2"}, "-seed"},
		{[]string{"-trace", trace, "-op-time", "1s"}, "-op-time"},
		{[]string{"-time-unit", "s"}, "-time-unit"},
		{[]string{"-columns", "key=k,time=t"}, "-columns"},
		{[]string{"-trace", trace, "-time-unit", "minutes"}, "-time-unit"},
		{[]string{"-trace", trace, "-columns", "key=k"}, "-columns"},
		{[]string{"-trace", trace, "-columns", "key=k,time=t,colour=c"}, "-columns"},
		{[]string{"-engine", "slow"}, "-engine"},
		{[]string{"-redis", "localhost:1", "-engine", "fast"}, "-engine"},
		{[]string{"-engine", "real", "-op-time", "30s"}, "-op-time"},
		{[]string{"-bootstrap", "-1"}, "-bootstrap"},
		{[]string{"-nope"}, "-nope"},
		{[]string{"extra"}, `"extra"`},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != exitUsage {
			t.Errorf("%q: exit code %d, want %d", tc.args, code, exitUsage)
		}
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: error %q does not name %s", tc.args, stderr, tc.want)
		}
		if stdout != "" {
			t.Errorf("%q: wrote to stdout: %q", tc.args, stdout)
		}
	}
}

// TestTimeScaleKeepsTheLeaseSafe checks that -time-scale is refused, with
// the largest safe value, when it leaves the lease under 250ms of real
// time: such runs died mid-way with "lease lost" on a loaded machine.
func TestTimeScaleKeepsTheLeaseSafe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		ok   bool
		max  string
	}{
		{[]string{"-time-scale", "120"}, true, ""}, // 30s / 120 = 250ms
		{[]string{"-time-scale", "121"}, false, "120"},
		{[]string{"-time-scale", "1000"}, false, "120"},
		{[]string{"-lease", "1m", "-time-scale", "240"}, true, ""},
		{[]string{"-lease", "1m", "-time-scale", "600"}, false, "240"},
		{[]string{"-lease", "1s", "-policies", "1m", "-time-scale", "5"}, false, "4"},
		{[]string{"-lease", "1100ms", "-policies", "1m", "-time-scale", "5"}, false, "4.4"},
	} {
		args := append([]string{"-redis", "localhost:1"}, tc.args...)
		_, err := parseFlags(args)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%q refused: %v", args, err)
		case !tc.ok && err == nil:
			t.Errorf("%q accepted; want it refused", args)
		case !tc.ok:
			msg := err.Error()
			if !strings.Contains(msg, "-time-scale") || !strings.Contains(msg, "250ms") ||
				!strings.Contains(msg, "largest safe -time-scale is "+tc.max+",") {
				t.Errorf("%q: error %q does not name -time-scale, the 250ms floor and the largest safe value %s", args, msg, tc.max)
			}
		}
	}
	code, _, stderr := runCmd(t, "-redis", "localhost:1", "-time-scale", "1000")
	if code != exitUsage || !strings.Contains(stderr, "120") {
		t.Errorf("exit code %d, stderr %q; want %d and the largest safe scale, 120", code, stderr, exitUsage)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	code, stdout, _ := runCmd(t, "-h")
	if code != exitOK {
		t.Errorf("exit code %d, want 0", code)
	}
	for _, want := range []string{"key,time[,fingerprint[,duration]]", "-policies", "MEMORY USAGE", "-time-scale", "-columns", "-time-unit", "-engine"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestSameSeedSameTable(t *testing.T) {
	t.Parallel()
	args := append([]string{"-seed", "7"}, small...)
	code1, out1, err1 := runCmd(t, args...)
	code2, out2, _ := runCmd(t, args...)
	if code1 != 0 || code2 != 0 {
		t.Fatalf("exit codes %d, %d: %s", code1, code2, err1)
	}
	if out1 != out2 {
		t.Errorf("same seed, different tables:\n%s\n%s", out1, out2)
	}
	if !strings.Contains(out1, "recommended:") {
		t.Errorf("no recommendation in\n%s", out1)
	}
	_, out3, _ := runCmd(t, append([]string{"-seed", "8"}, small...)...)
	if out3 == out1 {
		t.Errorf("seeds 7 and 8 gave the same table")
	}
}

// readJSON splits -json output into its rows and its summary.
func readJSON(t *testing.T, stdout string) ([]jsonResult, jsonSummary) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	var rows []jsonResult
	var sum jsonSummary
	for i, line := range lines {
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if i == len(lines)-1 {
			if err := dec.Decode(&sum); err != nil {
				t.Fatalf("last line is not the summary: %v: %s", err, line)
			}
			break
		}
		var r jsonResult
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, line)
		}
		rows = append(rows, r)
	}
	return rows, sum
}

func TestJSONLines(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runCmd(t, append([]string{"-json"}, small...)...)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	for i, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, line)
		}
		if _, ok := m["summary"]; ok {
			continue
		}
		for _, f := range []string{"retention", "duplicates", "duplicate_rate", "duplicate_rate_low", "duplicate_rate_high",
			"peak_records", "peak_bytes", "operations", "retries", "in_progress", "conflicts", "grid", "searched", "recommended"} {
			if _, ok := m[f]; !ok {
				t.Errorf("line %d lacks %q: %s", i+1, f, line)
			}
		}
	}
	rows, sum := readJSON(t, stdout)
	grid, recommended := 0, ""
	for i, r := range rows {
		if r.Grid {
			grid++
		}
		if r.Recommended {
			if recommended != "" {
				t.Errorf("both %s and %s recommended", recommended, r.Retention)
			}
			recommended = r.Retention
			if !r.Searched {
				t.Errorf("%s recommended but not the searched retention", r.Retention)
			}
		}
		if i > 0 && r.RetentionMS <= rows[i-1].RetentionMS {
			t.Errorf("rows out of order: %s after %s", r.Retention, rows[i-1].Retention)
		}
		if r.Operations != 80 {
			t.Errorf("%s: %d operations, want 80", r.Retention, r.Operations)
		}
		if *r.RateLow > r.DuplicateRate || *r.RateHigh < r.DuplicateRate {
			t.Errorf("%s: rate %v outside its interval [%v, %v]", r.Retention, r.DuplicateRate, *r.RateLow, *r.RateHigh)
		}
	}
	if grid != 4 {
		t.Errorf("%d grid rows, want the 4 of -policies", grid)
	}
	if recommended == "" || sum.Summary.Recommended != recommended {
		t.Errorf("recommended row %q, summary %q; want the same, set", recommended, sum.Summary.Recommended)
	}
	if lo, hi := sum.Summary.RetentionLowMS, sum.Summary.RetentionHighMS; lo == nil || hi == nil || *lo > *hi {
		t.Errorf("retention interval %v–%v", lo, hi)
	}
	if sum.Summary.Gaps.Count == 0 || sum.Summary.Gaps.MaxMS < sum.Summary.Gaps.P50MS {
		t.Errorf("gaps %+v", sum.Summary.Gaps)
	}
}

func TestSVG(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "chart.svg")
	code, _, stderr := runCmd(t, append([]string{"-svg", path}, small...)...)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	points, recommended, survival, memory := 0, 0, 0, 0
	dec := xml.NewDecoder(bytes.NewReader(data))
	var root string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			for _, a := range se.Attr {
				if a.Name.Local == "class" && a.Value == "survival" {
					survival++
				}
				if a.Name.Local == "class" && a.Value == "memory" {
					memory++
				}
				if se.Name.Local == "circle" && a.Name.Local == "class" {
					points++
					if strings.Contains(a.Value, "recommended") {
						recommended++
					}
				}
			}
		}
	}
	if root != "svg" {
		t.Errorf("root element %q, want svg", root)
	}
	if points < 4 || points > 5 || recommended != 1 {
		t.Errorf("got %d points, %d recommended; want one per retention (4, and the searched one) and 1", points, recommended)
	}
	if survival != 1 || memory != points {
		t.Errorf("got %d survival curves and %d memory points; want 1, and one per retention (%d)", survival, memory, points)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d files, want only the chart (no temporary file left)", len(entries))
	}
}

func TestFailedRunWritesNoChart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.csv")
	if err := os.WriteFile(trace, []byte("a,1700000000000\nb,later\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "chart.svg")
	code, _, stderr := runCmd(t, "-trace", trace, "-svg", path)
	if code != exitUsage {
		t.Errorf("exit code %d, want %d", code, exitUsage)
	}
	if !strings.Contains(stderr, "line 2") {
		t.Errorf("error %q does not name line 2", stderr)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("chart written by a failed run: %v", err)
	}
}

func TestTraceRun(t *testing.T) {
	t.Parallel()
	// Key a is retried after 2 minutes, b after 2 hours, c never.
	trace := filepath.Join(t.TempDir(), "trace.csv")
	data := "# ms since 1970\nkey,unix_ms,fingerprint\n" +
		"a,1700000120000,x\n" + "b,1700007200000\n" + "a,1700000000000,x\n" + "b,1700000000000\n" + "c,1700000000500\n"
	if err := os.WriteFile(trace, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCmd(t, "-trace", trace, "-json", "-policies", "1m,10m,6h")
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	got, sum := readJSON(t, stdout)
	// The smallest retention without duplicates is just over 2h, rounded
	// up to the minute (1% of 2h is 72s).
	want := []struct {
		retention     string
		dups, records int
		recommended   bool
	}{{"1m", 2, 3, false}, {"10m", 1, 3, false}, {"2h1m", 0, 3, true}, {"6h", 0, 3, false}}
	if len(got) != len(want) {
		t.Fatalf("got %d rows, want %d:\n%s", len(got), len(want), stdout)
	}
	for i, w := range want {
		if got[i].Retention != w.retention || got[i].Duplicates != w.dups || got[i].PeakRecords != w.records || got[i].Recommended != w.recommended {
			t.Errorf("row %d: got %s: %d duplicates, %d peak records, recommended %v; want %s: %d, %d, %v", i,
				got[i].Retention, got[i].Duplicates, got[i].PeakRecords, got[i].Recommended, w.retention, w.dups, w.records, w.recommended)
		}
		if got[i].Operations != 3 || got[i].Retries != 2 {
			t.Errorf("%s: got %d operations, %d retries; want 3, 2", got[i].Retention, got[i].Operations, got[i].Retries)
		}
	}
	if g := sum.Summary.Gaps; g.Count != 2 || g.MaxMS != 7200000 || g.P50MS != 120000 {
		t.Errorf("gaps %+v; want 2, the larger 2h, the median 2m", g)
	}
}
