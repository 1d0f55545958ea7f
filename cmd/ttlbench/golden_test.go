package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files, and docs/ttlbench.txt and .svg, from this run")

// checkoutArgs replay testdata/checkout.csv, a checkout service's access
// log: a header naming its columns, RFC 3339 times, latencies, a key reused
// with another body, requests that come while the first still runs, a log
// slightly out of order.
var checkoutArgs = []string{"-trace", "testdata/checkout.csv",
	"-columns", "key=idempotency_key,time=ts,fingerprint=body_sha,duration=latency_ms", "-policies", "1m,10m,1h"}

// redeliveryArgs replay testdata/redeliveries.csv.gz, a queue consumer's
// log, gzipped: key,time in Unix seconds with milliseconds, messages
// redelivered after a 30s visibility timeout, and a dead-letter replay
// hours later.
var redeliveryArgs = []string{"-trace", "testdata/redeliveries.csv.gz", "-time-unit", "s", "-policies", "1m,10m,1h,6h"}

// TestGolden runs the example traces and compares the output with
// testdata/*.golden (go test -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"checkout.txt", checkoutArgs, exitOK},
		{"checkout.json", append([]string{"-json"}, checkoutArgs...), exitOK},
		{"redeliveries.txt", redeliveryArgs, exitOK},
		{"redeliveries-target.txt", append([]string{"-target", "0.01"}, redeliveryArgs...), exitOK},
		{"redeliveries-too-small.txt", append([]string{"-target", "0.001"}, redeliveryArgs...), exitOK},
		// The two-tier policy: records, then tombstones (pairs.go).
		{"checkout-tombstones.txt", append([]string{"-tombstones", "-late-target", "0.05"}, checkoutArgs...), exitOK},
		{"redeliveries-tombstones.txt", append([]string{"-tombstones", "-target", "0.01", "-late-target", "0.01"}, redeliveryArgs...), exitOK},
		{"redeliveries-tombstones.json", append([]string{"-json", "-tombstones", "-target", "0.01", "-late-target", "0.01"}, redeliveryArgs...), exitOK},
		{"default-tombstones.txt", []string{"-tombstones"}, exitOK},
		// The same trace read without -time-unit s: its seconds would be
		// milliseconds of January 1970.
		{"redeliveries-unit.stderr", redeliveryArgs[:2], exitUsage},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != tc.code {
			t.Errorf("%s: exit code %d, want %d: %s", tc.name, code, tc.code, stderr)
			continue
		}
		got := stdout
		if code != exitOK {
			got = stderr
		}
		golden(t, filepath.Join("testdata", tc.name+".golden"), got)
	}
}

// TestEnginesAgreeOnExamples replays the example traces with both engines:
// the reports must be the same but for the line naming the engine.
func TestEnginesAgreeOnExamples(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{checkoutArgs, redeliveryArgs} {
		_, fast, err1 := runCmd(t, args...)
		code, real, err2 := runCmd(t, append([]string{"-engine", "real"}, args...)...)
		if code != exitOK {
			t.Fatalf("%q: exit code %d: %s %s", args, code, err1, err2)
		}
		if a, b := withoutSetup(fast), withoutSetup(real); a != b {
			t.Errorf("%q: the engines disagree:\nfast:\n%s\nreal:\n%s", args, fast, real)
		}
		if fast == real {
			t.Errorf("%q: the reports do not say which engine made them", args)
		}
	}
}

// withoutSetup drops the report's setup line.
func withoutSetup(report string) string {
	var b strings.Builder
	for line := range strings.Lines(report) {
		if !strings.HasPrefix(line, "setup: ") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// TestDocs checks that docs/ttlbench.txt and docs/ttlbench.svg are what
// go run ./cmd/ttlbench -svg docs/ttlbench.svg makes today (TestReadme
// checks that README.md shows that output).
func TestDocs(t *testing.T) {
	t.Parallel()
	svg := filepath.Join(t.TempDir(), "ttlbench.svg")
	code, stdout, stderr := runCmd(t, "-svg", svg)
	if code != exitOK {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	chart, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "../../docs/ttlbench.txt", stdout)
	golden(t, "../../docs/ttlbench.svg", string(chart))
}

// golden compares got with the file at path, or rewrites it with -update.
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from this run (go test -run %s -update rewrites it, then check the diff):\ngot:\n%s", path, t.Name(), got)
	}
}
