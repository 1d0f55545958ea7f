package main

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkTrace10M runs ttlbench on a generated trace of ten million
// requests, a day of a busy service's traffic (about 9.3 million
// operations at 108 a second, of the default model otherwise: 5% time
// out and are retried, 2% are redelivered late), gzipped, as a user would:
//
//	go test ./cmd/ttlbench -run '^$' -bench Trace10M -benchtime 1x
//
// The trace is written once to $TMPDIR/ttlbench-10M.csv.gz and kept, so
// that the command can be timed on it too:
//
//	/usr/bin/time -v go run ./cmd/ttlbench -trace $TMPDIR/ttlbench-10M.csv.gz
func BenchmarkTrace10M(b *testing.B) {
	path := bigTrace(b, filepath.Join(os.TempDir(), "ttlbench-10M.csv.gz"), 9_335_000)
	benchmarkTrace(b, path)
}

// BenchmarkTrace1M is BenchmarkTrace10M at a tenth of the size.
func BenchmarkTrace1M(b *testing.B) {
	path := bigTrace(b, filepath.Join(os.TempDir(), "ttlbench-1M.csv.gz"), 933_500)
	benchmarkTrace(b, path)
}

func benchmarkTrace(b *testing.B, path string) {
	var requests int
	for b.Loop() {
		var out, errOut strings.Builder
		if code := run(context.Background(), []string{"-trace", path}, strings.NewReader(""), &out, &errOut); code != 0 {
			b.Fatalf("exit code %d: %s", code, errOut.String())
		}
		if _, err := fmt.Sscanf(out.String()[strings.Index(out.String(), "trace: ")+len("trace: "):], "%d requests", &requests); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(requests)*float64(b.N)/b.Elapsed().Seconds(), "requests/s")
}

// bigTrace writes the requests of the default model with ops operations
// to path as a gzipped trace, key,unix_ms,fingerprint, in time order,
// unless the file is there already.
func bigTrace(b *testing.B, path string, ops int) string {
	b.Helper()
	if _, err := os.Stat(path); err == nil {
		return path
	}
	cfg, err := parseFlags([]string{"-ops", strconv.Itoa(ops), "-rate", "108"})
	if err != nil {
		b.Fatal(err)
	}
	p := cfg.work.Plan(false)
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(tmp)
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	w := bufio.NewWriterSize(zw, 1<<20)
	base := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	line := make([]byte, 0, 128)
	for i, at := range p.At {
		line = appendKey(line[:0], p.Op[i])
		line = append(line, ',')
		line = strconv.AppendInt(line, base+at.Milliseconds(), 10)
		line = append(line, ',')
		line = strconv.AppendUint(line, mix(uint64(p.Op[i])^0x5bd1e995), 16)
		line = append(line, '\n')
		if _, err := w.Write(line); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		b.Fatal(err)
	}
	return path
}

// appendKey appends a UUID-shaped key for operation op.
func appendKey(b []byte, op int32) []byte {
	const hexd = "0123456789abcdef"
	x, y := mix(uint64(op)), mix(uint64(op)+1<<40)
	for i := range 32 {
		if i == 8 || i == 12 || i == 16 || i == 20 {
			b = append(b, '-')
		}
		v := x
		if i >= 16 {
			v = y
		}
		b = append(b, hexd[(v>>(4*(i%16)))&15])
	}
	return b
}

// mix is SplitMix64's finaliser: distinct inputs, distinct outputs.
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
