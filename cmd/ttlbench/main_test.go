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
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestBadFlagsNameTheFlag(t *testing.T) {
	t.Parallel()
	trace := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(trace, []byte("a,1\n"), 0o644); err != nil {
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
	for _, want := range []string{"key,unix_ms[,fingerprint]", "-policies", "MEMORY USAGE", "-time-scale"} {
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

func TestJSONLines(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runCmd(t, append([]string{"-json"}, small...)...)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("got %d lines, want one per policy (4):\n%s", len(lines), stdout)
	}
	recommended := 0
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, line)
		}
		for _, f := range []string{"retention", "duplicates", "duplicate_rate", "peak_records", "peak_bytes", "operations", "retries", "recommended"} {
			if _, ok := m[f]; !ok {
				t.Errorf("line %d lacks %q: %s", i+1, f, line)
			}
		}
		if m["recommended"] == true {
			recommended++
		}
	}
	var first jsonResult
	_ = json.Unmarshal([]byte(lines[0]), &first)
	if first.Retention != "1m" || first.Operations != 80 {
		t.Errorf("first line: got retention %q and %d operations, want 1m and 80", first.Retention, first.Operations)
	}
	if recommended != 1 {
		t.Errorf("%d policies recommended, want 1", recommended)
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
	points, recommended := 0, 0
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
	if points != 4 || recommended != 1 {
		t.Errorf("got %d points, %d recommended; want 4 and 1", points, recommended)
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
	if err := os.WriteFile(trace, []byte("a,1\nb,later\n"), 0o644); err != nil {
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
	var got []jsonResult
	for line := range strings.SplitSeq(strings.TrimSpace(stdout), "\n") {
		var r jsonResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	want := []struct {
		dups, records int
		recommended   bool
	}{{2, 3, false}, {1, 3, false}, {0, 3, true}}
	for i, w := range want {
		if got[i].Duplicates != w.dups || got[i].PeakRecords != w.records || got[i].Recommended != w.recommended {
			t.Errorf("%s: got %d duplicates, %d peak records, recommended %v; want %d, %d, %v",
				got[i].Retention, got[i].Duplicates, got[i].PeakRecords, got[i].Recommended, w.dups, w.records, w.recommended)
		}
		if got[i].Operations != 3 || got[i].Retries != 2 {
			t.Errorf("%s: got %d operations, %d retries; want 3, 2", got[i].Retention, got[i].Operations, got[i].Retries)
		}
	}
}
