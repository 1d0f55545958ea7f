package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
)

func TestReadTrace(t *testing.T) {
	t.Parallel()
	in := `# a comment
key,unix_ms,fingerprint

b,1700000001000,fp-b
a,1700000000000
"a,b",1700000000500,"x"
  a,1700000002000
b,1700000001000,fp-other
`
	p, err := parseTrace(context.Background(), strings.NewReader(in), traceFormat{KeepKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(p.Keys, "|"), "b|a|a,b"; got != want {
		t.Errorf("keys %q, want %q (in order of first appearance in the file)", got, want)
	}
	if !p.Start.Equal(time.UnixMilli(1700000000000)) {
		t.Errorf("start %v, want the earliest request", p.Start)
	}
	type ev struct {
		at   time.Duration
		key  string
		kind traffic.Kind
		fp   bool
	}
	want := []ev{
		{0, "a", traffic.First, false},
		{500 * time.Millisecond, "a,b", traffic.First, true},
		{time.Second, "b", traffic.First, true},
		{time.Second, "b", traffic.Retry, true}, // same time: file order kept
		{2 * time.Second, "a", traffic.Retry, false},
	}
	if p.Len() != len(want) {
		t.Fatalf("got %d requests, want %d", p.Len(), len(want))
	}
	for i, w := range want {
		if got := (ev{p.At[i], p.Keys[p.Op[i]], p.Kind[i], p.FP[i] != 0}); got != w {
			t.Errorf("request %d: got %+v, want %+v", i, got, w)
		}
	}
	if p.FP[2] == p.FP[3] {
		t.Error("fingerprints fp-b and fp-other read as equal")
	}
	if p.Dur != nil {
		t.Error("durations kept for a trace without them")
	}
}

// TestTraceFormats reads the same three requests written in each format a
// trace may come in, and checks that they give the same plan.
func TestTraceFormats(t *testing.T) {
	t.Parallel()
	base := "a,1700000000000,x\nb,1700000000250\na,1700000060000,x\n"
	rfc := "a,2023-11-14T22:13:20Z,x\nb,2023-11-14T22:13:20.25Z\na,2023-11-15T00:15:20+02:01,x\n"
	for _, tc := range []struct {
		name, in string
		f        traceFormat
	}{
		{"unix ms", base, traceFormat{}},
		{"unix s", "a,1700000000,x\nb,1700000000.25\na,1700000060,x\n", traceFormat{TimeUnit: time.Second}},
		{"unix us", "a,1700000000000000,x\nb,1700000000250000\na,1700000060000000,x\n", traceFormat{TimeUnit: time.Microsecond}},
		{"unix ns", "a,1700000000000000000,x\nb,1700000000250000000\na,1700000060000000000,x\n", traceFormat{TimeUnit: time.Nanosecond}},
		{"rfc 3339", rfc, traceFormat{TimeUnit: time.Second}},
		{"crlf", strings.ReplaceAll(base, "\n", "\r\n"), traceFormat{}},
		{"header", "key,unix_ms,fingerprint\n" + base, traceFormat{}},
		{"columns", "region,ts,body_sha,idempotency_key\n" +
			"eu,1700000000000,x,a\neu,1700000000250,,b\nus,1700000060000,x,a\n",
			traceFormat{Columns: map[string]string{"key": "idempotency_key", "time": "ts", "fingerprint": "body_sha"}}},
		{"gzip", gzipped(t, base), traceFormat{}},
	} {
		p, err := parseTrace(context.Background(), strings.NewReader(tc.in), tc.f)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		want := []time.Duration{0, 250 * time.Millisecond, time.Minute}
		if p.Len() != 3 || p.Ops() != 2 {
			t.Errorf("%s: %d requests for %d keys, want 3 for 2", tc.name, p.Len(), p.Ops())
			continue
		}
		for i, w := range want {
			if p.At[i] != w {
				t.Errorf("%s: request %d at %s, want %s", tc.name, i, p.At[i], w)
			}
		}
		if !p.Start.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("%s: start %v", tc.name, p.Start)
		}
		if p.Op[0] != p.Op[2] || p.FP[0] != p.FP[2] || p.FP[0] == 0 || p.FP[1] != 0 {
			t.Errorf("%s: keys %v, fingerprints %v", tc.name, p.Op, p.FP)
		}
	}
}

func TestTraceDurations(t *testing.T) {
	t.Parallel()
	p, err := parseTrace(context.Background(), strings.NewReader("key,time,fp,duration\na,1700000000000,,250\nb,1700000001000,,1.5s\nc,1700000002000\n"), traceFormat{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{250 * time.Millisecond, 1500 * time.Millisecond, 0}; len(p.Dur) != 3 ||
		p.Dur[0] != want[0] || p.Dur[1] != want[1] || p.Dur[2] != want[2] {
		t.Errorf("durations %v, want %v", p.Dur, want)
	}
}

// gzipped returns s compressed, as a string.
func gzipped(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestReadTraceErrorsNameTheLine(t *testing.T) {
	t.Parallel()
	ok := "a,1700000000000\n"
	for _, tc := range []struct {
		in   string
		f    traceFormat
		line int
		want string
	}{
		{ok + "b,x\n", traceFormat{}, 2, "neither a Unix time"},
		{"# c\n\n" + ok + "b\n", traceFormat{}, 4, "fields"},
		{"a,1700000000000,fp,10,extra\n", traceFormat{}, 1, "fields"},
		{ok + ",1700000000000\n", traceFormat{Strict: true}, 2, "no key"},
		{ok + "-,1700000000000\n", traceFormat{Strict: true}, 2, "-strict refuses rows without one"},
		{ok + "b,-5\n", traceFormat{}, 2, "neither"},
		{ok + "b\"c,1700000000000\n", traceFormat{}, 2, "quote"},
		{ok + "\"b,1700000000000\n", traceFormat{}, 2, "quoted field does not end"},
		{ok + strings.Repeat("k", maxKeyLen+1) + ",1700000000000\n", traceFormat{}, 2, "longer"},
		{ok + "b,1900000000000\n" + "c,2050000000000\n", traceFormat{}, 3, "more than 3650d"},
		{ok + "b,1700000000000,,soon\n", traceFormat{}, 2, "duration"},
		{"k,t\n" + ok, traceFormat{Columns: map[string]string{"key": "key", "time": "t"}}, 1, `no column "key"`},
		{"x,y\n" + ok, traceFormat{}, 0, ""}, // a first line "x,y" is data: its time is bad
		// Magnitude: seconds, microseconds, nanoseconds read as ms.
		{ok + "b,1700000000\n", traceFormat{}, 2, "1970-01-20 16:13:20: the numbers look like seconds: use -time-unit s"},
		{ok + "b,1700000000000000\n", traceFormat{}, 2, "year 55840: the numbers look like microseconds: use -time-unit us"},
		{ok + "b,1700000000000000000\n", traceFormat{}, 2, "look like nanoseconds: use -time-unit ns"},
		{"a,1700000000000\n", traceFormat{TimeUnit: time.Second}, 1, "look like milliseconds: use -time-unit ms"},
		{"a,5\n", traceFormat{}, 1, "in no unit"},
		{"a,1970-01-01T00:00:05Z\n", traceFormat{}, 1, "not between 1995 and 2100"},
	} {
		_, err := parseTrace(context.Background(), strings.NewReader(tc.in), tc.f)
		var te *traceError
		if tc.line == 0 {
			if err == nil {
				t.Errorf("%q: accepted", tc.in)
			}
			continue
		}
		if !errors.As(err, &te) {
			t.Errorf("%q: got %v, want a traceError", tc.in, err)
			continue
		}
		if te.Line != tc.line || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %q (line %d), want line %d and %q", tc.in, err, te.Line, tc.line, tc.want)
		}
	}
	if _, err := parseTrace(context.Background(), strings.NewReader("# nothing\n\n"), traceFormat{}); err == nil {
		t.Error("an empty trace was accepted")
	}
}

// TestTraceFromStdinAndGzipFile runs the command on the same trace from a
// gzip file and from stdin, and on a trace in seconds without -time-unit.
func TestTraceFromStdinAndGzipFile(t *testing.T) {
	t.Parallel()
	trace := "a,1700000000000,x\nb,1700000000250\na,1700000600000,x\n"
	path := filepath.Join(t.TempDir(), "trace.csv.gz")
	if err := os.WriteFile(path, []byte(gzipped(t, trace)), 0o644); err != nil {
		t.Fatal(err)
	}
	code1, out1, err1 := runCmd(t, "-trace", path, "-policies", "1m,1h")
	code2, out2, err2 := runCmdStdin(t, trace, "-trace", "-", "-policies", "1m,1h")
	if code1 != 0 || code2 != 0 {
		t.Fatalf("exit codes %d, %d: %s %s", code1, code2, err1, err2)
	}
	if out1 != out2 || !strings.Contains(out1, "trace: 3 requests for 2 keys over 10m") {
		t.Errorf("gzip file and stdin gave\n%s\nand\n%s", out1, out2)
	}

	code, stdout, stderr := runCmdStdin(t, "a,1700000000\nb,1700000001\n", "-trace", "-")
	if code != exitUsage || stdout != "" || !strings.Contains(stderr, "line 1") || !strings.Contains(stderr, "-time-unit s") {
		t.Errorf("a trace in seconds: exit code %d, stderr %q; want %d, naming line 1 and -time-unit s", code, stderr, exitUsage)
	}
}

// An access log's rows without a key are skipped and counted, not fatal;
// -strict refuses them.
func TestKeylessRows(t *testing.T) {
	t.Parallel()
	trace := filepath.Join(t.TempDir(), "log.csv")
	data := "key,unix_ms\n" + "a,1700000000000\n" + ",1700000001000\n" + "a,1700000060000\n" + "-,1700000002000\n" + "  ,1700000003000\n" + "b,1700000004000\n"
	if err := os.WriteFile(trace, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCmd(t, "-trace", trace, "-policies", "1m")
	if code != exitOK {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "skipped: 3 rows without a key (lines 3, 5, 6); -strict refuses a trace with any\n") ||
		!strings.Contains(stdout, "3 requests for 2 operations") {
		t.Errorf("the report does not count the rows without a key:\n%s", stdout)
	}
	code, stdout, stderr = runCmd(t, "-trace", trace, "-policies", "1m", "-json")
	if _, sum := readJSON(t, stdout); code != exitOK || sum.Summary.SkippedKeyless != 3 {
		t.Errorf("-json: exit code %d, skipped_keyless %d, want 3: %s", code, sum.Summary.SkippedKeyless, stderr)
	}
	code, _, stderr = runCmd(t, "-trace", trace, "-strict")
	if code != exitUsage || !strings.Contains(stderr, "line 3: no key") {
		t.Errorf("-strict: exit code %d, want %d naming line 3: %s", code, exitUsage, stderr)
	}
	code, _, stderr = runCmd(t, "-strict")
	if code != exitUsage || !strings.Contains(stderr, "-strict: applies to -trace only") {
		t.Errorf("-strict without -trace: exit code %d: %s", code, stderr)
	}
	only := filepath.Join(t.TempDir(), "keyless.csv")
	if err := os.WriteFile(only, []byte(",1700000000000\n-,1700000001000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCmd(t, "-trace", only)
	if code != exitUsage || !strings.Contains(stderr, "all 2 rows lack a key (lines 1, 2)") {
		t.Errorf("a trace of keyless rows only: exit code %d: %s", code, stderr)
	}
}

// A CSV with a header that does not start with "key" fails at its first
// line; the error suggests -columns, naming the columns it can guess.
func TestHeaderSuggestsColumns(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCmd(t, "-trace", "testdata/checkout.csv")
	if code != exitUsage || !strings.Contains(stderr, "if line 2 is a header (ts,idempotency_key,body_sha,latency_ms,status), "+
		"name the columns to read: -columns key=idempotency_key,time=ts,fingerprint=body_sha,duration=latency_ms") {
		t.Errorf("exit code %d, want %d with a -columns suggestion: %s", code, exitUsage, stderr)
	}
	trace := filepath.Join(t.TempDir(), "odd.csv")
	if err := os.WriteFile(trace, []byte("when,who\n1700000000000,a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCmd(t, "-trace", trace)
	if code != exitUsage || !strings.Contains(stderr, "name the columns to read: -columns key=NAME,time=NAME") {
		t.Errorf("exit code %d, want %d with a generic -columns suggestion: %s", code, exitUsage, stderr)
	}
	// A bad line further down is not the header's fault.
	code, _, stderr = runCmd(t, "-trace", "testdata/checkout.csv", "-columns", "key=idempotency_key,time=latency_ms")
	if code != exitUsage || strings.Contains(stderr, "is a header") {
		t.Errorf("exit code %d; a -columns run got a header hint: %s", code, stderr)
	}
}
